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
mod node;
mod service;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Endpoint, Server, Uri};

use self::layout::Config;
use self::node::{Node, watch_health};
use self::service::{Plugin, options};

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

use api::device_plugin_server::DevicePluginServer;
use api::registration_client::RegistrationClient;

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

fn log(text: impl std::fmt::Display) {
    eprintln!("vramcap device-plugin: {text}");
}

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
