//! `vramcap device-plugin`: a kubelet device plugin (API `v1beta1`) that
//! advertises GPU memory as `vramcap.io/gpu-memory`, one device per unit of
//! each GPU, and answers `Allocate` with the cap, the GPU, the shim and the
//! mounts that make the cap unavoidable in the container. The design and
//! its reasons are in docs/device-plugin.md; the answers are `layout`.
//!
//! # How it runs
//! - One thread owns NVML: it lists the GPUs at start and then asks each
//!   by UUID every `--health-interval`; a GPU NVML no longer finds or
//!   cannot read is `Unhealthy`, and `Healthy` again when it answers. It
//!   waits for Xid errors meanwhile (NVML's event set): a GPU that reports
//!   one that is not the program's (`APPLICATION_XIDS`) is `Unhealthy`
//!   until the plugin restarts, as with NVIDIA's plugin. The
//!   list goes to the gRPC side through a `watch` channel, which every
//!   `ListAndWatch` stream follows.
//! - The gRPC side is a tokio runtime: the `DevicePlugin` service on
//!   `--plugin-dir`/`--socket`, and a client of `Registration` on the
//!   kubelet's socket there. After registering, the plugin watches the
//!   kubelet's socket (its inode, every 500 ms) and its own: when the kubelet
//!   restarts (its socket is made anew, and the kubelet removes the
//!   plugins' sockets) the plugin stops its server, makes its socket again
//!   and registers again; a failed registration is retried every second.
//! - `Allocate` writes, per container, `alloc/<id>/operator-limit` (the
//!   cap, which the shim prefers to any variable and which only lowers)
//!   and makes `alloc/<id>/stats` under `--state-dir`, before answering.
//!   `ld.so.preload` there names the shim's path in the container.
//! - SIGTERM or SIGINT ends it: the server stops and its socket goes.

pub mod layout;

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tokio_stream::Stream;
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tonic::transport::{Endpoint, Server, Uri};
use tonic::{Request, Response, Status};

use self::layout::{Config, Gpu};

#[allow(clippy::all, clippy::pedantic, missing_docs, unreachable_pub)]
pub mod api {
    tonic::include_proto!("v1beta1");
}

/// The kubelet's PodResources API (a client only).
#[allow(
    clippy::all,
    clippy::pedantic,
    missing_docs,
    unreachable_pub,
    dead_code
)]
pub mod podresources {
    tonic::include_proto!("v1");
}

use api::device_plugin_server::{DevicePlugin, DevicePluginServer};
use api::registration_client::RegistrationClient;

/// Xid errors of the program, not of the GPU (NVIDIA's device plugin
/// skips the same ones): a GPU that reports one stays healthy.
pub const APPLICATION_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// The API version the plugin speaks.
pub const VERSION: &str = "v1beta1";
pub const HEALTHY: &str = "Healthy";
pub const UNHEALTHY: &str = "Unhealthy";

/// What `vramcap device-plugin` was asked to do.
#[derive(Debug, Clone)]
pub struct Args {
    pub plugin_dir: PathBuf,
    pub socket: String,
    pub resource: String,
    pub health_interval: Duration,
    pub config: Config,
    /// Instead of NVML's list: the GPUs of this node (UUID, bytes), for
    /// nodes whose NVML lists more than the plugin may advertise. Health
    /// still comes from NVML.
    pub only: Option<Vec<String>>,
    /// The kubelet's PodResources socket, asked every `sweep_interval`
    /// which allocations are still there; directories of ended ones older
    /// than `sweep_grace` are removed.
    pub pod_resources: PathBuf,
    pub sweep_interval: Duration,
    pub sweep_grace: Duration,
}

/// The node's GPUs and their health, as the gRPC side sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Node {
    gpus: Vec<Gpu>,
    healthy: Vec<bool>,
}

fn log(text: impl std::fmt::Display) {
    eprintln!("vramcap device-plugin: {text}");
}

struct Plugin {
    config: Config,
    node: watch::Receiver<Node>,
    /// Allocations answered (each gets a directory of its own), over
    /// every server this run made.
    serial: Arc<std::sync::atomic::AtomicU64>,
    /// Set when the server stops: every `ListAndWatch` stream ends then,
    /// so that the server's shutdown does not wait for the kubelet.
    stop: watch::Receiver<bool>,
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

/// Writes `text` to `path` through a temporary file and a rename, mode 0644.
fn write_file(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    let tmp = path.with_file_name(name);
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

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

fn options() -> api::DevicePluginOptions {
    api::DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

/// A gRPC channel over the Unix socket `path`.
async fn unix_channel(path: &Path) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    // The URI is not used: every connection is to the socket.
    Endpoint::from_static("http://[::]:0")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let p = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(p).await?)) }
        }))
        .await
}

/// One sweep: the stems of the allocations the kubelet still has, then
/// the directories of the others (older than the grace) removed.
async fn sweep(args: &Args) -> Result<usize, String> {
    use podresources::pod_resources_lister_client::PodResourcesListerClient;
    let channel = unix_channel(&args.pod_resources).await.map_err(|e| {
        format!(
            "cannot reach the kubelet's PodResources API at {}: {e}",
            args.pod_resources.display()
        )
    })?;
    let list = PodResourcesListerClient::new(channel)
        .list(podresources::ListPodResourcesRequest {})
        .await
        .map_err(|s| {
            format!(
                "the kubelet's PodResources API refused List: {}",
                s.message()
            )
        })?
        .into_inner();
    let live: std::collections::BTreeSet<String> = list
        .pod_resources
        .iter()
        .flat_map(|p| &p.containers)
        .flat_map(|c| &c.devices)
        .filter(|d| d.resource_name == args.resource)
        .map(|d| layout::ids_stem(&d.device_ids))
        .collect();
    let dir = args.config.state_dir.join("alloc");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(0);
    };
    let names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir() && !t.is_symlink()))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    let mut removed = 0;
    for name in layout::ended(&names, &live) {
        let path = dir.join(&name);
        let old = std::fs::metadata(&path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= args.sweep_grace);
        if old && std::fs::remove_dir_all(&path).is_ok() {
            removed += 1;
        }
    }
    Ok(removed)
}

/// Sweeps every interval; says once when the API cannot be reached.
async fn sweeper(args: Args) {
    let mut said = false;
    loop {
        tokio::time::sleep(args.sweep_interval).await;
        match sweep(&args).await {
            Ok(0) => {}
            Ok(n) => log(format_args!(
                "removed the directories of {n} allocations that ended"
            )),
            Err(e) if !said => {
                said = true;
                log(format_args!(
                    "{e}; allocation directories are kept until it answers"
                ));
            }
            Err(_) => {}
        }
    }
}

/// `Registration.Register` with the kubelet at `kubelet`.
async fn register(kubelet: &Path, args: &Args) -> Result<(), String> {
    let channel = unix_channel(kubelet)
        .await
        .map_err(|e| format!("cannot reach the kubelet at {}: {e}", kubelet.display()))?;
    RegistrationClient::new(channel)
        .register(api::RegisterRequest {
            version: VERSION.to_string(),
            endpoint: args.socket.clone(),
            resource_name: args.resource.clone(),
            options: Some(options()),
        })
        .await
        .map_err(|s| format!("the kubelet refused the registration: {}", s.message()))?;
    Ok(())
}

/// (device, inode) of a path, `None` when it is not there.
fn identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
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
fn watch_health(args: &Args) -> Result<watch::Receiver<Node>, String> {
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

/// The most units one node may advertise: a `ListAndWatch` message must
/// stay well under gRPC's 4 MiB default (a device is some 70 bytes).
pub const MAX_UNITS: u64 = 32_768;

/// Runs the plugin until SIGTERM or SIGINT; the exit status.
pub fn run(args: Args) -> Result<u8, String> {
    std::fs::create_dir_all(&args.config.state_dir).map_err(|e| {
        format!(
            "--state-dir {}: cannot make it: {e}",
            args.config.state_dir.display()
        )
    })?;
    // One plugin per node: a second would take the socket from the first.
    let lock_path = args.config.state_dir.join("device-plugin.lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| format!("cannot open {}: {e}", lock_path.display()))?;
    // SAFETY: a descriptor we own; flock has no other preconditions.
    if unsafe {
        libc::flock(
            std::os::fd::AsRawFd::as_raw_fd(&lock),
            libc::LOCK_EX | libc::LOCK_NB,
        )
    } != 0
    {
        return Err(format!(
            "another vramcap device-plugin runs with --state-dir {} (it holds {}); only one may run on a node",
            args.config.state_dir.display(),
            lock_path.display()
        ));
    }
    let node = watch_health(&args)?;
    let total: u64 = node
        .borrow()
        .gpus
        .iter()
        .map(|g| layout::units(g, &args.config))
        .sum();
    if total > MAX_UNITS {
        return Err(format!(
            "--unit {} makes {total} units on this node, more than the {MAX_UNITS} a device list may carry; give a larger unit, e.g. --unit 256MiB",
            args.config.unit
        ));
    }
    let preload = args.config.state_dir.join("ld.so.preload");
    write_file(
        &preload,
        &format!("{}\n", args.config.library_in_container.display()),
    )
    .map_err(|e| format!("cannot write {}: {e}", preload.display()))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the gRPC runtime: {e}"))?;
    let out = rt.block_on(serve(args, node));
    drop(lock);
    out
}

/// How long a stopping server may take to close its connections.
const SHUTDOWN: Duration = Duration::from_secs(2);
/// How long a registration may take.
const REGISTER: Duration = Duration::from_secs(5);

/// A running server: how to stop it.
struct Running {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Running {
    /// Ends every stream, gives the server `SHUTDOWN` to close, then aborts it.
    async fn stop(self) {
        let _ = self.stop.send(true);
        let mut task = self.task;
        if tokio::time::timeout(SHUTDOWN, &mut task).await.is_err() {
            task.abort();
            let _ = task.await;
        }
    }
}

enum Wake {
    Signal,
    Restart,
}

async fn serve(args: Args, node: watch::Receiver<Node>) -> Result<u8, String> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    let kubelet = args.plugin_dir.join("kubelet.sock");
    let socket = args.plugin_dir.join(&args.socket);
    let serial = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sweeping = tokio::spawn(sweeper(args.clone()));
    let out = serve_loop(&args, node, &mut term, &mut int, &kubelet, &socket, serial).await;
    sweeping.abort();
    out
}

async fn serve_loop(
    args: &Args,
    node: watch::Receiver<Node>,
    term: &mut tokio::signal::unix::Signal,
    int: &mut tokio::signal::unix::Signal,
    kubelet: &Path,
    socket: &Path,
    serial: Arc<std::sync::atomic::AtomicU64>,
) -> Result<u8, String> {
    loop {
        let _ = std::fs::remove_file(socket);
        let listener = UnixListener::bind(socket)
            .map_err(|e| format!("cannot listen on {}: {e}", socket.display()))?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let plugin = Plugin {
            config: args.config.clone(),
            node: node.clone(),
            serial: serial.clone(),
            stop: stop_rx.clone(),
        };
        let mut stopped = stop_rx;
        let task = tokio::spawn(
            Server::builder()
                .add_service(DevicePluginServer::new(plugin))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                    let _ = stopped.wait_for(|s| *s).await;
                }),
        );
        let running = Running {
            stop: stop_tx,
            task,
        };
        log(format_args!(
            "serving {} on {}",
            args.resource,
            socket.display()
        ));
        let mine = identity(socket);
        // Register (again every second until the kubelet takes it); the
        // kubelet's socket as it was before the call, so that a restart
        // during it is seen.
        let mut attempts = 0u64;
        let registered = loop {
            let before = identity(kubelet);
            attempts += 1;
            // The first failure and then one a minute: a node without a
            // kubelet yet is not worth a line a second.
            let say = attempts == 1 || attempts.is_multiple_of(60);
            let wake = tokio::select! {
                r = tokio::time::timeout(REGISTER, register(kubelet, args)) => match r {
                    Ok(Ok(())) => break before,
                    Ok(Err(e)) => { if say { log(format_args!("{e}; trying again every second")) } None }
                    Err(_) => { if say { log(format_args!("the kubelet did not answer the registration within {REGISTER:?}; trying again every second")) } None }
                },
                _ = term.recv() => Some(Wake::Signal),
                _ = int.recv() => Some(Wake::Signal),
            };
            if wake.is_some() {
                return stop_and_exit(running, socket).await;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = term.recv() => return stop_and_exit(running, socket).await,
                _ = int.recv() => return stop_and_exit(running, socket).await,
            }
        };
        log(format_args!(
            "registered with the kubelet at {}",
            kubelet.display()
        ));
        // Watch for a kubelet restart: its socket made anew, or ours gone.
        let wake = loop {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                _ = term.recv() => break Wake::Signal,
                _ = int.recv() => break Wake::Signal,
            }
            let now = identity(kubelet);
            if now.is_some() && now != registered || identity(socket) != mine {
                break Wake::Restart;
            }
        };
        if let Wake::Signal = wake {
            return stop_and_exit(running, socket).await;
        }
        log("the kubelet restarted: serving and registering again");
        running.stop().await;
    }
}

async fn stop_and_exit(running: Running, socket: &Path) -> Result<u8, String> {
    running.stop().await;
    let _ = std::fs::remove_file(socket);
    log("stopped");
    Ok(0)
}
