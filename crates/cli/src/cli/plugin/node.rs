//! The node's GPUs and their health: one thread owns NVML, lists the GPUs
//! once and then publishes every change of health on a `watch` channel.

use tokio::sync::watch;

use super::layout::{self, Gpu};
use super::{Args, log};

/// Xid errors of the program, not of the GPU (NVIDIA's device plugin
/// skips the same ones): a GPU that reports one stays healthy.
pub const APPLICATION_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// The node's GPUs and their health, as the gRPC side sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Node {
    pub(super) gpus: Vec<Gpu>,
    pub(super) healthy: Vec<bool>,
}

/// The node's GPUs as NVML lists them (all, or those of `--gpu`).
fn list_gpus(
    inventory: &crate::cli::machine::Inventory,
    only: Option<&[String]>,
) -> Result<Vec<Gpu>, String> {
    let all = inventory
        .gpus()
        .ok_or("NVML cannot count the GPUs of this node")?;
    let mut listed = Vec::new();
    for g in all {
        match g {
            Ok(x) => listed.push(x),
            Err(why) => log(format_args!("{why}: not advertised")),
        }
    }
    let gpus: Vec<Gpu> = match only {
        None => listed
            .into_iter()
            .map(|(uuid, total)| Gpu { uuid, total })
            .collect(),
        Some(only) => {
            let mut out = Vec::new();
            for u in only {
                let Some((uuid, total)) = listed.iter().find(|(x, _)| x == u).cloned() else {
                    return Err(format!(
                        "--gpu {u}: NVML lists no such GPU (it lists {})",
                        listed
                            .iter()
                            .map(|(x, _)| x.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ));
                };
                out.push(Gpu { uuid, total });
            }
            out
        }
    };
    if gpus.is_empty() {
        return Err(
            "NVML lists no GPU this plugin can serve on this node: nothing to advertise".into(),
        );
    }
    let mut seen = std::collections::BTreeSet::new();
    if let Some(g) = gpus.iter().find(|g| !seen.insert(g.uuid.clone())) {
        return Err(format!("--gpu {}: given twice", g.uuid));
    }
    Ok(gpus)
}

/// The NVML thread (NVML's handles stay on it): the node's GPUs, then
/// their health every interval.
pub(super) fn watch_health(args: &Args) -> Result<watch::Receiver<Node>, String> {
    let (first_tx, first_rx) = std::sync::mpsc::channel::<Result<watch::Receiver<Node>, String>>();
    let only = args.only.clone();
    let interval = args.health_interval;
    let config = args.config.clone();
    std::thread::Builder::new()
        .name("nvml-health".into())
        .spawn(move || {
            let Some(inventory) = crate::cli::machine::Inventory::open() else {
                let _ = first_tx.send(Err(
                    "NVML (libnvidia-ml.so.1) cannot be loaded or started: the plugin needs it to list the GPUs".into(),
                ));
                return;
            };
            let gpus = match list_gpus(&inventory, only.as_deref()) {
                Ok(g) => g,
                Err(e) => {
                    let _ = first_tx.send(Err(e));
                    return;
                }
            };
            for g in &gpus {
                log(format_args!(
                    "{}: {} bytes, {} units of {} bytes",
                    g.uuid,
                    g.total,
                    layout::units(g, &config),
                    config.unit
                ));
            }
            let uuids: Vec<String> = gpus.iter().map(|g| g.uuid.clone()).collect();
            let xids = inventory.xid_watch(&uuids);
            if xids.is_none() {
                log("NVML gives no Xid events here: a GPU is unhealthy only when NVML no longer answers for it");
            }
            let mut failed = vec![false; gpus.len()];
            let mut last = Node {
                healthy: vec![true; gpus.len()],
                gpus,
            };
            let (tx, rx) = watch::channel(last.clone());
            if first_tx.send(Ok(rx)).is_err() {
                return;
            }
            let ms = u32::try_from(interval.as_millis()).unwrap_or(u32::MAX).max(1);
            loop {
                match &xids {
                    Some(w) => {
                        if let Some((i, xid)) = inventory.wait_xid(w, ms) {
                            if APPLICATION_XIDS.contains(&xid) {
                                log(format_args!(
                                    "{}: Xid {xid} (an application's error): still healthy",
                                    last.gpus[i].uuid
                                ));
                            } else if !failed[i] {
                                failed[i] = true;
                                log(format_args!(
                                    "{}: Xid {xid}: unhealthy until the plugin restarts",
                                    last.gpus[i].uuid
                                ));
                            }
                        }
                    }
                    None => std::thread::sleep(interval),
                }
                let healthy: Vec<bool> = last
                    .gpus
                    .iter()
                    .zip(&failed)
                    .map(|(g, &f)| !f && inventory.memory(&g.uuid).is_some())
                    .collect();
                if healthy == last.healthy {
                    continue;
                }
                for (g, (&was, &now)) in last.gpus.iter().zip(last.healthy.iter().zip(&healthy)) {
                    if was != now {
                        log(format_args!(
                            "{}: {}",
                            g.uuid,
                            if now {
                                "healthy again"
                            } else {
                                "unhealthy: NVML no longer answers for it"
                            }
                        ));
                    }
                }
                last.healthy = healthy;
                if tx.send(last.clone()).is_err() {
                    return;
                }
            }
        })
        .map_err(|e| format!("cannot start the health thread: {e}"))?;
    first_rx
        .recv()
        .map_err(|_| "the health thread ended before listing the GPUs".to_string())?
}
