//! Tests of the settings: every variable, good and bad values.

use super::*;
use std::collections::HashMap;

fn read(pairs: &[(&str, &str)]) -> Result<Settings, SettingsError> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Settings::from_lookup(|k| map.get(k).cloned())
}

#[test]
fn misspelt_and_miscased_names_are_told_the_closest_setting() {
    let env = [
        ("VRAMCAP_LIMT", "1GiB"),
        ("vramcap_limit", "2GiB"),
        ("Vramcap_Limit", "3GiB"),
        ("VRAMCAP_LIMIT", "4GiB"),
        ("VRAMCAP_CACHE_IDEL", "5s"),
        ("VRAMCAP_SPIL_LIMIT", "1G"),
        ("VRAMCAP_STATSDIR", "/x"),
        ("VRAMCAP_GRUOP", "g"),
        ("VRAMCAP_LIBARY", "/l"),
        ("VRAMCAP_PROBE_GPU", "1"),
        ("VRAMCAP_DEMO_LIMIT", "1G"),
        ("VRAMCAPLIMIT", "1G"),
        ("PATH", "/bin"),
        ("VRAMCA", "x"),
    ];
    let lines: Vec<String> = unknown_vars(env).iter().map(|u| u.to_string()).collect();
    assert_eq!(
        lines,
        [
            "VRAMCAP_LIMT=1GiB: not a vramcap setting; did you mean VRAMCAP_LIMIT?",
            "vramcap_limit=2GiB: not a vramcap setting; did you mean VRAMCAP_LIMIT?",
            "Vramcap_Limit=3GiB: not a vramcap setting; did you mean VRAMCAP_LIMIT?",
            "VRAMCAP_CACHE_IDEL=5s: not a vramcap setting; did you mean VRAMCAP_CACHE_IDLE?",
            "VRAMCAP_SPIL_LIMIT=1G: not a vramcap setting; did you mean VRAMCAP_SPILL_LIMIT?",
            "VRAMCAP_STATSDIR=/x: not a vramcap setting; did you mean VRAMCAP_STATS_DIR?",
            "VRAMCAP_GRUOP=g: not a vramcap setting; did you mean VRAMCAP_GROUP?",
            "VRAMCAP_LIBARY=/l: not a vramcap setting; did you mean VRAMCAP_LIBRARY?",
        ]
    );
    // Control characters in a value are shown escaped, long values cut.
    let odd = unknown_vars([
        ("VRAMCAP_X", "a\x1b[2Jb".to_string()),
        ("VRAMCAP_Y", "z".repeat(300)),
    ]);
    assert_eq!(
        odd[0].to_string(),
        "VRAMCAP_X=a\\u{1b}[2Jb: not a vramcap setting; did you mean VRAMCAP_LOG?"
    );
    assert_eq!(
        odd[1].to_string(),
        format!(
            "VRAMCAP_Y={}…: not a vramcap setting; did you mean VRAMCAP_LOG?",
            "z".repeat(100)
        )
    );
    // Every setting the parser reads is in the one list.
    for name in [
        LIMIT_VAR,
        LOG_VAR,
        CUDA_LIBRARY_VAR,
        DISABLE_VAR,
        STATS_VAR,
        STATS_DIR_VAR,
        CACHE_VAR,
        CACHE_IDLE_VAR,
        SPILL_VAR,
        SPILL_LIMIT_VAR,
        GROUP_VAR,
    ] {
        assert!(SETTING_VARS.contains(&name), "{name}");
    }
}

#[test]
fn defaults() {
    let s = read(&[]).unwrap();
    assert!(s.limit.is_unlimited());
    assert_eq!(s.log, LogLevel::Warn);
    assert_eq!(s.cuda_library, None);
    assert!(!s.disabled);
    assert!(s.stats);
    assert_eq!(s.stats_dir, None);
    assert_eq!(s.cache, CacheBound::DEFAULT);
    assert_eq!(s.cache.resolve(4000), 1000);
    assert_eq!(s.cache_idle, std::time::Duration::from_secs(5));
}

#[test]
fn group_values() {
    assert_eq!(read(&[]).unwrap().group, None);
    assert_eq!(
        read(&[("VRAMCAP_GROUP", "train-42")])
            .unwrap()
            .group
            .as_deref(),
        Some("train-42")
    );
    let e = read(&[("VRAMCAP_GROUP", "a b")]).unwrap_err().to_string();
    assert!(
        e.starts_with("VRAMCAP_GROUP=\"a b\" is not valid: expected 1 to 63 letters"),
        "{e}"
    );
    assert_eq!(
        read(&[("VRAMCAP_LIMIT", "4GiB")]).unwrap().limit_text,
        "4GiB"
    );
}

#[test]
fn spill_values() {
    let s = read(&[]).unwrap();
    assert_eq!(
        (s.spill, s.spill_limit),
        (Spill::Off, SpillLimit::PARKING_DEFAULT)
    );
    assert_eq!(s.spill_limit.resolve(4000), 3000);
    let spilling = read(&[("VRAMCAP_SPILL", "host")]).unwrap();
    assert_eq!(spilling.spill_limit, SpillLimit::DEFAULT);
    assert_eq!(spilling.spill_limit.resolve(4000), 1000);
    assert_eq!(s.managed_as_host(), None);
    // The removed managed mode is host spill, said in one line.
    let s = read(&[
        ("VRAMCAP_SPILL", "Managed"),
        ("VRAMCAP_SPILL_LIMIT", "6GiB"),
    ])
    .unwrap();
    assert_eq!(
        (s.spill, s.spill_limit),
        (Spill::Host, SpillLimit::Bytes(6 << 30))
    );
    assert_eq!(
        s.managed_as_host(),
        Some(
            "VRAMCAP_SPILL=managed is taken as host (e.g. VRAMCAP_SPILL=host): managed memory past the cap could be moved onto the GPU by the program, unseen by NVML"
        )
    );
    let s = read(&[("VRAMCAP_SPILL", "host")]).unwrap();
    assert_eq!((s.spill, s.managed_as_host()), (Spill::Host, None));
    assert_eq!(
        read(&[("VRAMCAP_SPILL_LIMIT", "10%")])
            .unwrap()
            .spill_limit
            .resolve(1000),
        100
    );
}

#[test]
fn cache_values() {
    let s = read(&[("VRAMCAP_CACHE", "off"), ("VRAMCAP_CACHE_IDLE", "250ms")]).unwrap();
    assert_eq!(s.cache, CacheBound::Off);
    assert_eq!(s.cache.resolve(1000), 0);
    assert_eq!(s.cache_idle, std::time::Duration::from_millis(250));
    assert_eq!(
        read(&[("VRAMCAP_CACHE", "2GiB")]).unwrap().cache,
        CacheBound::Bytes(2 << 30)
    );
    assert_eq!(
        read(&[("VRAMCAP_CACHE", "10%")])
            .unwrap()
            .cache
            .resolve(1000),
        100
    );
    for (v, d) in [
        ("1", 1.0),
        ("1.5s", 1.5),
        ("2m", 120.0),
        ("1h", 3600.0),
        ("100ms", 0.1),
    ] {
        assert_eq!(
            parse_duration(v),
            Some(std::time::Duration::from_secs_f64(d)),
            "{v}"
        );
    }
    for v in [
        "",
        "0",
        "0s",
        "-1s",
        "5x",
        "s",
        ".5s",
        "1.2.3s",
        "5 parsecs",
    ] {
        assert_eq!(parse_duration(v), None, "{v}");
    }
}

#[test]
fn values() {
    let s = read(&[
        ("VRAMCAP_LOG", "DEBUG"),
        ("VRAMCAP_DISABLE", "1"),
        ("VRAMCAP_CUDA_LIBRARY", "/x/libcuda.so.1"),
    ])
    .unwrap();
    assert_eq!(s.log, LogLevel::Debug);
    assert!(s.disabled);
    assert_eq!(s.cuda_library, Some(PathBuf::from("/x/libcuda.so.1")));
}

#[test]
fn errors() {
    let err = |var, value| read(&[(var, value)]).unwrap_err().to_string();
    for (var, value, want) in [
        (
            "VRAMCAP_LOG",
            "loud",
            "VRAMCAP_LOG=\"loud\" is not valid: expected one of error, warn, info, debug (e.g. VRAMCAP_LOG=info)",
        ),
        (
            "VRAMCAP_SPILL",
            "disk",
            "VRAMCAP_SPILL=\"disk\" is not valid: expected off, host or tiered (e.g. VRAMCAP_SPILL=host)",
        ),
        (
            "VRAMCAP_CACHE",
            "lots",
            "VRAMCAP_CACHE=\"lots\" is not valid: expected a size (e.g. 2GiB), a percentage of each GPU's cap (e.g. 25%), or off",
        ),
        (
            "VRAMCAP_COUNT",
            "everything",
            "VRAMCAP_COUNT=\"everything\" is not valid: expected held (everything the process holds on the GPU, the default) or allocations (its allocations only), e.g. VRAMCAP_COUNT=held",
        ),
    ] {
        assert_eq!(err(var, value), want);
    }
    // Where the rest of the line is the parser's own (tested with it).
    for (var, value, start) in [
        (
            "VRAMCAP_DISABLE",
            "yes",
            "VRAMCAP_DISABLE=\"yes\" is not valid",
        ),
        (
            "VRAMCAP_CUDA_LIBRARY",
            " ",
            "VRAMCAP_CUDA_LIBRARY=\" \" is not valid",
        ),
        (
            "VRAMCAP_STATS_DIR",
            "relative/dir",
            "VRAMCAP_STATS_DIR=\"relative/dir\" is not valid: expected an absolute",
        ),
        (
            "VRAMCAP_STATS",
            "maybe",
            "VRAMCAP_STATS=\"maybe\" is not valid: expected on or off",
        ),
        (
            "VRAMCAP_LIMIT",
            "8XB",
            "VRAMCAP_LIMIT=\"8XB\" is not a valid limit: unknown unit",
        ),
        (
            "VRAMCAP_CONTEXT",
            "lots",
            "VRAMCAP_CONTEXT=\"lots\" is not valid: expected auto",
        ),
        (
            "VRAMCAP_SPILL_LIMIT",
            "0",
            "VRAMCAP_SPILL_LIMIT=\"0\" is not valid: expected a size",
        ),
        (
            "VRAMCAP_CACHE_IDLE",
            "soon",
            "VRAMCAP_CACHE_IDLE=\"soon\" is not valid: expected a duration",
        ),
    ] {
        let e = err(var, value);
        assert!(e.starts_with(start), "{e}");
    }
    let s = read(&[("VRAMCAP_STATS", "off"), ("VRAMCAP_STATS_DIR", "/tmp/x")]).unwrap();
    assert!(!s.stats);
    assert_eq!(s.stats_dir, Some(PathBuf::from("/tmp/x")));
}

#[test]
fn counting_and_context() {
    use super::{ContextCharge, Counting};
    let s = read(&[]).unwrap();
    assert_eq!(
        (s.counting, s.context),
        (Counting::Held, ContextCharge::Auto)
    );
    let s = read(&[
        ("VRAMCAP_COUNT", " Allocations "),
        ("VRAMCAP_CONTEXT", "600MiB"),
    ])
    .unwrap();
    assert_eq!(
        (s.counting, s.context),
        (Counting::Allocations, ContextCharge::Bytes(600 << 20))
    );
    assert_eq!(
        read(&[("VRAMCAP_CONTEXT", "AUTO")]).unwrap().context,
        ContextCharge::Auto
    );
    assert_eq!(Counting::Held.page_code(), crate::page::COUNTING_HELD);
}

/// `VRAMCAP_DISABLE` on while a cap is asked for is one warning line that
/// names what is not enforced; off, or with nothing asked, none.
#[test]
fn the_disable_switch_over_a_cap_is_one_warning() {
    let line = |pairs: &[(&str, &str)]| read(pairs).unwrap().disabled_over_cap();
    assert_eq!(
        line(&[("VRAMCAP_DISABLE", " 1 "), ("VRAMCAP_LIMIT", "512MiB")]).as_deref(),
        Some(
            "VRAMCAP_DISABLE=1 turns vramcap off in this process: VRAMCAP_LIMIT=\"512MiB\" is not enforced and it runs uncapped; unset VRAMCAP_DISABLE to cap it (e.g. env -u VRAMCAP_DISABLE python train.py)"
        )
    );
    assert_eq!(
        line(&[
            ("VRAMCAP_DISABLE", "1"),
            ("VRAMCAP_GROUP", "train"),
            ("NVIDIA_GPU_MEMORY_LIMIT", "8192"),
        ])
        .as_deref(),
        Some(
            "VRAMCAP_DISABLE=1 turns vramcap off in this process: VRAMCAP_GROUP=\"train\" and NVIDIA_GPU_MEMORY_LIMIT=8192 are not enforced and it runs uncapped; unset VRAMCAP_DISABLE to cap it (e.g. env -u VRAMCAP_DISABLE python train.py)"
        )
    );
    assert_eq!(line(&[("VRAMCAP_DISABLE", "1")]), None);
    assert_eq!(
        line(&[("VRAMCAP_DISABLE", "0"), ("VRAMCAP_LIMIT", "1GiB")]),
        None
    );
    assert_eq!(line(&[("VRAMCAP_LIMIT", "1GiB")]), None);
}

#[test]
fn modes_parse_and_bad_values_say_so_in_one_line() {
    assert_eq!(parse_park("manual"), Ok(crate::park::ParkMode::Manual));
    assert_eq!(parse_park(" Manual "), Ok(crate::park::ParkMode::Manual));
    assert_eq!(
        parse_park("idle:10m"),
        Ok(crate::park::ParkMode::Idle(std::time::Duration::from_secs(
            600
        )))
    );
    assert_eq!(
        parse_park("IDLE:500ms"),
        Ok(crate::park::ParkMode::Idle(
            std::time::Duration::from_millis(500)
        ))
    );
    for bad in [
        "", "idle", "idle:", "idle:-1s", "auto", "idle:10x", "manual:1", "idle:0x",
    ] {
        let e = parse_park(bad).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "VRAMCAP_PARK=\"{bad}\" is not valid: expected manual (parked only by vramcap park) or idle:DURATION (also parked when idle that long and a group member needs room), e.g. VRAMCAP_PARK=idle:10m"
            )
        );
        assert!(!e.contains('\n'));
    }
    // Zero is zero whatever its unit: `idle:0` as `idle:0.0000001` (both
    // "idle as soon as no call is in flight"), `0s` as `0`.
    for zero in ["idle:0", "idle:0s", "idle:0ms", "idle:0.0"] {
        assert_eq!(
            parse_park(zero),
            Ok(crate::park::ParkMode::Idle(std::time::Duration::ZERO)),
            "{zero}"
        );
    }
    assert_eq!(
        crate::park::ParkMode::from_word(parse_park("idle:0").unwrap().word()),
        crate::park::ParkMode::from_word(parse_park("idle:0.0000001").unwrap().word()),
    );
    for zero in ["0", "0s", "0ms", "0.0m", " 0s "] {
        assert_eq!(
            parse_park_wait(zero),
            Ok(std::time::Duration::ZERO),
            "{zero}"
        );
    }
    for bad in ["soon", "-1s", "0x", ".0s"] {
        assert_eq!(
            parse_park_wait(bad).unwrap_err().to_string(),
            format!(
                "VRAMCAP_PARK_WAIT=\"{bad}\" is not valid: expected a duration, 0 or 0s for none (the default), e.g. VRAMCAP_PARK_WAIT=30s"
            )
        );
    }
    assert_eq!(
        parse_park_wait("30s"),
        Ok(std::time::Duration::from_secs(30))
    );
    assert!(parse_park_wait("soon").is_err());
}

/// `VRAMCAP_FREE_PROBE` is a setting read with the others (issue 41: no
/// switch read outside `Settings`): `1` marks the nvidia-smi a resume
/// runs, `0` or unset nothing, anything else is refused with one line; a
/// secure-execution process never has it.
#[test]
fn the_free_probe_mark_is_a_setting() {
    assert!(!read(&[]).unwrap().free_probe);
    assert!(!read(&[("VRAMCAP_FREE_PROBE", "0")]).unwrap().free_probe);
    assert!(read(&[("VRAMCAP_FREE_PROBE", "1")]).unwrap().free_probe);
    assert_eq!(
        read(&[("VRAMCAP_FREE_PROBE", "yes")])
            .unwrap_err()
            .to_string(),
        "VRAMCAP_FREE_PROBE=\"yes\" is not valid: expected 1, set by the shim for the nvidia-smi a resume runs, or unset"
    );
    assert!(!Settings::for_secure_execution().free_probe);
}

#[test]
fn park_move_is_checkpoint_or_shim_and_shim_needs_parking() {
    use crate::park::ParkMove;
    let with = |vars: &[(&str, &str)]| {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::from_lookup(|name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
    };
    // Unset: the shim's moves with parking on and no host spill, the
    // driver's checkpoint otherwise (without parking it moves nothing).
    assert_eq!(with(&[]).unwrap().park_move, ParkMove::Checkpoint);
    assert_eq!(
        with(&[("VRAMCAP_PARK", "manual")]).unwrap().park_move,
        ParkMove::Shim
    );
    assert_eq!(
        with(&[("VRAMCAP_PARK", "idle:5s"), ("VRAMCAP_SPILL", "host")])
            .unwrap()
            .park_move,
        ParkMove::Checkpoint
    );
    assert_eq!(
        with(&[("VRAMCAP_PARK", "manual"), ("VRAMCAP_PARK_MOVE", " Shim ")])
            .unwrap()
            .park_move,
        ParkMove::Shim
    );
    assert_eq!(
        with(&[("VRAMCAP_PARK_MOVE", "checkpoint")])
            .unwrap()
            .park_move,
        ParkMove::Checkpoint
    );
    assert_eq!(
        with(&[("VRAMCAP_PARK", "manual"), ("VRAMCAP_PARK_MOVE", "fast")])
            .unwrap_err()
            .to_string(),
        "VRAMCAP_PARK_MOVE=\"fast\" is not valid: expected shim (the default), shim+checkpoint or checkpoint, e.g. VRAMCAP_PARK_MOVE=shim+checkpoint"
    );
    assert_eq!(
        with(&[("VRAMCAP_PARK_MOVE", "shim")])
            .unwrap_err()
            .to_string(),
        "VRAMCAP_PARK_MOVE=\"shim\" is not valid: expected checkpoint without VRAMCAP_PARK (the shim's moves apply to parking only), e.g. VRAMCAP_PARK=manual VRAMCAP_PARK_MOVE=shim"
    );
    // The shim's moves, then the driver's checkpoint of the rest.
    let both = with(&[
        ("VRAMCAP_PARK", "idle:5s"),
        ("VRAMCAP_PARK_MOVE", "Shim+Checkpoint"),
    ])
    .unwrap()
    .park_move;
    assert_eq!(both, ParkMove::ShimThenCheckpoint);
    assert!(both.moves_blocks() && both.checkpoints());
    assert!(!ParkMove::Shim.checkpoints() && !ParkMove::Checkpoint.moves_blocks());
    assert_eq!(
        with(&[
            ("VRAMCAP_PARK", "manual"),
            ("VRAMCAP_PARK_MOVE", "shim+checkpoint"),
            ("VRAMCAP_SPILL", "host")
        ])
        .unwrap_err()
        .to_string(),
        "VRAMCAP_PARK_MOVE=\"shim+checkpoint\" is not valid: expected checkpoint with VRAMCAP_SPILL=host (the shim's moves do not spill yet), e.g. VRAMCAP_PARK_MOVE=shim with VRAMCAP_SPILL=off or tiered"
    );
}
