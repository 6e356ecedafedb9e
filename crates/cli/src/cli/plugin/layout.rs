//! What the device plugin advertises and answers, as pure functions of the
//! node's GPUs and the plugin's settings (docs/device-plugin.md): the units
//! of each GPU, the preferred allocation, and the response to `Allocate`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A GPU of the node: its UUID and its memory in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    pub uuid: String,
    pub total: u64,
}

/// How containers get their GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceMode {
    /// `NVIDIA_VISIBLE_DEVICES`, for the NVIDIA container runtime.
    Env,
    /// CDI device names `nvidia.com/gpu=<UUID>` (Kubernetes 1.31+).
    Cdi,
}

/// The plugin's settings that shape its answers.
#[derive(Debug, Clone)]
pub struct Config {
    /// Bytes of one advertised unit.
    pub unit: u64,
    /// Bytes of each GPU not advertised (room for the CUDA contexts, which
    /// the caps count).
    pub reserve: u64,
    /// The shim on the node, and where containers see it.
    pub library: PathBuf,
    pub library_in_container: PathBuf,
    /// The plugin's directory on the node: `ld.so.preload`, and one
    /// directory per allocation under `alloc/`.
    pub state_dir: PathBuf,
    pub device_mode: DeviceMode,
}

/// Where a container finds its cap and its statistics.
pub const OPERATOR_FILE_IN_CONTAINER: &str = "/run/vramcap/operator-limit";
pub const STATS_IN_CONTAINER: &str = "/run/vramcap/stats";
pub const PRELOAD_IN_CONTAINER: &str = "/etc/ld.so.preload";

/// The ID of unit `n` of a GPU.
pub fn unit_id(uuid: &str, n: u64) -> String {
    format!("{uuid}::{n}")
}

/// The GPU UUID and unit number of a unit ID.
pub fn parse_unit_id(id: &str) -> Option<(&str, u64)> {
    let (uuid, text) = id.rsplit_once("::")?;
    let n: u64 = text.parse().ok().filter(|_| !uuid.is_empty())?;
    // Only the form the plugin writes: no sign, no leading zero.
    (n.to_string() == text).then_some((uuid, n))
}

/// How many units a GPU advertises.
pub fn units(gpu: &Gpu, cfg: &Config) -> u64 {
    gpu.total.saturating_sub(cfg.reserve) / cfg.unit.max(1)
}

/// Every unit ID of the node, GPU by GPU.
#[cfg(test)]
pub fn unit_ids(gpus: &[Gpu], cfg: &Config) -> Vec<String> {
    gpus.iter()
        .flat_map(|g| (0..units(g, cfg)).map(|n| unit_id(&g.uuid, n)))
        .collect()
}

/// `GetPreferredAllocation` for one container: `size` IDs from
/// `available`, all of `must` among them, on one GPU when one GPU has
/// room: the GPU with the fewest free units that fits (packing, so large
/// requests keep finding room), among those of `must` if it names any.
/// Without such a GPU, units of the GPUs with the most free units first.
/// Units are taken lowest number first; the answer is sorted.
pub fn preferred(available: &[String], must: &[String], size: usize) -> Vec<String> {
    let mut by_gpu: BTreeMap<&str, BTreeSet<(u64, &str)>> = BTreeMap::new();
    for id in available {
        if let Some((uuid, n)) = parse_unit_id(id) {
            by_gpu.entry(uuid).or_default().insert((n, id.as_str()));
        }
    }
    let mut chosen: BTreeSet<&str> = must.iter().map(String::as_str).collect();
    let must_gpus: BTreeSet<&str> = must
        .iter()
        .filter_map(|id| parse_unit_id(id).map(|(u, _)| u))
        .collect();
    for (uuid, set) in by_gpu.iter_mut() {
        set.retain(|(_, id)| !chosen.contains(id));
        let _ = uuid;
    }
    let mut need = size.saturating_sub(chosen.len());
    if need == 0 {
        return in_order(chosen);
    }
    // One GPU that fits what is still needed, fewest free units first.
    let fits = |uuid: &&str| {
        by_gpu.get(uuid).is_some_and(|s| s.len() >= need)
            && (must_gpus.is_empty() || must_gpus.contains(uuid))
    };
    let one = by_gpu
        .keys()
        .filter(|u| fits(u))
        .min_by_key(|u| (by_gpu[*u].len(), *u))
        .copied();
    let order: Vec<&str> = match one {
        Some(u) => vec![u],
        None => {
            let mut all: Vec<&str> = by_gpu.keys().copied().collect();
            all.sort_by_key(|u| (!must_gpus.contains(u), std::cmp::Reverse(by_gpu[u].len())));
            all
        }
    };
    for u in order {
        for (_, id) in &by_gpu[u] {
            if need == 0 {
                break;
            }
            chosen.insert(id);
            need -= 1;
        }
    }
    in_order(chosen)
}

/// Unit IDs by GPU, then by unit number (not as text: `::10` after `::9`).
fn in_order(ids: BTreeSet<&str>) -> Vec<String> {
    let mut v: Vec<&str> = ids.into_iter().collect();
    v.sort_by_key(|id| parse_unit_id(id).map(|(u, n)| (u.to_string(), n)));
    v.into_iter().map(str::to_string).collect()
}

/// A container's answer to `Allocate`, before it becomes the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    /// The allocation's directory under `alloc/`: a hash of its sorted IDs,
    /// which are unique on the node while allocated.
    pub id: String,
    /// The caps: (UUID, bytes), by UUID.
    pub caps: Vec<(String, u64)>,
    pub envs: BTreeMap<String, String>,
    /// (container path, node path, read-only).
    pub mounts: Vec<(String, String, bool)>,
    pub cdi_devices: Vec<String>,
    /// What the operator's cap file holds.
    pub operator_file: String,
}

/// FNV-1a of the text, as 16 hex digits (stable across builds and runs).
fn hash_hex(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// The stem of the directories of allocations of these unit IDs.
pub fn ids_stem(ids: &[String]) -> String {
    let mut sorted: Vec<&str> = ids.iter().map(String::as_str).collect();
    sorted.sort_unstable();
    hash_hex(&sorted.join(","))
}

/// Which allocation directories (by name, `<stem>-<serial>`) belong to
/// allocations that ended, given the stems of the units the kubelet still
/// has allocated: those whose stem is not among them, and of those whose
/// stem is, all but the newest (the same units given to a later pod).
/// Names not of that form are left alone.
pub fn ended(names: &[String], live: &BTreeSet<String>) -> Vec<String> {
    let mut newest: BTreeMap<&str, u64> = BTreeMap::new();
    let parsed: Vec<(&str, &str, u64)> = names
        .iter()
        .filter_map(|n| {
            let (stem, serial) = n.rsplit_once('-')?;
            let serial = serial.parse().ok()?;
            (stem.len() == 16 && stem.bytes().all(|b| b.is_ascii_hexdigit())).then_some((
                n.as_str(),
                stem,
                serial,
            ))
        })
        .collect();
    for &(_, stem, serial) in &parsed {
        let e = newest.entry(stem).or_insert(serial);
        *e = (*e).max(serial);
    }
    parsed
        .into_iter()
        .filter(|&(_, stem, serial)| !live.contains(stem) || newest[stem] != serial)
        .map(|(n, _, _)| n.to_string())
        .collect()
}

/// The allocation directory of an allocation.
pub fn alloc_dir(cfg: &Config, id: &str) -> PathBuf {
    cfg.state_dir.join("alloc").join(id)
}

/// The cap of every GPU a container was not given.
pub const NOT_GIVEN: &str = "1B";

/// A byte count as the limit grammar reads it: whole MiB as `NMiB`
/// (shorter: the operator's file holds at most 511 characters a line).
fn size_text(bytes: u64) -> String {
    if bytes.is_multiple_of(1 << 20) {
        format!("{}MiB", bytes >> 20)
    } else {
        bytes.to_string()
    }
}

/// An ID as a refusal shows it: quoted and escaped, and cut after 80
/// characters (a refusal is one short line whatever the request held; a
/// gRPC status message travels in a header).
pub fn shown_id(id: &str) -> String {
    let n = id.chars().count();
    if n <= 80 {
        return format!("{id:?}");
    }
    let head: String = id.chars().take(64).collect();
    format!("{:?}… ({n} characters)", head)
}

/// `Allocate` for one container given the unit IDs `ids`: each GPU is
/// capped at its units' bytes, and every other GPU at one byte, so that a
/// container that reaches more GPUs than it was given (its own
/// `NVIDIA_VISIBLE_DEVICES=all`, which the kubelet lets a pod set after
/// the plugin's) can use none of their memory. `serial` makes the
/// allocation's directory unique (a later pod given the same units gets a
/// directory of its own). Unknown or malformed IDs are refused.
pub fn allocate(
    ids: &[String],
    known: &[Gpu],
    cfg: &Config,
    serial: u64,
) -> Result<Allocation, String> {
    if ids.is_empty() {
        return Err("Allocate: a container request with no devices".into());
    }
    let advertised: u64 = known.iter().map(|g| units(g, cfg)).sum();
    if ids.len() as u64 > advertised {
        return Err(format!(
            "Allocate: {} device IDs for one container, more than the {advertised} units this node advertises",
            ids.len()
        ));
    }
    let mut count: BTreeMap<&str, u64> = BTreeMap::new();
    let mut seen: BTreeSet<(&str, u64)> = BTreeSet::new();
    for id in ids {
        let Some((uuid, n)) = parse_unit_id(id) else {
            return Err(format!(
                "Allocate: {} is not a vramcap unit ID (GPU-UUID::N, e.g. GPU-5ca1ab1e-0000-4000-8000-000000000000::0)",
                shown_id(id)
            ));
        };
        let Some(gpu) = known.iter().find(|g| g.uuid == uuid) else {
            return Err(format!(
                "Allocate: {} names a GPU this node does not have",
                shown_id(id)
            ));
        };
        if n >= units(gpu, cfg) || !seen.insert((uuid, n)) {
            return Err(format!(
                "Allocate: {} is not a unit this plugin advertised once",
                shown_id(id)
            ));
        }
        *count.entry(uuid).or_default() += 1;
    }
    let caps: Vec<(String, u64)> = count
        .iter()
        .map(|(u, n)| (u.to_string(), n.saturating_mul(cfg.unit)))
        .collect();
    let id = format!("{}-{serial}", ids_stem(ids));
    let keyed: Vec<String> = caps
        .iter()
        .map(|(u, b)| format!("{u}={}", size_text(*b)))
        .collect();
    // The grammar has no zero cap: one byte, in which nothing fits.
    let spec = format!("{NOT_GIVEN},{}", keyed.join(","));
    if spec.len() > 511 {
        return Err(format!(
            "Allocate: the cap of {} GPUs does not fit the operator's file's 511 characters; give containers fewer GPUs",
            caps.len()
        ));
    }
    let operator_file =
        format!("# written by vramcap device-plugin for this container's allocation\n{spec}\n");
    let uuids: Vec<&str> = caps.iter().map(|(u, _)| u.as_str()).collect();
    let mut envs = BTreeMap::new();
    envs.insert("VRAMCAP_LIMIT".to_string(), spec.clone());
    envs.insert(
        "VRAMCAP_STATS_DIR".to_string(),
        STATS_IN_CONTAINER.to_string(),
    );
    let mut cdi_devices = Vec::new();
    match cfg.device_mode {
        DeviceMode::Env => {
            envs.insert("NVIDIA_VISIBLE_DEVICES".to_string(), uuids.join(","));
        }
        DeviceMode::Cdi => {
            cdi_devices = uuids
                .iter()
                .map(|u| format!("nvidia.com/gpu={u}"))
                .collect();
        }
    }
    let dir = alloc_dir(cfg, &id);
    let text = |p: &Path| p.to_string_lossy().into_owned();
    let mounts = vec![
        (text(&cfg.library_in_container), text(&cfg.library), true),
        (
            PRELOAD_IN_CONTAINER.to_string(),
            text(&cfg.state_dir.join("ld.so.preload")),
            true,
        ),
        (
            OPERATOR_FILE_IN_CONTAINER.to_string(),
            text(&dir.join("operator-limit")),
            true,
        ),
        (
            STATS_IN_CONTAINER.to_string(),
            text(&dir.join("stats")),
            false,
        ),
    ];
    Ok(Allocation {
        id,
        caps,
        envs,
        mounts,
        cdi_devices,
        operator_file,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;
    const A: &str = "GPU-aaaaaaaa-0000-4000-8000-000000000000";
    const B: &str = "GPU-bbbbbbbb-0000-4000-8000-000000000000";

    fn cfg() -> Config {
        Config {
            unit: 256 << 20,
            reserve: G,
            library: "/var/lib/vramcap/libvramcap.so".into(),
            library_in_container: "/opt/vramcap/lib/libvramcap.so".into(),
            state_dir: "/var/lib/vramcap".into(),
            device_mode: DeviceMode::Env,
        }
    }

    fn gpus() -> Vec<Gpu> {
        vec![
            Gpu {
                uuid: A.into(),
                total: 4 * G,
            },
            Gpu {
                uuid: B.into(),
                total: 3 * G + (100 << 20),
            },
        ]
    }

    fn ids(uuid: &str, ns: std::ops::Range<u64>) -> Vec<String> {
        ns.map(|n| unit_id(uuid, n)).collect()
    }

    #[test]
    fn units_are_what_is_left_after_the_reserve_in_whole_units() {
        let c = cfg();
        let all = unit_ids(&gpus(), &c);
        // A: (4 - 1) GiB / 256 MiB = 12; B: 2 GiB + 100 MiB -> 8.
        assert_eq!(all.len(), 20);
        assert_eq!(all[0], format!("{A}::0"));
        assert_eq!(all[12], format!("{B}::0"));
        assert_eq!(parse_unit_id(&all[19]), Some((B, 7)));
        assert_eq!(parse_unit_id("GPU-x"), None);
        assert_eq!(parse_unit_id("::3"), None);
        assert_eq!(parse_unit_id("GPU-x::y"), None);
    }

    #[test]
    fn a_request_stays_on_the_fullest_gpu_that_fits() {
        let mut avail = ids(A, 0..12);
        avail.extend(ids(B, 0..8));
        // 6 fit on both: B has fewer free units.
        assert_eq!(preferred(&avail, &[], 6), ids(B, 0..6));
        // 10 fit only on A.
        assert_eq!(preferred(&avail, &[], 10), ids(A, 0..10));
        // must-include on A keeps the request on A.
        let must = vec![unit_id(A, 5)];
        let got = preferred(&avail, &must, 3);
        assert_eq!(got, vec![unit_id(A, 0), unit_id(A, 1), unit_id(A, 5)]);
        // 15 fit on no GPU: A's 12 (most free first), then 3 of B.
        let got = preferred(&avail, &[], 15);
        let mut want = ids(A, 0..12);
        want.extend(ids(B, 0..3));
        assert_eq!(got, want);
    }

    #[test]
    fn allocate_caps_each_gpu_at_its_units() {
        let c = cfg();
        let mut req = ids(A, 0..4);
        req.push(unit_id(B, 2));
        let a = allocate(&req, &gpus(), &c, 7).unwrap();
        assert_eq!(a.caps, vec![(A.to_string(), G), (B.to_string(), 256 << 20)]);
        assert_eq!(
            a.envs["VRAMCAP_LIMIT"],
            format!("1B,{A}=1024MiB,{B}=256MiB")
        );
        assert_eq!(a.envs["NVIDIA_VISIBLE_DEVICES"], format!("{A},{B}"));
        assert_eq!(a.envs["VRAMCAP_STATS_DIR"], "/run/vramcap/stats");
        assert_eq!(
            a.operator_file.lines().last().unwrap(),
            format!("1B,{A}=1024MiB,{B}=256MiB")
        );
        assert!(a.id.ends_with("-7"), "{}", a.id);
        let dir = format!("/var/lib/vramcap/alloc/{}", a.id);
        assert_eq!(
            a.mounts,
            vec![
                (
                    "/opt/vramcap/lib/libvramcap.so".into(),
                    "/var/lib/vramcap/libvramcap.so".into(),
                    true
                ),
                (
                    "/etc/ld.so.preload".into(),
                    "/var/lib/vramcap/ld.so.preload".into(),
                    true
                ),
                (
                    "/run/vramcap/operator-limit".into(),
                    format!("{dir}/operator-limit"),
                    true
                ),
                ("/run/vramcap/stats".into(), format!("{dir}/stats"), false),
            ]
        );
        // The same IDs in another order, another call: another directory
        // with the same stem.
        req.reverse();
        let again = allocate(&req, &gpus(), &c, 8).unwrap().id;
        assert_eq!(again.split('-').next(), a.id.split('-').next());
        assert_ne!(again, a.id);
        // CDI names instead of the runtime's variable.
        let cdi = Config {
            device_mode: DeviceMode::Cdi,
            ..cfg()
        };
        let a = allocate(&req, &gpus(), &cdi, 9).unwrap();
        assert!(!a.envs.contains_key("NVIDIA_VISIBLE_DEVICES"));
        assert_eq!(
            a.cdi_devices,
            vec![format!("nvidia.com/gpu={A}"), format!("nvidia.com/gpu={B}")]
        );
    }

    #[test]
    fn ended_allocations_are_those_the_kubelet_no_longer_has() {
        let a = ids_stem(&ids(A, 0..4));
        let b = ids_stem(&ids(B, 0..2));
        let names: Vec<String> = vec![
            format!("{a}-100"),
            format!("{a}-250"),
            format!("{b}-120"),
            "lost+found".into(),
            "notahex0notahex0-5".into(),
        ];
        let live: BTreeSet<String> = [a.clone()].into();
        assert_eq!(
            ended(&names, &live),
            vec![format!("{a}-100"), format!("{b}-120")]
        );
        assert_eq!(ended(&names, &BTreeSet::new()).len(), 3);
    }

    #[test]
    fn allocate_refuses_what_it_never_advertised() {
        let c = cfg();
        for (bad, why) in [
            (vec![], "no devices"),
            (vec!["nvidia0".to_string()], "is not a vramcap unit ID"),
            (
                vec![unit_id("GPU-none", 0)],
                "names a GPU this node does not have",
            ),
            (vec![unit_id(A, 12)], "advertised once"),
            (vec![unit_id(A, 1), unit_id(A, 1)], "advertised once"),
            (vec![format!("{A}::07")], "is not a vramcap unit ID"),
            (vec![format!("{A}::+7")], "is not a vramcap unit ID"),
            (vec![unit_id(A, 1); 100], "more than the"),
        ] {
            let e = allocate(&bad, &gpus(), &c, 0).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }

    /// A refusal is one short line, whatever the ID holds.
    #[test]
    fn refusals_show_an_id_cut_and_escaped() {
        let long = format!("{A}::0{}", "9".repeat(1 << 20));
        let e = allocate(&[long], &gpus(), &cfg(), 0).unwrap_err();
        assert_eq!(
            e,
            format!(
                "Allocate: \"{A}::0999999999999999999999\"… (1048619 characters) is not a vramcap unit ID (GPU-UUID::N, e.g. GPU-5ca1ab1e-0000-4000-8000-000000000000::0)"
            )
        );
        let e = allocate(&["a\nb\u{1b}[2J::0".to_string()], &gpus(), &cfg(), 0).unwrap_err();
        assert_eq!(
            e,
            "Allocate: \"a\\nb\\u{1b}[2J::0\" names a GPU this node does not have"
        );
    }
}
