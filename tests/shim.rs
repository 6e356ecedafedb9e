//! The cap, end to end: the shim in front of the stand-in driver
//! (tests/standin), reached by test clients the ways real programs reach
//! the driver. Every case is a fresh process; stdout is asserted line by line.

use crate::util::*;

const METHODS: [&str; 4] = ["linked", "dlsym", "procaddr", "procaddr-legacy"];

/// With a 1 GiB cap, 256 MiB chunks stop at exactly 4, whatever way the
/// program reaches the driver; the stand-in never held more; all comes back.
#[test]
fn cap_holds_on_every_way_to_the_driver() {
    for method in METHODS {
        client(
            method,
            &[("VRAMCAP_LIMIT", "1GiB"), ("VRAMCAP_CACHE", "off")],
            &["init", "fill", "256M", "info", "freeall", "info", "standin"],
        )
        .expect_lines(&[
            "init -> 0",
            "fill 268435456 -> 4 allocs 1073741824 bytes rc=2",
            "info -> 0 free=0 total=1073741824",
            "freeall -> 4 freed rc=0",
            "info -> 0 free=1073741824 total=1073741824",
            "standin dev=0 used=0 peak=1073741824",
            "standin dev=1 used=0 peak=0",
        ]);
    }
    // With the default cache (a quarter of the cap), one freed 256 MiB block
    // stays with the process, and is reported as free to it.
    capped(
        "procaddr",
        "1GiB",
        &[
            "init", "fill", "256M", "freeall", "info", "standin", "fill", "256M",
        ],
    )
    .expect_lines(&[
        "init -> 0",
        "fill 268435456 -> 4 allocs 1073741824 bytes rc=2",
        "freeall -> 4 freed rc=0",
        "info -> 0 free=1073741824 total=1073741824",
        "standin dev=0 used=268435456 peak=1073741824",
        "standin dev=1 used=0 peak=0",
        "fill 268435456 -> 4 allocs 1073741824 bytes rc=2",
    ]);
}

/// The same program without the shim fills the whole 16 GiB stand-in: the
/// assertions above can fail.
#[test]
fn without_the_shim_the_device_fills() {
    client_bare("procaddr", &[], &["init", "fill", "1G", "info", "freeall"]).expect_lines(&[
        "init -> 0",
        "fill 1073741824 -> 16 allocs 17179869184 bytes rc=2",
        "info -> 0 free=0 total=17179869184",
        "freeall -> 16 freed rc=0",
    ]);
}

#[test]
fn unset_limit_only_counts() {
    client(
        "procaddr",
        &[],
        &["init", "fill", "1G", "info", "freeall", "total", "0"],
    )
    .expect_lines(&[
        "init -> 0",
        "fill 1073741824 -> 16 allocs 17179869184 bytes rc=2",
        "info -> 0 free=0 total=17179869184",
        "freeall -> 16 freed rc=0",
        "total 0 -> 0 bytes=17179869184",
    ]);
}

/// The switch passes every call through, and says so at the default log
/// level whenever a cap is asked for (`' 1 '` too): never uncapped silently.
#[test]
fn disable_switch_passes_everything_through() {
    for on in ["1", " 1 "] {
        let ran = client(
            "dlsym",
            &[("VRAMCAP_LIMIT", "1GiB"), ("VRAMCAP_DISABLE", on)],
            &["init", "fill", "4G", "info"],
        );
        ran.expect_lines(&[
            "init -> 0",
            "fill 4294967296 -> 4 allocs 17179869184 bytes rc=2",
            "info -> 0 free=0 total=17179869184",
        ]);
        let err = ran.stderr();
        let line = err.split_once("]: ").map_or(err.as_str(), |(_, l)| l);
        assert!(err.starts_with("vramcap["), "{err}");
        assert_eq!(
            line,
            "VRAMCAP_DISABLE=1 turns vramcap off in this process: VRAMCAP_LIMIT=\"1GiB\" is not enforced and it runs uncapped; unset VRAMCAP_DISABLE to cap it (e.g. env -u VRAMCAP_DISABLE python train.py)\n"
        );
    }
    // With a group only, too; with neither, the switch is all there is.
    let ran = client(
        "dlsym",
        &[("VRAMCAP_GROUP", "g"), ("VRAMCAP_DISABLE", "1")],
        &["init"],
    );
    assert!(
        ran.stderr()
            .contains("VRAMCAP_GROUP=\"g\" is not enforced and it runs uncapped"),
        "{}",
        ran.stderr()
    );
    let ran = client("dlsym", &[("VRAMCAP_DISABLE", "1")], &["init"]);
    assert_eq!(ran.stderr(), "");
}

#[test]
fn partial_room_and_memory_info() {
    let cap = 1000 * MIB;
    capped(
        "procaddr",
        "1000MiB",
        &[
            "init", "info", "fill", "256M", "info", "free", "0", "info", "total", "0", "total", "1",
        ],
    )
    .expect_lines(&[
        "init -> 0",
        &format!("info -> 0 free={cap} total={cap}"),
        "fill 268435456 -> 3 allocs 805306368 bytes rc=2",
        &format!("info -> 0 free={} total={cap}", cap - 768 * MIB),
        "free #0 -> 0",
        &format!("info -> 0 free={} total={cap}", cap - 512 * MIB),
        &format!("total 0 -> 0 bytes={cap}"),
        &format!("total 1 -> 0 bytes={cap}"),
    ]);
}

/// A cap above the device: total is the device's, free the driver's.
#[test]
fn cap_larger_than_the_device_reports_the_device() {
    let total = 16 * GIB;
    capped(
        "linked",
        "32GiB",
        &["init", "alloc", "1G", "info", "total", "0"],
    )
    .expect_lines(&[
        "init -> 0",
        "alloc 1073741824 -> 0 #0",
        &format!("info -> 0 free={} total={total}", total - GIB),
        &format!("total 0 -> 0 bytes={total}"),
    ]);
}

#[test]
fn pitch_counts_pitch_times_height() {
    // 1000-byte rows get a 1024-byte pitch: 256 rows hold 256 KiB.
    client(
        "procaddr",
        &[("VRAMCAP_LIMIT", "1MiB"), ("VRAMCAP_CACHE", "off")],
        &[
            "init", "pitch", "1000", "256", "4", "info", "pitch", "1000", "1024", "4", "pitch",
            "1000", "768", "4", "info", "freeall", "standin",
        ],
    )
    .expect_lines(&[
        "init -> 0",
        "pitch 1000 256 4 -> 0 pitch=1024 #0",
        &format!("info -> 0 free={} total={}", MIB - 256 * 1024, MIB),
        "pitch 1000 1024 4 -> 2",
        "pitch 1000 768 4 -> 0 pitch=1024 #1",
        &format!("info -> 0 free=0 total={MIB}"),
        "freeall -> 2 freed rc=0",
        &format!("standin dev=0 used=0 peak={MIB}"),
        "standin dev=1 used=0 peak=0",
    ]);
}

#[test]
fn managed_memory_counts_against_the_current_device() {
    capped(
        "linked",
        "1GiB",
        &[
            "init", "managed", "768M", "alloc", "512M", "alloc", "256M", "info", "freeall", "info",
        ],
    )
    .expect_lines(&[
        "init -> 0",
        "managed 805306368 -> 0 #0",
        "alloc 536870912 -> 2",
        "alloc 268435456 -> 0 #1",
        &format!("info -> 0 free=0 total={GIB}"),
        "freeall -> 2 freed rc=0",
        &format!("info -> 0 free={GIB} total={GIB}"),
    ]);
}

#[test]
fn percent_of_each_device() {
    capped("dlsym", "25%", &["init", "fill", "1G", "info"]).expect_lines(&[
        "init -> 0",
        "fill 1073741824 -> 4 allocs 4294967296 bytes rc=2",
        &format!("info -> 0 free=0 total={}", 4 * GIB),
    ]);
    client("dlsym", &[("VRAMCAP_LIMIT", "12.5%")], &["init", "info"]).expect_lines(&[
        "init -> 0",
        &format!("info -> 0 free={0} total={0}", 2 * GIB),
    ]);
}

#[test]
fn per_device_caps_by_index_and_uuid() {
    let expect = |limit: &str, dev0: u64, dev1: u64| {
        client(
            "procaddr",
            &[("VRAMCAP_LIMIT", limit)],
            &[
                "init", "fill", "512M", "ctx", "1", "fill", "512M", "standin",
            ],
        )
        .expect_lines(&[
            "init -> 0",
            &format!(
                "fill 536870912 -> {} allocs {} bytes rc=2",
                dev0 / (512 * MIB),
                dev0
            ),
            "ctx 1 -> 0",
            &format!(
                "fill 536870912 -> {} allocs {} bytes rc=2",
                dev1 / (512 * MIB),
                dev1
            ),
            &format!("standin dev=0 used={dev0} peak={dev0}"),
            &format!("standin dev=1 used={dev1} peak={dev1}"),
        ]);
    };
    expect("0=1GiB,1=2GiB", GIB, 2 * GIB);
    expect("2GiB,1=1GiB", 2 * GIB, GIB);
    expect("1=1GiB", 16 * GIB, GIB);
    expect(
        "3GiB,GPU-5ca1ab1e-0000-4000-8000-000000000001=1GiB",
        3 * GIB,
        GIB,
    );
    expect("GPU-5CA1AB1E=1GiB", GIB, GIB);
    // A UUID entry beats the index entry for the same device.
    expect(
        "0=2GiB,gpu-5ca1ab1e-0000-4000-8000-000000000000=1GiB",
        GIB,
        16 * GIB,
    );
}

/// Frees are charged to the device the memory came from, even when another
/// device's context is current at the time.
#[test]
fn free_returns_bytes_to_the_allocating_device() {
    capped(
        "linked",
        "1GiB",
        &[
            "init", "alloc", "1G", "ctx", "1", "free", "0", "ctx", "0", "info", "alloc", "1G",
        ],
    )
    .expect_lines(&[
        "init -> 0",
        "alloc 1073741824 -> 0 #0",
        "ctx 1 -> 0",
        "free #0 -> 0",
        "ctx 0 -> 0",
        &format!("info -> 0 free={GIB} total={GIB}"),
        "alloc 1073741824 -> 0 #1",
    ]);
}

/// Calls the shim has no business with get the driver's own answer.
#[test]
fn driver_errors_pass_through_unchanged() {
    let args = [
        "init", "noctx", "alloc", "1M", "info", "ctx", "0", "freeraw", "0x1234", "alloc", "0",
        "freeraw", "0x0",
    ];
    let bare = client_bare("procaddr", &[], &args).ok_lines();
    assert_eq!(
        bare,
        [
            "init -> 0",
            "noctx -> 0",
            "alloc 1048576 -> 201",
            "info -> 201 free=0 total=0",
            "ctx 0 -> 0",
            "freeraw 0x1234 -> 1",
            "alloc 0 -> 1",
            "freeraw 0x0 -> 0"
        ]
    );
    client("procaddr", &[("VRAMCAP_LIMIT", "1GiB")], &args)
        .expect_lines(&bare.iter().map(String::as_str).collect::<Vec<_>>());
}

#[test]
fn bad_settings_stop_the_process_before_main() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "VRAMCAP_LIMIT",
            "8XB",
            "VRAMCAP_LIMIT=\"8XB\" is not a valid limit: unknown unit \"XB\"",
        ),
        (
            "VRAMCAP_LIMIT",
            "",
            "VRAMCAP_LIMIT=\"\" is not a valid limit: the value is empty",
        ),
        (
            "VRAMCAP_LIMIT",
            "-1G",
            "VRAMCAP_LIMIT=\"-1G\" is not a valid limit: \"-1G\" does not start with a decimal number",
        ),
        (
            "VRAMCAP_LIMIT",
            "0",
            "VRAMCAP_LIMIT=\"0\" is not a valid limit: the size must be greater than zero",
        ),
        (
            "VRAMCAP_LIMIT",
            "0=1G,0=2G",
            "VRAMCAP_LIMIT=\"0=1G,0=2G\" is not a valid limit: device 0 is given more than once",
        ),
        (
            "VRAMCAP_LIMIT",
            "150%",
            "VRAMCAP_LIMIT=\"150%\" is not a valid limit: \"150%\" is out of range",
        ),
        (
            "VRAMCAP_LOG",
            "loud",
            "VRAMCAP_LOG=\"loud\" is not valid: expected one of error, warn, info, debug",
        ),
        (
            "VRAMCAP_DISABLE",
            "yes",
            "VRAMCAP_DISABLE=\"yes\" is not valid",
        ),
    ];
    for (var, value, message) in cases {
        let ran = client("procaddr", &[(var, value)], &["init"]);
        ran.expect_code(2);
        assert_eq!(ran.stdout(), "", "main must not run");
        let err = ran.stderr();
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        let line = err.lines().next().unwrap();
        assert!(line.starts_with("vramcap["), "{line}");
        let text = line.split_once("]: ").unwrap().1;
        assert!(
            text.starts_with(message),
            "{text:?} does not start with {message:?}"
        );
        if *var == "VRAMCAP_LIMIT" {
            assert!(
                text.ends_with("e.g. 8GiB, 50%, 0=8GiB,1=4GiB or 4GiB,GPU-5ca1ab1e=2GiB"),
                "{text}"
            );
        }
    }
}

#[test]
#[rustfmt::skip]
fn resolver_hands_out_hooks_for_the_exact_variants_only() {
    client("procaddr", &[("VRAMCAP_LIMIT", "1GiB")], &[
        "resolve", "cuMemAlloc", "3020", "0",
        "resolve", "cuMemAlloc", "2000", "0",
        "resolve", "cuMemAlloc", "13000", "2",
        "resolve", "cuGetProcAddress", "12000", "0",
        "resolve", "cuGetProcAddress", "11030", "0",
        "resolve", "cuMemFree", "3020", "0",
        "resolve", "cuMemFree", "2000", "0",
        "resolve", "cuMemGetInfo", "3020", "0",
        "resolve", "cuDeviceTotalMem", "3020", "0",
        "resolve", "cuMemAllocManaged", "6000", "0",
        "resolve", "cuMemAllocManaged", "5000", "0",
        "resolve", "cuMemAllocPitch", "3020", "0",
        "resolve", "cuNoSuchFunction", "12000", "0",
        "resolve", "cuMemAlloc", "99000", "0",
        "resolve4", "cuMemAlloc", "3020", "0",
        "resolve4", "cuNoSuchFunction", "3020", "0",
        "resolve", "cuInit", "2000", "0",
    ])
    .expect_lines(&[
        "resolve cuMemAlloc 3020 0 -> 0 status=0 lib=libvramcap.so",
        "resolve cuMemAlloc 2000 0 -> 0 status=0 lib=libcuda.so.1",
        "resolve cuMemAlloc 13000 2 -> 0 status=0 lib=libvramcap.so",
        "resolve cuGetProcAddress 12000 0 -> 0 status=0 lib=libvramcap.so",
        "resolve cuGetProcAddress 11030 0 -> 0 status=0 lib=libvramcap.so",
        "resolve cuMemFree 3020 0 -> 0 status=0 lib=libvramcap.so",
        "resolve cuMemFree 2000 0 -> 0 status=2 lib=null",
        "resolve cuMemGetInfo 3020 0 -> 0 status=0 lib=libvramcap.so",
        "resolve cuDeviceTotalMem 3020 0 -> 0 status=0 lib=libvramcap.so",
        "resolve cuMemAllocManaged 6000 0 -> 0 status=0 lib=libvramcap.so",
        "resolve cuMemAllocManaged 5000 0 -> 0 status=2 lib=null",
        "resolve cuMemAllocPitch 3020 0 -> 0 status=0 lib=libvramcap.so",
        "resolve cuNoSuchFunction 12000 0 -> 0 status=1 lib=null",
        "resolve cuMemAlloc 99000 0 -> 1 status=0 lib=null",
        "resolve4 cuMemAlloc 3020 0 -> 0 status=- lib=libvramcap.so",
        "resolve4 cuNoSuchFunction 3020 0 -> 0 status=- lib=null",
        "resolve cuInit 2000 0 -> 0 status=0 lib=libcuda.so.1",
    ]);
}

/// A driver that hands out internal pointers (not its exported symbols)
/// still gets its calls capped: the variant is then found by name and version.
#[test]
fn internal_driver_pointers_are_matched_by_version() {
    for method in ["procaddr", "procaddr-legacy"] {
        client(
            method,
            &[("VRAMCAP_LIMIT", "1GiB"), ("STANDIN_PROCADDR_ALIASES", "1")],
            &["init", "fill", "512M", "info", "freeall"],
        )
        .expect_lines(&[
            "init -> 0",
            "fill 536870912 -> 2 allocs 1073741824 bytes rc=2",
            &format!("info -> 0 free=0 total={GIB}"),
            "freeall -> 2 freed rc=0",
        ]);
    }
}

#[test]
#[rustfmt::skip]
fn dlsym_answers() {
    client("linked", &[("VRAMCAP_LIMIT", "1GiB")], &[
        "dlsym", "cuMemAlloc_v2",
        "dlsym", "cuGetProcAddress_v2",
        "dlsym", "cuGetProcAddress",
        "dlsym", "cuMemAlloc",
        "dlsym", "cuInit",
        "dlsym", "cuNoSuchFunction",
        "default", "cuMemAlloc_v2",
        "default", "getpid",
        // From the executable, the next object is the preloaded shim. A
        // wrapper that became the caller would skip it and find the driver.
        "next", "cuMemAlloc_v2",
        "next", "getpid",
    ])
    .expect_lines(&[
        "dlsym cuMemAlloc_v2 -> lib=libvramcap.so",
        "dlsym cuGetProcAddress_v2 -> lib=libvramcap.so",
        "dlsym cuGetProcAddress -> lib=libvramcap.so",
        "dlsym cuMemAlloc -> lib=libcuda.so.1",
        "dlsym cuInit -> lib=libcuda.so.1",
        "dlsym cuNoSuchFunction -> lib=null",
        "default cuMemAlloc_v2 -> lib=libvramcap.so",
        "default getpid -> lib=libc.so.6",
        "next cuMemAlloc_v2 -> lib=libvramcap.so",
        "next getpid -> lib=libc.so.6",
    ]);
}

/// 16 threads allocate and free at random near the cap: the driver never
/// holds more than the cap, nothing fails but with out-of-memory, and all
/// bytes come back.
#[test]
fn threads_hammering_near_the_cap() {
    let cap = 256 * MIB;
    let lines = client(
        "procaddr",
        &[("VRAMCAP_LIMIT", "256MiB"), ("VRAMCAP_CACHE", "off")],
        &["init", "threads", "16", "2000", "16M", "info", "standin"],
    )
    .ok_lines();
    assert_eq!(lines[0], "init -> 0");
    let counts: Vec<u64> = lines[1]
        .strip_prefix("threads -> ")
        .unwrap_or_else(|| panic!("{lines:?}"))
        .split(' ')
        .map(|kv| kv.split_once('=').unwrap().1.parse().unwrap())
        .collect();
    let (ok, oom, other) = (counts[0], counts[1], counts[2]);
    assert_eq!(other, 0, "{lines:?}");
    assert!(ok > 1000 && oom > 0, "the cap must be contended: {lines:?}");
    assert_eq!(lines[2], format!("info -> 0 free={cap} total={cap}"));
    let peak: u64 = lines[3].rsplit_once("peak=").unwrap().1.parse().unwrap();
    assert!(peak <= cap && peak > cap / 2, "{lines:?}");
    assert!(lines[3].starts_with("standin dev=0 used=0 "), "{lines:?}");
}

#[test]
fn cudarc_dynamic_loading_is_capped() {
    let a = artefacts();
    let mut cmd = shimmed(&a.cudarc_client);
    cmd.env("VRAMCAP_LIMIT", "1GiB")
        .arg(format!("{}", 256 * MIB));
    run(cmd).expect_lines(&[
        &format!("device total={GIB}"),
        "fill 4 allocs 1073741824 bytes rc=CUDA_ERROR_OUT_OF_MEMORY",
        &format!("info free=0 total={GIB}"),
        &format!("after free={GIB} total={GIB}"),
    ]);
}

/// Programs that never touch CUDA run unchanged under the shim.
#[test]
fn non_cuda_programs_are_unaffected() {
    let mut cmd = shimmed(std::path::Path::new("/bin/sh"));
    cmd.env("VRAMCAP_LIMIT", "1GiB")
        .args(["-c", "echo hello; exit 7"]);
    let ran = run(cmd);
    ran.expect_code(7);
    assert_eq!(ran.stdout(), "hello\n");
    assert_eq!(ran.stderr(), "");
}

/// `vramcap run` puts the shim in front, keeps an existing LD_PRELOAD after
/// it, and the command's exit status comes through.
#[test]
fn cli_run_prepends_the_shim_and_passes_the_status() {
    let a = artefacts();
    let mut cmd = bare(&a.cli);
    cmd.env("LD_PRELOAD", "/nonexistent/other.so").args([
        "run",
        "--limit",
        "1GiB",
        "--",
        "/bin/sh",
        "-c",
        "echo \"$LD_PRELOAD\"; echo \"$VRAMCAP_LIMIT\"; exit 7",
    ]);
    let ran = run(cmd);
    ran.expect_code(7);
    assert_eq!(
        ran.stdout(),
        format!("{}:/nonexistent/other.so\n1GiB\n", a.shim.display())
    );

    let mut cmd = bare(&a.cli);
    cmd.args(["run", "--limit", "1GiB", "--"])
        .arg(&a.client)
        .args(["procaddr", "init", "fill", "256M"]);
    run(cmd).expect_lines(&[
        "init -> 0",
        "fill 268435456 -> 4 allocs 1073741824 bytes rc=2",
    ]);
}

#[test]
fn cli_refuses_a_bad_limit_before_starting_anything() {
    let a = artefacts();
    let mut cmd = bare(&a.cli);
    cmd.args(["run", "--limit", "8XB", "--", "/bin/echo", "ran"]);
    let ran = run(cmd);
    ran.expect_code(2);
    assert_eq!(ran.stdout(), "");
    assert!(
        ran.stderr()
            .starts_with("vramcap: VRAMCAP_LIMIT=\"8XB\" is not a valid limit: unknown unit"),
        "{}",
        ran.stderr()
    );

    let mut cmd = bare(&a.cli);
    cmd.args(["env", "--limit", "4GiB", "--log", "info"]);
    run(cmd).expect_lines(&[
        &format!("export LD_PRELOAD='{}'", a.shim.display()),
        "export VRAMCAP_LIMIT='4GiB'",
        "export VRAMCAP_LOG='info'",
        "# VRAMCAP_COUNT=held: the cap counts everything the process holds on each GPU (allocations, stream-ordered pools, graph memory, the context)",
    ]);
}
