//! `vramcap exporter`: the statistics pages as Prometheus metrics over HTTP.
//!
//! `vramcap exporter [--listen ADDRESS:PORT]` (default `127.0.0.1:10077`;
//! `:PORT` means every IPv4 interface, port 0 picks a free port) prints one
//! line, `vramcap exporter listening on http://ADDRESS:PORT/metrics`, on
//! stderr once it listens (after a warning for each `--dir` pattern whose
//! fixed part is not a directory), then serves until killed:
//!
//! - `GET /metrics` (or `HEAD`): the metrics ([`metrics`]), in the text
//!   exposition format 0.0.4 (`Content-Type: text/plain; version=0.0.4;
//!   charset=utf-8`); 500 when a statistics directory cannot be read (said
//!   once on stderr while it lasts);
//! - `GET /`: a short page linking `/metrics`;
//! - any other path: 404; another method on these paths: 405; a malformed
//!   request: 400 (431 when its head passes 8 KiB, 408 when it takes more
//!   than 10 s to arrive, 505 for another HTTP version). An answer not
//!   taken by its client within 10 s closes the connection. At most 64
//!   connections at once: past that the oldest idle one (no request yet,
//!   or its answer sent) is closed to make room, else the oldest whose
//!   client is not taking its answer, and a new one is answered 503 only
//!   when all 64 are working out their answers. One request per connection (`Connection: close`);
//!   [`http`] says how it is served.
//!
//! Every scrape reads the pages afresh, exactly as `vramcap stat` does (same
//! directories, `--dir` or `VRAMCAP_STATS_DIR` or the default ones; pages
//! of dead processes are removed); scrapes run one at a time. A process
//! that ended since the last scrape is simply absent. A scrape is bounded
//! as every scan is (`read::Bounds`: at most 4096 process-GPU rows, a fair
//! share per directory, and a 2 s deadline after which it answers with
//! what it has read), so files planted in a directory it reads can neither
//! make it slow nor make it large; nothing in a page can crash it (pages
//! are copied, never mapped).

mod http;
mod metrics;

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::{Arc, Mutex};

use self::http::{Request, error_response, error_text, response, serve};
use self::metrics::{CONTENT_TYPE, render};
use super::stat::Sources;
use crate::read::Reading;

#[cfg(test)]
pub(super) use self::metrics::render as render_metrics;

pub const DEFAULT_LISTEN: &str = "127.0.0.1:10077";

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
    let ex = Exporter {
        sources,
        scrape_lock: Mutex::new(None),
    };
    serve(listener, Arc::new(move |req: &Request| answer(req, &ex)))
}

struct Exporter {
    sources: Sources,
    /// Serialises scrapes; holds the last error reported, so a lasting
    /// problem is printed once.
    scrape_lock: Mutex<Option<String>>,
}

const INDEX: &str = "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>vramcap exporter</title></head>\n<body><h1>vramcap exporter</h1>\n<p>Per-process GPU memory under vramcap caps: <a href=\"/metrics\">/metrics</a></p></body></html>\n";

/// The answer to a well-formed request.
fn answer(req: &Request, ex: &Exporter) -> Vec<u8> {
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
            Ok(Reading {
                scan: s, groups, ..
            }) => {
                *last_error = None;
                Ok(render(&s.pages, &groups, s.skipped_files()))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_values() {
        assert_eq!(
            parse_listen("127.0.0.1:10077").unwrap(),
            ["127.0.0.1:10077".parse::<SocketAddr>().unwrap()]
        );
        assert_eq!(
            parse_listen("[::1]:0").unwrap(),
            ["[::1]:0".parse::<SocketAddr>().unwrap()]
        );
        assert_eq!(
            parse_listen(":10077").unwrap(),
            ["0.0.0.0:10077".parse::<SocketAddr>().unwrap()]
        );
        for bad in [
            "",
            "foo",
            "10077",
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
                    && e.ends_with("expected ADDRESS:PORT, e.g. 127.0.0.1:10077"),
                "{e}"
            );
        }
    }
}
