//! The `DevicePlugin` gRPC service: `ListAndWatch` follows the node's
//! health, and `Allocate` makes each container's directory before it answers.

use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::watch;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::api::device_plugin_server::DevicePlugin;
use super::layout::{self, Config, Gpu};
use super::node::Node;
use super::{HEALTHY, UNHEALTHY, api, log, write_file};

pub(super) struct Plugin {
    pub(super) config: Config,
    pub(super) node: watch::Receiver<Node>,
    /// Allocations answered (each gets a directory of its own), over
    /// every server this run made.
    pub(super) serial: Arc<std::sync::atomic::AtomicU64>,
    /// Set when the server stops: every `ListAndWatch` stream ends then,
    /// so that the server's shutdown does not wait for the kubelet.
    pub(super) stop: watch::Receiver<bool>,
}

impl Plugin {
    /// What `ListAndWatch` sends for a state of the node.
    fn view(config: &Config) -> impl Fn(&Node) -> api::ListAndWatchResponse + use<> {
        let config = config.clone();
        move |node| api::ListAndWatchResponse {
            devices: node
                .gpus
                .iter()
                .zip(&node.healthy)
                .flat_map(|(g, &ok)| {
                    (0..layout::units(g, &config)).map(move |n| api::Device {
                        id: layout::unit_id(&g.uuid, n),
                        health: if ok { HEALTHY } else { UNHEALTHY }.to_string(),
                        topology: None,
                    })
                })
                .collect(),
        }
    }
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<api::ListAndWatchResponse, Status>> + Send>>;

/// Makes the allocation's directory: its operator's cap file and its
/// statistics directory (writable by the container's user, whoever it is;
/// no other container has it mounted).
fn prepare(config: &Config, a: &layout::Allocation) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let dir = layout::alloc_dir(config, &a.id);
    std::fs::create_dir_all(&dir)?;
    // Root's alone: the runtime mounts what is inside by path, and no user
    // of the node needs to reach another container's statistics.
    if let Some(parent) = dir.parent() {
        std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o700))?;
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    write_file(&dir.join("operator-limit"), &a.operator_file)?;
    let stats = dir.join("stats");
    std::fs::create_dir_all(&stats)?;
    std::fs::set_permissions(&stats, std::fs::Permissions::from_mode(0o1777))
}

#[tonic::async_trait]
impl DevicePlugin for Plugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let mut node = self.node.clone();
        let mut stop = self.stop.clone();
        let config = self.config.clone();
        tokio::spawn(async move {
            let view = Plugin::view(&config);
            loop {
                let list = view(&node.borrow_and_update());
                if tx.send(Ok(list)).await.is_err() {
                    return; // the kubelet went away
                }
                tokio::select! {
                    changed = node.changed() => if changed.is_err() { return },
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        let container_responses = request
            .into_inner()
            .container_requests
            .iter()
            .map(|r| api::ContainerPreferredAllocationResponse {
                device_i_ds: layout::preferred(
                    &r.available_device_i_ds,
                    &r.must_include_device_i_ds,
                    usize::try_from(r.allocation_size).unwrap_or(0),
                ),
            })
            .collect();
        Ok(Response::new(api::PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let requests = request.into_inner().container_requests;
        if requests.len() > MAX_CONTAINERS {
            let e = format!(
                "Allocate: {} container requests in one call, more than {MAX_CONTAINERS} (the kubelet asks for one container at a time)",
                requests.len()
            );
            log(&e);
            return Err(Status::invalid_argument(e));
        }
        let gpus = self.node.borrow().gpus.clone();
        let config = self.config.clone();
        let serial = self.serial.clone();
        // The directories are written (and synced) off the runtime's
        // threads, which keep answering meanwhile.
        tokio::task::spawn_blocking(move || allocate_all(requests, &gpus, &config, &serial))
            .await
            .map_err(|e| Status::internal(format!("Allocate: {e}")))?
            .map(Response::new)
    }

    async fn pre_start_container(
        &self,
        _: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}

/// The most container requests one `Allocate` may carry (the kubelet
/// sends one).
pub const MAX_CONTAINERS: usize = 64;

/// `Allocate`'s answer: each container's allocation checked, its
/// directory made, its response.
fn allocate_all(
    requests: Vec<api::ContainerAllocateRequest>,
    gpus: &[Gpu],
    config: &Config,
    serial: &std::sync::atomic::AtomicU64,
) -> Result<api::AllocateResponse, Status> {
    let mut container_responses = Vec::new();
    for r in requests {
        let serial = serial.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        // Unique across restarts of the plugin too: the time, then the count.
        let unique = stamp.saturating_mul(1_000_000).saturating_add(serial);
        let a = layout::allocate(&r.devices_ids, gpus, config, unique).map_err(|e| {
            log(&e);
            Status::invalid_argument(e)
        })?;
        prepare(config, &a).map_err(|e| {
            let e = format!(
                "Allocate: cannot write {}: {e}",
                layout::alloc_dir(config, &a.id).display()
            );
            log(&e);
            Status::internal(e)
        })?;
        log(format_args!(
            "allocated {} units: {}",
            r.devices_ids.len(),
            a.envs["VRAMCAP_LIMIT"]
        ));
        container_responses.push(api::ContainerAllocateResponse {
            envs: a.envs.into_iter().collect(),
            mounts: a
                .mounts
                .into_iter()
                .map(|(container_path, host_path, read_only)| api::Mount {
                    container_path,
                    host_path,
                    read_only,
                })
                .collect(),
            devices: Vec::new(),
            annotations: Default::default(),
            cdi_devices: a
                .cdi_devices
                .into_iter()
                .map(|name| api::CdiDevice { name })
                .collect(),
        });
    }
    Ok(api::AllocateResponse {
        container_responses,
    })
}

pub(super) fn options() -> api::DevicePluginOptions {
    api::DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}
