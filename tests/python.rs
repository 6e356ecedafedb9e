//! The Python package (python/vramcap): its device indices and its size
//! grammar, held to the C ABI's and the Rust core's.

use std::io::Write;
use std::path::Path;
use std::process::Stdio;

use proptest::prelude::*;
use vramcap_core::limit::parse_limit;

use crate::util::*;

/// A device index is an index the C ABI's `int` holds: a bool is none,
/// and 2**31, 2**32, 2**32+1 and 2**64 name no device (they used to wrap
/// onto devices 0 and 1 through ctypes, or answer EINVAL); the caps of
/// devices 0 and 1 are untouched by them.
#[test]
fn the_python_package_checks_device_indices() {
    let script = r#"
import ctypes, sys
sys.path.insert(0, sys.argv[1])
import vramcap
cu = ctypes.CDLL("libcuda.so.1")
assert cu.cuInit(0) == 0
for d in (0, 1):
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    assert cu.cuDeviceGet(ctypes.byref(dev), d) == 0
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cu.cuCtxSetCurrent(ctx) == 0
calls = [
    lambda: vramcap.set_limit(2**32, "100MiB"),
    lambda: vramcap.set_limit(2**32 + 1, "100MiB"),
    lambda: vramcap.set_limit(True, "100MiB"),
    lambda: vramcap.set_limit(2**31, "100MiB"),
    lambda: vramcap.get_limit(2**64),
    lambda: vramcap.get_limit(False),
    lambda: vramcap.get_limit(-1),
    lambda: vramcap.memory_stats(2**32),
    lambda: vramcap.set_limit(-2, "100MiB"),
    lambda: vramcap.set_limit("0", "100MiB"),
    lambda: vramcap.set_limit(2**31 - 1, "100MiB"),
]
for call in calls:
    try:
        call()
        print("accepted")
    except ValueError as e:
        print("ValueError:", e)
    except Exception as e:
        print(type(e).__name__, e)
with vramcap.limit(1, "256MiB"):
    print(vramcap.get_limit(0), vramcap.get_limit(1))
print(vramcap.get_limit(0), vramcap.get_limit(1))
"#;
    let mut cmd = shimmed(Path::new("python3"));
    cmd.env("VRAMCAP_LIMIT", "1GiB")
        .env("VRAMCAP_STATS", "off")
        .args(["-c", script])
        .arg(root().join("python"));
    run(cmd).expect_lines(&[
        "ValueError: set_limit(4294967296, '100MiB'): no such device in this process (device 4294967296); e.g. set_limit(0, '2GiB'), or -1 for every device",
        "ValueError: set_limit(4294967297, '100MiB'): no such device in this process (device 4294967297); e.g. set_limit(0, '2GiB'), or -1 for every device",
        "ValueError: set_limit(True, '100MiB'): True is not a device index; e.g. set_limit(0, '2GiB'), or -1 for every device",
        "ValueError: set_limit(2147483648, '100MiB'): no such device in this process (device 2147483648); e.g. set_limit(0, '2GiB'), or -1 for every device",
        "ValueError: get_limit(18446744073709551616): no such device in this process (device 18446744073709551616); e.g. set_limit(0, '2GiB')",
        "ValueError: get_limit(False): False is not a device index; e.g. set_limit(0, '2GiB')",
        "ValueError: get_limit(-1): -1 is not a device index; e.g. set_limit(0, '2GiB')",
        "ValueError: memory_stats(4294967296): no such device in this process (device 4294967296); e.g. set_limit(0, '2GiB')",
        "ValueError: set_limit(-2, '100MiB'): -2 is not a device index; e.g. set_limit(0, '2GiB'), or -1 for every device",
        "ValueError: set_limit('0', '100MiB'): '0' is not a device index; e.g. set_limit(0, '2GiB'), or -1 for every device",
        "ValueError: set_limit(2147483647, '100MiB'): no such device in this process (or none used yet)",
        &format!("{GIB} {}", 256 * MIB),
        &format!("{GIB} {GIB}"),
    ]);
}

/// What Rust reads an amount as: bytes, a percentage of `total` (at least
/// one byte, as `vramcap limit` resolves it), or `None` for a refusal.
fn rust_amount(text: &str, total: u64) -> Option<u64> {
    if text.contains([',', '=']) {
        return None;
    }
    let spec = parse_limit(text).ok()?;
    let amount = spec.default?;
    Some(amount.resolve(total).max(1))
}

/// Python's answers for `cases`, one run: an int, or None for ValueError
/// (any other exception fails the test).
fn python_amounts(cases: &[(String, u64)]) -> Vec<Option<u64>> {
    let script = r#"
import json, sys
sys.path.insert(0, sys.argv[1])
import vramcap
out = []
for text, total in json.load(sys.stdin):
    try:
        out.append(vramcap.parse_amount(text, total))
    except ValueError:
        out.append(None)
print(json.dumps(out))
"#;
    let mut cmd = bare(Path::new("python3"));
    cmd.args(["-c", script])
        .arg(root().join("python"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("python3 runs");
    let input = serde_json::to_vec(cases).unwrap();
    child.stdin.take().unwrap().write_all(&input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "python3 failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("a JSON list")
}

/// Text near the grammar: whitespace Rust trims and whitespace it does
/// not (U+001C), digits of other scripts, leading zeros, long fractions,
/// every unit spelling and near misses, percent signs.
fn amount_text() -> impl Strategy<Value = String> {
    let near = "[ \t\u{a0}\u{1c}\u{2000}\u{3000}]{0,2}(0|[1-9][0-9]{0,21}|0[0-9]{1,2}|[0-9\u{663}\u{ff11}]{0,3})(\\.[0-9]{0,6})?[ \t\u{a0}\u{1c}]{0,2}(|b|B|k|K|kb|KiB|kIb|m|MB|mib|g|GiB|gb|t|TiB|tb|p|x|%|%%|iB|\u{212a}|G%)[ \t\u{a0}\u{1c}]{0,2}";
    let loose = "[0-9.%kKmMgGtTbBi \t\u{a0}\u{1c}+-]{0,12}";
    prop_oneof![near, loose]
}

fn total() -> impl Strategy<Value = u64> {
    // Never 0: Python takes a total of 0 as unknown and refuses a
    // percentage of it, as it does one of None.
    prop_oneof![Just(80 << 30), 1..4096u64, 1..=u64::MAX]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Python's `parse_amount` accepts exactly what the Rust core accepts,
    /// with the same bytes (it used to take `0.00001%`, more decimals than
    /// Rust allows, and to work percentages out in floating point).
    #[test]
    fn python_reads_amounts_exactly_as_rust(cases in prop::collection::vec((amount_text(), total()), 500)) {
        let got = python_amounts(&cases);
        prop_assert_eq!(got.len(), cases.len());
        for ((text, total), py) in cases.iter().zip(got) {
            prop_assert_eq!(py, rust_amount(text, *total), "{:?} of {}", text, total);
        }
    }
}

/// The cases the issue found, and edges of the grammar, by name.
#[test]
fn python_and_rust_agree_on_the_known_edges() {
    let texts = [
        "0.00001%",
        "0.0001%",
        "100%",
        "100.0001%",
        "50 %",
        "12.5%",
        "05%",
        "1.5GiB",
        "0.1K",
        "0.0001K",
        "16777215T",
        "16777216T",
        "18446744073709551615",
        "18446744073709551616",
        "\u{663}G",
        "\u{212a}B",
        "8\u{a0}GiB",
        "\u{1c}8GiB",
        "",
        "%",
    ];
    let cases: Vec<(String, u64)> = texts.iter().map(|t| (t.to_string(), 80 << 30)).collect();
    let got = python_amounts(&cases);
    for ((text, total), py) in cases.iter().zip(got) {
        assert_eq!(py, rust_amount(text, *total), "{text:?}");
    }
}
