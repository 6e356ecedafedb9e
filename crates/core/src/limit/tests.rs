//! Tests of the limit grammar: examples, errors, and properties.

use super::*;

fn pct(s: &str) -> Amount {
    Amount::Percent(Percent::parse_number(s).unwrap())
}

#[test]
fn valid_specs() {
    let gib = 1u64 << 30;
    let s = parse_limit("8GiB").unwrap();
    assert_eq!(s.default, Some(Amount::Bytes(8 * gib)));
    assert!(s.entries.is_empty());

    let s = parse_limit("50%").unwrap();
    assert_eq!(s.default, Some(pct("50")));

    let s = parse_limit("0=8GiB,1=4GiB").unwrap();
    assert_eq!(s.default, None);
    assert_eq!(
        s.entries,
        vec![
            (Key::Ordinal(0), Amount::Bytes(8 * gib)),
            (Key::Ordinal(1), Amount::Bytes(4 * gib))
        ]
    );

    let s = parse_limit("4GiB, 1 = 2GiB").unwrap();
    assert_eq!(s.default, Some(Amount::Bytes(4 * gib)));
    assert_eq!(s.entries, vec![(Key::Ordinal(1), Amount::Bytes(2 * gib))]);

    let s = parse_limit("GPU-5CA1ab1e=25%").unwrap();
    assert_eq!(
        s.entries,
        vec![(Key::UuidPrefix("gpu-5ca1ab1e".into()), pct("25"))]
    );
    assert!(s.needs_uuid());
}

#[test]
fn invalid_specs_name_the_problem() {
    let cases: &[(&str, &str)] = &[
        ("", "the value is empty"),
        ("8XB", "unknown unit \"XB\""),
        ("-4GiB", "does not start with a decimal number"),
        ("0", "greater than zero"),
        ("010G", "leading zero"),
        ("200%", "out of range"),
        ("0%", "out of range"),
        ("%", "no number before '%'"),
        ("4G,,1=2G", "empty"),
        ("4G,2G", "more than one entry without a device"),
        ("0=1G,0=2G", "device 0 is given more than once"),
        ("=1G", "no device before it"),
        ("x=1G", "is not a device"),
        ("64=1G", "beyond the 64 devices"),
        ("00=1G", "leading zero"),
        ("GPU-=1G", "no hex digits"),
        ("GPU-zz=1G", "not a GPU UUID prefix"),
        ("0=", "has no amount"),
        ("99999999T", "does not fit in 64 bits"),
    ];
    for (value, needle) in cases {
        let err = parse_limit(value).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains(needle),
            "{value:?}: {text:?} lacks {needle:?}"
        );
        assert!(
            text.starts_with(&format!("VRAMCAP_LIMIT=\"{value}\"")),
            "{text}"
        );
        assert!(text.contains(LIMIT_EXAMPLE), "{text}");
        assert!(!text.contains('\n'));
    }
}

#[test]
fn amounts_per_device() {
    let s = parse_limit("4GiB,1=2GiB,GPU-5ca1ab1e-0000=1GiB,GPU-5ca1=3GiB").unwrap();
    let g = 1u64 << 30;
    let u0 = "GPU-5CA1AB1E-0000-4000-8000-000000000000";
    let other = "GPU-aaaa";
    assert_eq!(s.amount_for(0, Some(other)), Some(Amount::Bytes(4 * g)));
    assert_eq!(s.amount_for(1, Some(other)), Some(Amount::Bytes(2 * g)));
    // Longest UUID prefix wins, and UUID beats the ordinal entry.
    assert_eq!(s.amount_for(1, Some(u0)), Some(Amount::Bytes(g)));
    assert_eq!(
        s.amount_for(2, Some("gpu-5ca1ffff")),
        Some(Amount::Bytes(3 * g))
    );
    assert_eq!(s.amount_for(2, None), Some(Amount::Bytes(4 * g)));

    let s = parse_limit("1=2GiB").unwrap();
    assert_eq!(s.amount_for(0, None), None);
    assert!(
        parse_limit("50%")
            .unwrap()
            .amount_for(3, None)
            .unwrap()
            .resolve(1000)
            == 500
    );
}

#[test]
fn ordinals_after_cuda_visible_devices() {
    let u = "GPU-5ca1ab1e-0000-4000-8000-000000000001";
    assert_eq!(cuda_ordinal(1, u, None), Some(1));
    assert_eq!(cuda_ordinal(1, u, Some("1,0")), Some(0));
    assert_eq!(cuda_ordinal(0, "GPU-aa", Some("1,0")), Some(1));
    assert_eq!(cuda_ordinal(2, "GPU-aa", Some("1,0")), None);
    assert_eq!(
        cuda_ordinal(1, u, Some("GPU-5CA1AB1E-0000-4000-8000-000000000001")),
        Some(0)
    );
    assert_eq!(cuda_ordinal(1, u, Some("0,GPU-5ca1")), Some(1));
    assert_eq!(
        cuda_ordinal(1, u, Some("0,x,1")),
        None,
        "CUDA stops at an unreadable entry"
    );
    assert_eq!(cuda_ordinal(0, u, Some("")), None);
    // Text that is no entry at all, even cut inside a character.
    assert_eq!(cuda_ordinal(0, u, Some("aéé")), None);
}

#[test]
fn a_limit_longer_than_a_group_records_is_refused() {
    // 12 full UUID entries (issue 13 had one of 563 bytes).
    let long: String = (0..12)
        .map(|i| format!("GPU-5ca1ab1e-0000-4000-8000-0000000000{i:02}=1GiB"))
        .collect::<Vec<_>>()
        .join(",");
    assert_eq!(long.len(), 551);
    let text = parse_limit(&long).unwrap_err().to_string();
    assert_eq!(
        text,
        format!(
            "VRAMCAP_LIMIT=\"{}…\" is not a valid limit: the value is 551 bytes long, more than the 511 a limit may have (a UUID key can be a short prefix, e.g. GPU-5ca1ab1e); expected a size or percentage per GPU, e.g. {LIMIT_EXAMPLE}",
            &long[..64]
        )
    );
    // Exactly 511 bytes is fine; the group field holds it whole.
    let fits = format!("{}1G", " ".repeat(LIMIT_MAX_LEN - 2));
    assert_eq!(fits.len(), 511);
    assert!(parse_limit(&fits).is_ok());
    assert!(parse_limit(&format!(" {fits}")).is_err());
    let mut field = [0u8; crate::group::LIMIT_TEXT_LEN];
    crate::page::put_text(&mut field, &fits);
    assert_eq!(crate::page::get_text(&field), fits);
}

#[test]
fn canonical_text_parses_back() {
    let g = 1u64 << 30;
    for (text, canon) in [
        ("8GiB", "8GiB"),
        ("1.5G", "1536MiB"),
        ("4097", "4097"),
        ("1024", "1KiB"),
        ("2048T", "2048TiB"),
        ("12.5%", "12.5%"),
        ("1=2G, 4gb ,gpu-5CA1=50%", "4GiB,1=2GiB,GPU-5ca1=50%"),
    ] {
        let spec = parse_limit(text).unwrap();
        assert_eq!(spec.canonical(), canon, "{text}");
        assert_eq!(parse_limit(canon).unwrap(), spec, "{text}");
    }
    assert_eq!(Amount::Bytes(3 * g).canonical(), "3GiB");
    assert_eq!(LimitSpec::default().canonical(), "");
}

fn gpus(n: u32) -> Vec<Gpu> {
    (0..n)
        .map(|i| Gpu {
            index: Some(i),
            uuid: Some(format!("GPU-5ca1ab1e-0000-4000-8000-{i:012x}")),
            name: Some(format!("vramcap stand-in {i}")),
        })
        .collect()
}

#[test]
fn keys_must_name_a_gpu() {
    let two = gpus(2);
    let ok = |v: &str, visible: u32, g: &[Gpu]| parse_limit(v).unwrap().check_keys(v, visible, g);
    assert_eq!(ok("8GiB", 0, &[]), Ok(()));
    assert_eq!(ok("0=1G,1=2G,GPU-5CA1AB1E=3G", 2, &two), Ok(()));
    assert_eq!(
        ok("GPU-5ca1ab1e-0000-4000-8000-000000000001=1G", 2, &two),
        Ok(())
    );

    let e = ok("5=1GiB", 2, &two).unwrap_err();
    assert_eq!(e.keys, vec![Key::Ordinal(5)]);
    assert_eq!(
        e.to_string(),
        "VRAMCAP_LIMIT=\"5=1GiB\": device 5 names no GPU; this process sees 2: \
         0 GPU-5ca1ab1e-0000-4000-8000-000000000000 (vramcap stand-in 0), \
         1 GPU-5ca1ab1e-0000-4000-8000-000000000001 (vramcap stand-in 1); \
         a device is its index or a prefix of its UUID, e.g. 1=1GiB or GPU-5ca1ab1e-0000-4000-8000-000000000001=1GiB"
    );
    // A typo in a UUID, and an index: both named.
    let e = ok("2=512M,GPU-5ca1ab1e0000=1G", 2, &two).unwrap_err();
    assert_eq!(
        e.keys,
        vec![Key::Ordinal(2), Key::UuidPrefix("gpu-5ca1ab1e0000".into())]
    );
    assert!(e.has_uuid_key());
    assert!(
        e.to_string().starts_with(
            "VRAMCAP_LIMIT=\"2=512M,GPU-5ca1ab1e0000=1G\": devices 2, GPU-5ca1ab1e0000 name no GPU; this process sees 2: "
        ),
        "{e}"
    );
    assert!(
        e.to_string()
            .ends_with("e.g. 1=512MiB or GPU-5ca1ab1e-0000-4000-8000-000000000001=512MiB"),
        "{e}"
    );

    // A GPU of the machine that the process does not see (a setting
    // shared under CUDA_VISIBLE_DEVICES) is a match.
    let mut machine = two.clone();
    machine.push(Gpu {
        index: None,
        uuid: Some("GPU-5ca1ab1e-0000-4000-8000-000000000003".into()),
        name: None,
    });
    assert_eq!(
        ok("GPU-5ca1ab1e-0000-4000-8000-000000000003=1G", 2, &machine),
        Ok(())
    );
    let e = ok("GPU-5ca1ab1e-0000-4000-8000-000000000004=1G", 2, &machine).unwrap_err();
    assert!(
        e.to_string().contains("(vramcap stand-in 1); the machine also has GPU-5ca1ab1e-0000-4000-8000-000000000003; a device is"),
        "{e}"
    );
    // No GPU at all, and an unreadable UUID.
    let e = ok("0=50%", 0, &[]).unwrap_err();
    assert!(
        e.to_string().ends_with("device 0 names no GPU; this process sees no GPU; a device is its index or a prefix of its UUID, e.g. 0=50%"),
        "{e}"
    );
    let blind = [Gpu {
        index: Some(0),
        uuid: None,
        name: None,
    }];
    let e = ok("GPU-aa=1G", 1, &blind).unwrap_err();
    assert!(
        e.to_string()
            .contains("this process sees 1: 0 (UUID unreadable); a device"),
        "{e}"
    );
    assert!(!e.to_string().contains('\n'));
}

/// Property tests of the grammar: 1000 cases each (eight properties, a
/// few seconds in a debug build), so CI stays well inside its limit.
mod props {
    use super::super::*;
    use proptest::prelude::*;

    /// An amount as people write it: any unit spelling, a fraction,
    /// spaces, or a percentage; sometimes out of range.
    fn amount_text() -> impl Strategy<Value = String> {
        let unit = prop::sample::select(vec![
            "", "b", "B", "k", "K", "kb", "KiB", "m", "MB", "MiB", "mib", "g", "G", "gb", "GiB",
            "t", "T", "TB", "TiB",
        ]);
        prop_oneof![
            (0u64..(1 << 45), unit.clone(), prop::bool::ANY)
                .prop_map(|(n, u, sp)| format!("{n}{}{u}", if sp { " " } else { "" })),
            (0u64..5000, 0u32..10_000, unit).prop_map(|(n, frac, u)| format!("{n}.{frac}{u}")),
            (0u32..120, prop::option::of(0u32..100_000)).prop_map(|(p, d)| match d {
                Some(d) => format!("{p}.{d}%"),
                None => format!("{p}%"),
            }),
        ]
    }

    fn key_text() -> impl Strategy<Value = String> {
        prop_oneof![
            (0u32..70).prop_map(|n| n.to_string()),
            ("[gG][pP][uU]-[0-9a-fA-F-]{1,36}").prop_map(|s| s),
        ]
    }

    /// A value in the grammar's shape, valid or not (duplicates, two
    /// defaults, zero, overflow, stray spaces).
    fn limit_text() -> impl Strategy<Value = String> {
        let item = (prop::option::of(key_text()), amount_text(), prop::bool::ANY).prop_map(
            |(k, a, sp)| {
                let s = if sp { " " } else { "" };
                match k {
                    Some(k) => format!("{s}{k}{s}={s}{a}"),
                    None => format!("{s}{a}"),
                }
            },
        );
        prop::collection::vec(item, 1..12).prop_map(|v| v.join(","))
    }

    /// A spec built directly: unique keys, valid amounts.
    fn spec() -> impl Strategy<Value = LimitSpec> {
        let amount = prop_oneof![
            (1u64..=u64::MAX).prop_map(Amount::Bytes),
            (0u64..(1 << 24), 0u32..41).prop_map(|(n, s)| Amount::Bytes((n + 1) << s)),
            (1u32..=1_000_000).prop_map(|ppm| {
                let text = format!("{}.{:04}", ppm / 10_000, ppm % 10_000);
                Amount::Percent(Percent::parse_number(&text).expect("in range"))
            }),
        ];
        let key = prop_oneof![
            (0u32..64).prop_map(Key::Ordinal),
            "[0-9a-f][0-9a-f-]{0,35}".prop_map(|h| Key::UuidPrefix(format!("gpu-{h}"))),
        ];
        (
            prop::option::of(amount.clone()),
            prop::collection::vec((key, amount), 0..8),
        )
            .prop_map(|(default, entries)| {
                let mut seen = Vec::new();
                let entries = entries
                    .into_iter()
                    .filter(|(k, _)| {
                        let fresh = !seen.contains(k);
                        seen.push(k.clone());
                        fresh
                    })
                    .collect();
                LimitSpec { default, entries }
            })
            .prop_filter("a spec that says something", |s| !s.is_unlimited())
    }

    /// Every refusal is one line that names the variable and shows a
    /// correct example.
    fn check_error(e: &LimitError) -> Result<(), TestCaseError> {
        let text = e.to_string();
        prop_assert!(text.starts_with("VRAMCAP_LIMIT=\""), "{}", text);
        prop_assert!(text.ends_with(LIMIT_EXAMPLE), "{}", text);
        prop_assert!(!text.contains('\n'), "{}", text);
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        #[test]
        fn never_panics(s in "\\PC{0,40}") {
            if let Err(e) = parse_limit(&s) {
                check_error(&e)?;
            }
        }

        #[test]
        fn never_panics_on_long_or_odd_text(s in "[0-9a-fA-FgGpPuUiI%=,. \t\n\u{0}-]{0,700}") {
            match parse_limit(&s) {
                Ok(spec) => {
                    prop_assert!(s.len() <= LIMIT_MAX_LEN);
                    prop_assert_eq!(parse_limit(&spec.canonical()), Ok(spec));
                }
                Err(e) => check_error(&e)?,
            }
        }

        #[test]
        fn what_parses_displays_and_parses_back(text in limit_text()) {
            match parse_limit(&text) {
                Ok(spec) => {
                    prop_assert!(text.len() <= LIMIT_MAX_LEN);
                    let canon = spec.canonical();
                    prop_assert_eq!(parse_limit(&canon), Ok(spec.clone()), "{} -> {}", text, canon);
                    // And the canonical text is a fixed point.
                    prop_assert_eq!(parse_limit(&canon).map(|s| s.canonical()), Ok(canon));
                }
                Err(e) => check_error(&e)?,
            }
        }

        #[test]
        fn specs_display_and_parse_back(spec in spec()) {
            let canon = spec.canonical();
            prop_assume!(canon.len() <= LIMIT_MAX_LEN);
            prop_assert_eq!(parse_limit(&canon), Ok(spec));
        }

        #[test]
        fn cuda_visible_devices_never_panics(cvd in "\\PC{0,30}", index in 0u32..4) {
            let _ = cuda_ordinal(index, "GPU-5ca1ab1e-0000-4000-8000-000000000001", Some(&cvd));
        }

        #[test]
        fn sizes_round_trip(n in 1u64..(1 << 40), unit in prop::sample::select(vec![("", 1u64), ("K", 1 << 10), ("MiB", 1 << 20), ("gb", 1 << 30)])) {
            let (suffix, mul) = unit;
            if let Some(want) = n.checked_mul(mul) {
                let spec = parse_limit(&format!("{n}{suffix}")).unwrap();
                prop_assert_eq!(spec.default, Some(Amount::Bytes(want)));
            }
        }

        #[test]
        fn per_device_round_trip(caps in prop::collection::btree_map(0u32..64, 1u64..(1 << 50), 1..8)) {
            let text = caps.iter().map(|(d, b)| format!("{d}={b}")).collect::<Vec<_>>().join(",");
            let spec = parse_limit(&text).unwrap();
            for d in 0..64u32 {
                prop_assert_eq!(spec.amount_for(d, None), caps.get(&d).map(|b| Amount::Bytes(*b)));
            }
        }

        /// The key check never panics and agrees with `amount_for`: a
        /// key it accepts applies to some listed GPU or visible index.
        #[test]
        fn accepted_keys_apply_to_a_gpu(text in limit_text(), visible in 0u32..4) {
            if let Ok(spec) = parse_limit(&text) {
                let gpus: Vec<Gpu> = (0..visible).map(|i| Gpu {
                    index: Some(i),
                    uuid: Some(format!("GPU-5ca1ab1e-0000-4000-8000-{i:012x}")),
                    name: None,
                }).collect();
                match spec.check_keys(&text, visible, &gpus) {
                    Ok(()) => for (k, _) in &spec.entries {
                        let hit = (0..visible).any(|i| match k {
                            Key::Ordinal(n) => *n == i,
                            Key::UuidPrefix(p) => gpus[i as usize].uuid.as_deref().unwrap().to_ascii_lowercase().starts_with(p.as_str()),
                        });
                        prop_assert!(hit, "{:?} in {}", k, text);
                    },
                    Err(e) => {
                        prop_assert!(!e.keys.is_empty());
                        let line = e.to_string();
                        prop_assert!(line.starts_with("VRAMCAP_LIMIT=\""), "{}", line);
                        prop_assert!(!line.contains('\n'), "{}", line);
                    }
                }
            }
        }
    }
}
