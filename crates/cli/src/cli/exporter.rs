//! `vramcap exporter`: the statistics pages as Prometheus metrics over HTTP.
//!
//! `vramcap exporter [--listen ADDRESS:PORT]` (default `127.0.0.1:9400`;
//! `:PORT` means every IPv4 interface, port 0 picks a free port) prints one
//! line, `vramcap exporter listening on http://ADDRESS:PORT/metrics`, on
//! stderr once it listens, then serves until killed:
//!
//! - `GET /metrics` (or `HEAD`): the metrics below, in the text exposition
//!   format 0.0.4 (`Content-Type: text/plain; version=0.0.4; charset=utf-8`);
//!   500 when the statistics directory cannot be read;
//! - `GET /`: a short page linking `/metrics`;
//! - any other path: 404; another method on these paths: 405; a malformed
//!   request: 400 (431 when its head passes 8 KiB, 408 when it takes more
//!   than 10 s to arrive). One request per connection (`Connection: close`).
//!
//! Every scrape reads the pages afresh, exactly as `vramcap stat` does (same
//! directory, `VRAMCAP_STATS_DIR` or the default; pages of dead processes are
//! removed). A process that ended since the last scrape is simply absent.
//!
//! Per process and GPU (one sample per process and GPU it has used):
//!
//! | metric | type | value |
//! |---|---|---|
//! | `vramcap_gpu_memory_limit_bytes` | gauge | the cap; no sample for a GPU without one |
//! | `vramcap_gpu_memory_used_bytes` | gauge | bytes held as the cap counts them (cached blocks included) |
//! | `vramcap_gpu_memory_peak_bytes` | gauge | highest `used` so far |
//! | `vramcap_gpu_memory_cached_bytes` | gauge | bytes in freed blocks kept for reuse |
//! | `vramcap_gpu_memory_spilled_bytes` | gauge | bytes placed in host memory past the cap |
//! | `vramcap_allocations_total` | counter | allocations that succeeded (cache hits and spills included) |
//! | `vramcap_frees_total` | counter | frees |
//! | `vramcap_refusals_total` | counter | allocations refused because of the cap |
//! | `vramcap_cache_hits_total` | counter | allocations served from the cache |
//! | `vramcap_cache_misses_total` | counter | allocations the cache could not serve |
//! | `vramcap_cache_evictions_total` | counter | cached blocks given back to the driver (bound or idle time) |
//! | `vramcap_spill_allocations_total` | counter | allocations placed in host memory |
//!
//! with the labels
//!
//! - `gpu`: the device index as the process sees it (after
//!   `CUDA_VISIBLE_DEVICES`);
//! - `UUID`: the GPU's UUID (`GPU-…`), the label name dcgm-exporter uses, so
//!   queries can join on it; empty when unknown;
//! - `pid`; `command`: the command line, cut to its first 128 characters;
//! - `group`: the process's `VRAMCAP_GROUP`, empty when none;
//! - `dir`: the directory the page was read from. With one directory per
//!   container (`--dir PARENT/*`) it tells containers apart: their PIDs may
//!   be equal, and it is the one identity a process cannot choose;
//! - `pod`, `namespace`, `container`: only when the process's environment
//!   held them when its page was made (the shim records them in the page,
//!   which is right from any PID namespace); the variables are `POD_NAME`
//!   (or else `KUBERNETES_POD_NAME`), `POD_NAMESPACE` and `CONTAINER_NAME`
//!   respectively, non-empty — the names a Kubernetes Downward API `env`
//!   block would set.
//!
//! Per group and GPU, labels `group`, `UUID` and `dir` (groups of the same
//! name in two directories are two groups):
//! `vramcap_group_memory_limit_bytes` (gauge; no sample without a cap),
//! `vramcap_group_memory_used_bytes` (gauge) and `vramcap_group_members`
//! (gauge: the group's live processes, the same on each of its GPUs; a group
//! that has no GPU yet has one sample with `UUID=""`).
//!
//! And `vramcap_pages_skipped` (gauge, no labels): files in the directory that
//! look like pages or group files but could not be read (foreign, corrupt or
//! of another layout version); `vramcap stat` names them.
//!
//! Label values are escaped as the format requires (`\\`, `\"`, `\n`).

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::read::{GroupSnapshot, Reading};
use vramcap_core::counters::{COUNTERS, SlotSnapshot};
use vramcap_core::page::{PageSnapshot, uuid_text};

use super::stat::Sources;

pub const DEFAULT_LISTEN: &str = "127.0.0.1:9400";

/// The most bytes a request line and its headers may take.
const MAX_HEAD: usize = 8192;
/// How long a client has to send its request head.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once; more are answered 503.
const MAX_CONNECTIONS: usize = 64;
/// What is read (and dropped) after the answer, so closing never resets it.
const MAX_DRAIN: usize = 1 << 20;
const DRAIN_TIMEOUT: Duration = Duration::from_secs(1);
const COMMAND_CHARS: usize = 128;
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The addresses `--listen` names: `IP:PORT`, `[IPv6]:PORT`, `HOST:PORT` or
/// `:PORT` (every IPv4 interface).
pub fn parse_listen(text: &str) -> Result<Vec<SocketAddr>, String> {
    let invalid = |why: &str| {
        format!(
            "--listen \"{text}\" is not valid: {why}expected ADDRESS:PORT, e.g. {DEFAULT_LISTEN}"
        )
    };
    if let Ok(a) = text.parse::<SocketAddr>() {
        return Ok(vec![a]);
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(invalid(""));
    };
    let Ok(port) = port.parse::<u16>() else {
        return Err(invalid(""));
    };
    if port.to_string() != port_text(text) {
        return Err(invalid("")); // "+80", "080"
    }
    if host.is_empty() {
        return Ok(vec![SocketAddr::from(([0, 0, 0, 0], port))]);
    }
    let name_like = host
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if !name_like {
        return Err(invalid(""));
    }
    match (host, port).to_socket_addrs() {
        Ok(addrs) => {
            let addrs: Vec<SocketAddr> = addrs.collect();
            if addrs.is_empty() {
                Err(invalid(&format!("\"{host}\" has no address; ")))
            } else {
                Ok(addrs)
            }
        }
        Err(e) => Err(invalid(&format!("cannot resolve \"{host}\" ({e}); "))),
    }
}

fn port_text(text: &str) -> &str {
    text.rsplit_once(':').map_or("", |(_, p)| p)
}

/// An I/O error's text without Rust's " (os error N)" suffix.
fn error_text(e: &io::Error) -> String {
    let s = e.to_string();
    match s.rfind(" (os error ") {
        Some(i) if s.ends_with(')') => s[..i].to_string(),
        _ => s,
    }
}

/// Binds `listen` and serves until killed. `Err` (exit 2) when `listen` is
/// not an address or cannot be bound.
pub fn run(listen: &str, sources: Sources) -> Result<u8, String> {
    let addrs = parse_listen(listen)?;
    let mut last = None;
    let mut bound = None;
    for a in &addrs {
        match TcpListener::bind(a) {
            Ok(l) => {
                bound = Some(l);
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let listener = bound.ok_or_else(|| {
        let why = last.map_or_else(|| "no address".to_string(), |e| error_text(&e));
        format!("cannot listen on {listen}: {why}")
    })?;
    let local = listener
        .local_addr()
        .map_err(|e| format!("cannot listen on {listen}: {}", error_text(&e)))?;
    for w in sources.warnings() {
        eprintln!("{w}");
    }
    eprintln!("vramcap exporter listening on http://{local}/metrics");
    serve(
        listener,
        Arc::new(Exporter {
            sources,
            scrape_lock: Mutex::new(None),
        }),
    )
}

struct Exporter {
    sources: Sources,
    /// Serialises scrapes; holds the last error reported, so a lasting
    /// problem is printed once.
    scrape_lock: Mutex<Option<String>>,
}

/// Counts a connection until dropped.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

fn serve(listener: TcpListener, ex: Arc<Exporter>) -> ! {
    let active = Arc::new(AtomicUsize::new(0));
    let mut accept_error: Option<String> = None;
    loop {
        let mut stream = match listener.accept() {
            Ok((s, _)) => {
                accept_error = None;
                s
            }
            Err(e) => {
                if !matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                ) {
                    // Out of descriptors or memory: say so once, retry soon.
                    let text = error_text(&e);
                    if accept_error.as_deref() != Some(text.as_str()) {
                        eprintln!("vramcap: exporter: cannot accept a connection: {text}");
                        accept_error = Some(text);
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                continue;
            }
        };
        if active.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
            let _slot = Slot(active.clone());
            let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
            let _ = stream.write_all(&response(
                503,
                "text/plain; charset=utf-8",
                &[],
                b"too many connections\n",
                false,
            ));
            continue;
        }
        let slot = Slot(active.clone());
        let ex = ex.clone();
        // A thread that cannot start drops the closure, its slot and stream.
        let _ = std::thread::Builder::new()
            .name("vramcap-http".into())
            .spawn(move || {
                let _slot = slot;
                handle(stream, &ex);
            });
    }
}

fn handle(mut stream: TcpStream, ex: &Exporter) {
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    let _ = stream.set_nodelay(true);
    let answer = match read_head(&mut stream) {
        Ok(head) => answer(&head, ex),
        Err(HeadError::TooLarge) => error_response(431, "request head too large\n"),
        Err(HeadError::Timeout) => error_response(408, "request timeout\n"),
        Err(HeadError::Gone) => return,
    };
    if stream
        .write_all(&answer)
        .and_then(|_| stream.flush())
        .is_err()
    {
        return;
    }
    // Close gently: unread input (a body, a second request) would otherwise
    // make the kernel reset the connection and the client lose the answer.
    let _ = stream.shutdown(Shutdown::Write);
    let _ = stream.set_read_timeout(Some(DRAIN_TIMEOUT));
    let mut sink = [0u8; 4096];
    let mut drained = 0;
    while drained < MAX_DRAIN {
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => drained += n,
        }
    }
}

enum HeadError {
    TooLarge,
    Timeout,
    /// Closed or broken before a whole head arrived: nobody to answer.
    Gone,
}

/// Where the head ends (after its blank line), ignoring blank lines before
/// the request line.
fn head_end(buf: &[u8]) -> Option<usize> {
    let start = buf.iter().position(|&b| b != b'\r' && b != b'\n')?;
    let mut i = start;
    while let Some(off) = buf[i..].iter().position(|&b| b == b'\n') {
        let nl = i + off;
        // A blank line follows: "\n\n" or "\n\r\n".
        match buf.get(nl + 1..) {
            Some([b'\n', ..]) => return Some(nl + 2),
            Some([b'\r', b'\n', ..]) => return Some(nl + 3),
            _ => i = nl + 1,
        }
    }
    None
}

fn read_head(stream: &mut TcpStream) -> Result<Vec<u8>, HeadError> {
    let deadline = Instant::now() + READ_TIMEOUT;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        if let Some(end) = head_end(&buf) {
            buf.truncate(end);
            return Ok(buf);
        }
        if buf.len() >= MAX_HEAD {
            return Err(HeadError::TooLarge);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return Err(HeadError::Timeout);
        }
        let want = chunk.len().min(MAX_HEAD - buf.len());
        match stream.read(&mut chunk[..want]) {
            Ok(0) => return Err(HeadError::Gone),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(HeadError::Timeout);
            }
            Err(_) => return Err(HeadError::Gone),
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
struct Request {
    method: String,
    /// The path, without query or fragment.
    path: String,
}

fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Parses a request head; `Err(status)` for what cannot be served.
fn parse_request(head: &[u8]) -> Result<Request, u16> {
    let text = std::str::from_utf8(head).map_err(|_| 400u16)?;
    let mut lines = text
        .split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .skip_while(|l| l.is_empty());
    let first = lines.next().ok_or(400u16)?;
    let parts: Vec<&str> = first.split(' ').collect();
    let [method, target, version] = parts[..] else {
        return Err(400);
    };
    if !is_token(method) || target.is_empty() || target.bytes().any(|b| !b.is_ascii_graphic()) {
        return Err(400);
    }
    match version {
        "HTTP/1.0" | "HTTP/1.1" => {}
        v if v.len() == 8
            && v.starts_with("HTTP/")
            && v.as_bytes()[5].is_ascii_digit()
            && v.as_bytes()[6] == b'.'
            && v.as_bytes()[7].is_ascii_digit() =>
        {
            return Err(505);
        }
        _ => return Err(400),
    }
    for line in lines {
        if line.is_empty() {
            break;
        }
        // Folded lines (leading white space) are refused, as RFC 9112 allows.
        let Some((name, _value)) = line.split_once(':') else {
            return Err(400);
        };
        if !is_token(name) {
            return Err(400);
        }
    }
    // Origin form "/path?query", or absolute form "http://host/path".
    let path = if target.starts_with('/') {
        target
    } else if let Some(rest) = target
        .strip_prefix("http://")
        .or_else(|| target.strip_prefix("https://"))
    {
        rest.find('/').map_or("/", |i| &rest[i..])
    } else if target == "*" {
        target
    } else {
        return Err(400);
    };
    let path = path.split(['?', '#']).next().unwrap_or(path);
    Ok(Request {
        method: method.to_string(),
        path: path.to_string(),
    })
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "Error",
    }
}

fn response(
    status: u16,
    content_type: &str,
    extra: &[(&str, &str)],
    body: &[u8],
    head_only: bool,
) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n",
        reason(status),
        body.len()
    );
    for (k, v) in extra {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    let mut out = out.into_bytes();
    if !head_only {
        out.extend_from_slice(body);
    }
    out
}

fn error_response(status: u16, text: &str) -> Vec<u8> {
    response(
        status,
        "text/plain; charset=utf-8",
        &[],
        text.as_bytes(),
        false,
    )
}

const INDEX: &str = "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>vramcap exporter</title></head>\n<body><h1>vramcap exporter</h1>\n<p>Per-process GPU memory under vramcap caps: <a href=\"/metrics\">/metrics</a></p></body></html>\n";

fn answer(head: &[u8], ex: &Exporter) -> Vec<u8> {
    let req = match parse_request(head) {
        Ok(r) => r,
        Err(status) => {
            let text = if status == 505 {
                "only HTTP/1.0 and HTTP/1.1 are served\n"
            } else {
                "malformed request\n"
            };
            return error_response(status, text);
        }
    };
    let known = matches!(req.path.as_str(), "/" | "/metrics");
    if !known {
        return error_response(404, "not found; the metrics are at /metrics\n");
    }
    let head_only = match req.method.as_str() {
        "GET" => false,
        "HEAD" => true,
        _ => {
            return response(
                405,
                "text/plain; charset=utf-8",
                &[("Allow", "GET, HEAD")],
                b"method not allowed\n",
                false,
            );
        }
    };
    if req.path == "/" {
        return response(
            200,
            "text/html; charset=utf-8",
            &[],
            INDEX.as_bytes(),
            head_only,
        );
    }
    match ex.scrape() {
        Ok(body) => response(200, CONTENT_TYPE, &[], body.as_bytes(), head_only),
        Err(e) => response(
            500,
            "text/plain; charset=utf-8",
            &[],
            format!("{e}\n").as_bytes(),
            head_only,
        ),
    }
}

impl Exporter {
    fn scrape(&self) -> Result<String, String> {
        let mut last_error = self
            .scrape_lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match self.sources.read() {
            Ok(Reading { scan: s, groups }) => {
                *last_error = None;
                Ok(render(&s.pages, &groups, s.skipped.len()))
            }
            Err(e) => {
                let text = format!("vramcap: {e}");
                if last_error.as_deref() != Some(text.as_str()) {
                    eprintln!("{text}");
                    *last_error = Some(text.clone());
                }
                Err(text)
            }
        }
    }
}

/// The `pod`, `namespace` and `container` labels the page recorded.
fn identity_labels(page: &PageSnapshot) -> impl Iterator<Item = (&'static str, String)> + '_ {
    [
        ("pod", &page.pod),
        ("namespace", &page.namespace),
        ("container", &page.container),
    ]
    .into_iter()
    .filter(|(_, v)| !v.is_empty())
    .map(|(k, v)| (k, v.clone()))
}

/// A label value escaped for the exposition format.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

type Labels = Vec<(&'static str, String)>;

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
}

fn sample(out: &mut String, name: &str, labels: &Labels, value: u64) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&format!("{k}=\"{}\"", escape(v)));
        }
        out.push('}');
    }
    out.push_str(&format!(" {value}\n"));
}

struct Family<T> {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    value: fn(&T) -> Option<u64>,
}

/// One GPU of a group (`limit` and `used` are `None` while it has none).
struct GroupGpu {
    limit: Option<u64>,
    used: Option<u64>,
    members: u64,
}

const GROUP_FAMILIES: [Family<GroupGpu>; 3] = [
    Family {
        name: "vramcap_group_memory_limit_bytes",
        kind: "gauge",
        help: "Bytes the processes of the group may hold together on the GPU (no sample without a cap).",
        value: |g| g.limit,
    },
    Family {
        name: "vramcap_group_memory_used_bytes",
        kind: "gauge",
        help: "Bytes the processes of the group hold together on the GPU.",
        value: |g| g.used,
    },
    Family {
        name: "vramcap_group_members",
        kind: "gauge",
        help: "Live processes in the group (the same on each of its GPUs).",
        value: |g| Some(g.members),
    },
];

/// The exposition text for these pages and groups.
pub(super) fn render(pages: &[PageSnapshot], groups: &[GroupSnapshot], skipped: usize) -> String {
    let mut rows: Vec<(Labels, &SlotSnapshot)> = Vec::new();
    for p in pages {
        let command: String = p.command.chars().take(COMMAND_CHARS).collect();
        for d in &p.devices {
            let mut labels: Labels = vec![
                ("gpu", d.device.to_string()),
                ("UUID", uuid_text(&d.uuid).unwrap_or_default()),
                ("pid", p.pid.to_string()),
                ("command", command.clone()),
                ("group", p.group.clone()),
                ("dir", p.dir.display().to_string()),
            ];
            labels.extend(identity_labels(p));
            rows.push((labels, d));
        }
    }
    let mut out = String::new();
    for c in COUNTERS {
        let Some(m) = c.metric else { continue };
        family(&mut out, m.name, m.kind.as_str(), m.help);
        for (labels, d) in &rows {
            if let Some(v) = (c.value)(d) {
                sample(&mut out, m.name, labels, v);
            }
        }
    }
    let mut group_rows: Vec<(Labels, GroupGpu)> = Vec::new();
    for g in groups {
        let members = g.members.len() as u64;
        let label = |uuid: String| {
            vec![
                ("group", g.name.clone()),
                ("UUID", uuid),
                ("dir", g.dir.display().to_string()),
            ]
        };
        if g.devices.is_empty() {
            let none = GroupGpu {
                limit: None,
                used: None,
                members,
            };
            group_rows.push((label(String::new()), none));
        }
        for d in &g.devices {
            let gpu = GroupGpu {
                limit: d.limit,
                used: Some(d.used),
                members,
            };
            group_rows.push((label(uuid_text(&d.uuid).unwrap_or_default()), gpu));
        }
    }
    for f in &GROUP_FAMILIES {
        family(&mut out, f.name, f.kind, f.help);
        for (labels, g) in &group_rows {
            if let Some(v) = (f.value)(g) {
                sample(&mut out, f.name, labels, v);
            }
        }
    }
    family(
        &mut out,
        "vramcap_pages_skipped",
        "gauge",
        "Files in the statistics directory that could not be read as pages (vramcap stat names them).",
    );
    sample(
        &mut out,
        "vramcap_pages_skipped",
        &Vec::new(),
        skipped as u64,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("plain ü"), "plain ü");
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn listen_values() {
        assert_eq!(
            parse_listen("127.0.0.1:9400").unwrap(),
            ["127.0.0.1:9400".parse::<SocketAddr>().unwrap()]
        );
        assert_eq!(
            parse_listen("[::1]:0").unwrap(),
            ["[::1]:0".parse::<SocketAddr>().unwrap()]
        );
        assert_eq!(
            parse_listen(":9400").unwrap(),
            ["0.0.0.0:9400".parse::<SocketAddr>().unwrap()]
        );
        for bad in [
            "",
            "foo",
            "9400",
            "127.0.0.1",
            "127.0.0.1:99999",
            "127.0.0.1:+1",
            "a b:1",
            ":",
            "::1:80x",
        ] {
            let e = parse_listen(bad).unwrap_err();
            assert!(
                e.starts_with(&format!("--listen \"{bad}\" is not valid: "))
                    && e.ends_with("expected ADDRESS:PORT, e.g. 127.0.0.1:9400"),
                "{e}"
            );
        }
    }

    #[test]
    fn heads_end_at_the_blank_line() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\nrest"), Some(18));
        assert_eq!(head_end(b"GET / HTTP/1.1\n\n"), Some(16));
        assert_eq!(head_end(b"\r\nGET / HTTP/1.1\r\nA: b\r\n\r\n"), Some(26));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nA: b\r\n"), None);
        assert_eq!(head_end(b"\r\n\r\n"), None);
        assert_eq!(head_end(b""), None);
    }

    #[test]
    fn requests() {
        let ok = |head: &str, method: &str, path: &str| {
            assert_eq!(
                parse_request(head.as_bytes()),
                Ok(Request {
                    method: method.into(),
                    path: path.into()
                }),
                "{head:?}"
            );
        };
        ok(
            "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
            "GET",
            "/metrics",
        );
        ok("GET /metrics?a=b HTTP/1.0\r\n\r\n", "GET", "/metrics");
        ok("\r\nHEAD / HTTP/1.1\n\n", "HEAD", "/");
        ok(
            "GET http://example:9400/metrics HTTP/1.1\r\n\r\n",
            "GET",
            "/metrics",
        );
        ok("GET http://example HTTP/1.1\r\n\r\n", "GET", "/");
        for (head, status) in [
            ("", 400),
            ("GET\r\n\r\n", 400),
            ("GET /metrics\r\n\r\n", 400),
            ("GET  /metrics HTTP/1.1\r\n\r\n", 400),
            ("GET /metrics HTTP/1.1 x\r\n\r\n", 400),
            ("GET /metrics HTTP/2.0\r\n\r\n", 505),
            ("GET /metrics HTTQ/1.1\r\n\r\n", 400),
            ("GET metrics HTTP/1.1\r\n\r\n", 400),
            ("G(T / HTTP/1.1\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\nno colon\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\n folded: x\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\n: empty name\r\n\r\n", 400),
            ("GET /\u{e9} HTTP/1.1\r\n\r\n", 400),
        ] {
            assert_eq!(parse_request(head.as_bytes()), Err(status), "{head:?}");
        }
        assert_eq!(parse_request(b"GET /\xff HTTP/1.1\r\n\r\n"), Err(400));
    }

    fn slot(device: u32, limit: Option<u64>) -> SlotSnapshot {
        SlotSnapshot {
            device,
            limit,
            used: 10,
            peak: 20,
            cached: 3,
            spilled: 4,
            allocs: 5,
            frees: 6,
            refusals: 7,
            cache_hits: 8,
            cache_misses: 9,
            evictions: 11,
            trims: 12,
            spill_allocs: 13,
            uuid: [0; 16],
        }
    }

    #[test]
    fn rendering() {
        let pages = [PageSnapshot {
            pid: 42,
            uid: 1,
            start_time: 0,
            created_unix_ns: 0,
            command: format!("a\"b\\c\n{}", "x".repeat(200)),
            group: String::new(),
            pod: "p\"1".to_string(),
            namespace: String::new(),
            container: String::new(),
            devices: vec![slot(0, Some(100)), slot(3, None)],
            dir: std::path::PathBuf::from("/run/vramcap"),
        }];
        let text = render(&pages, &[], 2);
        let cmd = format!("a\\\"b\\\\c\\n{}", "x".repeat(122));
        let labels0 = format!(
            "{{gpu=\"0\",UUID=\"\",pid=\"42\",command=\"{cmd}\",group=\"\",dir=\"/run/vramcap\",pod=\"p\\\"1\"}}"
        );
        let labels3 = labels0.replace("gpu=\"0\"", "gpu=\"3\"");
        assert!(
            text.contains(&format!("\nvramcap_gpu_memory_limit_bytes{labels0} 100\n")),
            "{text}"
        );
        assert!(!text.contains(&format!("vramcap_gpu_memory_limit_bytes{labels3}")));
        assert!(text.contains(&format!("\nvramcap_spill_allocations_total{labels3} 13\n")));
        assert!(text.contains("\n# TYPE vramcap_frees_total counter\n"));
        assert!(text.contains("\n# TYPE vramcap_group_members gauge\n"));
        assert!(text.ends_with("\nvramcap_pages_skipped 2\n"), "{text}");
        // Every family: HELP, TYPE, then its samples together.
        let mut seen = Vec::new();
        for line in text.lines() {
            let name = if let Some(rest) = line.strip_prefix("# HELP ") {
                rest.split(' ').next().unwrap()
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                rest.split(' ').next().unwrap()
            } else {
                line.split(['{', ' ']).next().unwrap()
            };
            if seen.last() != Some(&name) {
                assert!(!seen.contains(&name), "{name} is not contiguous");
                seen.push(name);
            }
        }
        assert_eq!(seen.len(), 16);
    }
}
