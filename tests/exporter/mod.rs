//! `vramcap exporter`: scraped over real HTTP while clients under the shim
//! hold memory (stopped at `wait`), parsed with prometheus-parse and checked
//! against the pages' exact bytes. No sleeps: the exporter is ready once it
//! prints its address on stderr.
//!
//! This file is the harness; `metrics` checks what a scrape holds, `http`
//! how the server answers.

mod hostile;
mod http;
mod metrics;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, ChildStderr, Command, Stdio};

use crate::util::*;
use prometheus_parse::{Sample, Scrape, Value};
use serde_json::Value as Json;

const UUID0: &str = "GPU-5ca1ab1e-0000-4000-8000-000000000000";
const UUID1: &str = "GPU-5ca1ab1e-0000-4000-8000-000000000001";
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

const GAUGES: [&str; 5] = [
    "vramcap_gpu_memory_limit_bytes",
    "vramcap_gpu_memory_used_bytes",
    "vramcap_gpu_memory_peak_bytes",
    "vramcap_gpu_memory_cached_bytes",
    "vramcap_gpu_memory_spilled_bytes",
];
const COUNTERS: [&str; 7] = [
    "vramcap_allocations_total",
    "vramcap_frees_total",
    "vramcap_refusals_total",
    "vramcap_cache_hits_total",
    "vramcap_cache_misses_total",
    "vramcap_cache_evictions_total",
    "vramcap_spill_allocations_total",
];
/// Each per-GPU metric and the `vramcap stat --json` field it mirrors.
const FIELDS: [(&str, &str); 12] = [
    ("vramcap_gpu_memory_limit_bytes", "limit_bytes"),
    ("vramcap_gpu_memory_used_bytes", "used_bytes"),
    ("vramcap_gpu_memory_peak_bytes", "peak_bytes"),
    ("vramcap_gpu_memory_cached_bytes", "cached_bytes"),
    ("vramcap_gpu_memory_spilled_bytes", "spilled_bytes"),
    ("vramcap_allocations_total", "allocations"),
    ("vramcap_frees_total", "frees"),
    ("vramcap_refusals_total", "refusals"),
    ("vramcap_cache_hits_total", "cache_hits"),
    ("vramcap_cache_misses_total", "cache_misses"),
    ("vramcap_cache_evictions_total", "evictions"),
    ("vramcap_spill_allocations_total", "spill_allocations"),
];

/// A running exporter, killed when dropped.
struct Exporter {
    child: Child,
    addr: SocketAddr,
    stderr: BufReader<ChildStderr>,
    /// What it printed before its start line (warnings).
    before: Vec<String>,
}

impl Exporter {
    fn start(dir: &Path) -> Exporter {
        let ex = Exporter::start_with(dir, &[]);
        assert_eq!(ex.before, Vec::<String>::new(), "no warning at start");
        ex
    }

    /// With `VRAMCAP_STATS_DIR=dir` and these extra arguments.
    fn start_with(dir: &Path, args: &[&str]) -> Exporter {
        let mut cmd = bare(&artefacts().cli);
        cmd.env("VRAMCAP_STATS_DIR", dir)
            .args(["exporter", "--listen", "127.0.0.1:0"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        let mut stderr = BufReader::new(child.stderr.take().expect("piped stderr"));
        let mut before = Vec::new();
        let mut line = String::new();
        loop {
            line.clear();
            stderr.read_line(&mut line).expect("read exporter stderr");
            if !line.starts_with("vramcap: ") {
                break;
            }
            before.push(line.trim_end().to_string());
        }
        let addr = line
            .trim_end()
            .strip_prefix("vramcap exporter listening on http://")
            .and_then(|rest| rest.strip_suffix("/metrics"))
            .and_then(|a| a.parse::<SocketAddr>().ok());
        let Some(addr) = addr else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("unexpected start line {line:?}");
        };
        assert_ne!(addr.port(), 0, "the real port is printed");
        Exporter {
            child,
            addr,
            stderr,
            before,
        }
    }

    /// Sends `raw` as is and reads the whole answer.
    fn send(&self, raw: &[u8]) -> Response {
        let mut s = TcpStream::connect(self.addr).expect("connect to the exporter");
        s.write_all(raw).expect("send the request");
        let mut bytes = Vec::new();
        s.read_to_end(&mut bytes).expect("read the answer");
        Response::parse(&bytes)
    }

    fn get(&self, path: &str) -> Response {
        self.send(
            format!(
                "GET {path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: vramcap-test\r\nAccept: */*\r\n\r\n",
                self.addr
            )
            .as_bytes(),
        )
    }

    fn scrape(&self) -> Metrics {
        let r = self.get("/metrics");
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.header("content-type"), Some(CONTENT_TYPE), "{r:?}");
        Metrics::parse(&r.body)
    }

    /// Asserts the exporter is still running (it survived what the test
    /// sent), then kills it.
    fn stop(mut self) {
        assert!(
            self.child.try_wait().expect("try_wait").is_none(),
            "the exporter ended by itself"
        );
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug)]
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Response {
    fn parse(bytes: &[u8]) -> Response {
        let text = String::from_utf8(bytes.to_vec()).expect("a UTF-8 answer");
        let (head, body) = text
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("no end of head in {text:?}"));
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap();
        let mut parts = status_line.splitn(3, ' ');
        assert_eq!(parts.next(), Some("HTTP/1.1"), "{status_line}");
        let status = parts.next().unwrap().parse().expect("a status code");
        let headers: Vec<(String, String)> = lines
            .map(|l| {
                let (k, v) = l.split_once(':').expect("a header");
                (k.to_ascii_lowercase(), v.trim().to_string())
            })
            .collect();
        let r = Response {
            status,
            headers,
            body: body.to_string(),
        };
        let len: usize = r
            .header("content-length")
            .expect("Content-Length")
            .parse()
            .unwrap();
        assert!(len == r.body.len() || r.body.is_empty(), "{r:?}");
        assert_eq!(r.header("connection"), Some("close"));
        r
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

struct Metrics {
    scrape: Scrape,
    text: String,
}

impl Metrics {
    fn parse(text: &str) -> Metrics {
        let scrape = Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("parse");
        // Every line is a comment or a sample the parser took.
        let lines = text.lines().filter(|l| !l.starts_with('#')).count();
        assert_eq!(scrape.samples.len(), lines, "{text}");
        Metrics {
            scrape,
            text: text.to_string(),
        }
    }

    /// Every sample of `metric` whose labels include `labels`.
    fn find(&self, metric: &str, labels: &[(&str, &str)]) -> Vec<&Sample> {
        self.scrape
            .samples
            .iter()
            .filter(|s| {
                s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(v))
            })
            .collect()
    }

    /// The value of the one sample of `metric` with `labels`; `None` when
    /// there is none. Checks its type.
    fn value(&self, metric: &str, labels: &[(&str, &str)]) -> Option<u64> {
        let found = self.find(metric, labels);
        assert!(found.len() <= 1, "{metric} {labels:?}: {found:?}");
        let s = found.first()?;
        let v = match (&s.value, COUNTERS.contains(&metric)) {
            (Value::Counter(v), true) | (Value::Gauge(v), false) => *v,
            (other, _) => panic!("{metric} has the wrong type: {other:?}"),
        };
        assert!(v >= 0.0 && v.fract() == 0.0 && v < 9e15, "{metric}: {v}");
        Some(v as u64)
    }

    fn pids(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .scrape
            .samples
            .iter()
            .filter_map(|s| s.labels.get("pid").map(str::to_string))
            .collect();
        v.sort();
        v.dedup();
        v
    }
}

fn held(dir: &Path, limit: Option<&str>, env: &[(&str, &str)], args: &[&str]) -> Held {
    held_program(&artefacts().client, dir, limit, env, args)
}

fn held_program(
    program: &Path,
    dir: &Path,
    limit: Option<&str>,
    env: &[(&str, &str)],
    args: &[&str],
) -> Held {
    let limit: Vec<(&str, &str)> = limit.map(|l| ("VRAMCAP_LIMIT", l)).into_iter().collect();
    held_program_in(program, dir, &[&limit[..], env].concat(), args)
}

fn stat_json(dir: &Path) -> Json {
    let mut cmd: Command = bare(&artefacts().cli);
    cmd.env("VRAMCAP_STATS_DIR", dir).args(["stat", "--json"]);
    serde_json::from_str(&run(cmd).ok_lines().join("")).unwrap()
}

/// Every device of every process in `vramcap stat --json` has exactly its
/// values in the scrape, and the scrape has nothing else.
fn matches_stat(m: &Metrics, j: &Json) {
    let mut expected_samples = 0;
    for p in j["processes"].as_array().unwrap() {
        let pid = p["pid"].to_string();
        let group = p["group"].as_str().unwrap_or("");
        let command: String = p["command"].as_str().unwrap().chars().take(128).collect();
        for d in p["devices"].as_array().unwrap() {
            let gpu = d["gpu"].to_string();
            let uuid = d["uuid"].as_str().unwrap_or("");
            let labels = [
                ("pid", pid.as_str()),
                ("gpu", gpu.as_str()),
                ("UUID", uuid),
                ("group", group),
            ];
            for (metric, field) in FIELDS {
                assert_eq!(
                    m.value(metric, &labels),
                    d[field].as_u64(),
                    "{metric} {labels:?}\n{}",
                    m.text
                );
                expected_samples += usize::from(!d[field].is_null());
                if let Some(s) = m.find(metric, &labels).first()
                    && !command.contains([',', '=', '"', '\\', '\n', '}'])
                {
                    assert_eq!(s.labels.get("command"), Some(command.as_str()));
                }
            }
        }
    }
    let per_gpu = m
        .scrape
        .samples
        .iter()
        .filter(|s| FIELDS.iter().any(|(f, _)| *f == s.metric))
        .count();
    assert_eq!(per_gpu, expected_samples, "{}", m.text);
}
