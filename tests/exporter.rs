//! `vramcap exporter`: scraped over real HTTP while clients under the shim
//! hold memory (stopped at `wait`), parsed with prometheus-parse and checked
//! against the pages' exact bytes. No sleeps: the exporter is ready once it
//! prints its address on stderr.

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
    held_in(program, dir, &[&limit[..], env].concat(), args)
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

#[test]
fn a_scrape_has_the_pages_exact_bytes_and_labels() {
    let dir = fresh_dir("exporter-exact");
    let a = held(
        &dir,
        Some("1GiB"),
        &[
            ("POD_NAME", "trainer-0"),
            ("POD_NAMESPACE", "ml"),
            ("CONTAINER_NAME", "main"),
        ],
        &[
            "init", "alloc", "300M", "ctx", "1", "alloc", "1G", "alloc", "1G", "wait",
        ],
    );
    // Uncapped, outside Kubernetes: no limit sample, no pod labels.
    // Its second 64 MiB comes from the cache and goes back to it.
    let b = held(
        &dir,
        None,
        &[],
        &[
            "init", "alloc", "64M", "free", "0", "alloc", "64M", "free", "1", "wait",
        ],
    );
    let ex = Exporter::start(&dir);
    let m = ex.scrape();
    let (pa, pb) = (a.pid().to_string(), b.pid().to_string());

    for name in GAUGES.iter().chain(&COUNTERS).chain(&[
        "vramcap_group_memory_limit_bytes",
        "vramcap_group_memory_used_bytes",
        "vramcap_group_members",
        "vramcap_pages_skipped",
    ]) {
        assert!(
            m.scrape.docs.contains_key(*name),
            "no HELP for {name}\n{}",
            m.text
        );
        let kind = if name.ends_with("_total") {
            "counter"
        } else {
            "gauge"
        };
        assert!(
            m.text.contains(&format!("\n# TYPE {name} {kind}\n")),
            "no TYPE for {name}"
        );
    }

    let a0 = [("pid", pa.as_str()), ("gpu", "0"), ("UUID", UUID0)];
    let a1 = [("pid", pa.as_str()), ("gpu", "1"), ("UUID", UUID1)];
    let v = |metric, labels: &[(&str, &str)]| m.value(metric, labels);
    assert_eq!(v("vramcap_gpu_memory_used_bytes", &a0), Some(300 * MIB));
    assert_eq!(v("vramcap_gpu_memory_used_bytes", &a0), Some(314_572_800));
    assert_eq!(
        v("vramcap_gpu_memory_limit_bytes", &a0),
        Some(1_073_741_824)
    );
    assert_eq!(v("vramcap_gpu_memory_peak_bytes", &a0), Some(300 * MIB));
    assert_eq!(v("vramcap_gpu_memory_cached_bytes", &a0), Some(0));
    assert_eq!(v("vramcap_gpu_memory_spilled_bytes", &a0), Some(0));
    assert_eq!(v("vramcap_allocations_total", &a0), Some(1));
    assert_eq!(v("vramcap_frees_total", &a0), Some(0));
    assert_eq!(v("vramcap_refusals_total", &a0), Some(0));
    assert_eq!(v("vramcap_cache_misses_total", &a0), Some(1));
    assert_eq!(v("vramcap_gpu_memory_used_bytes", &a1), Some(GIB));
    assert_eq!(v("vramcap_gpu_memory_limit_bytes", &a1), Some(GIB));
    assert_eq!(v("vramcap_allocations_total", &a1), Some(1));
    assert_eq!(v("vramcap_refusals_total", &a1), Some(1));
    assert_eq!(v("vramcap_cache_misses_total", &a1), Some(2));
    assert_eq!(v("vramcap_spill_allocations_total", &a1), Some(0));

    // Every label, the command cut to 128 characters.
    let s = m.find("vramcap_gpu_memory_used_bytes", &a0)[0];
    let command: String = format!(
        "{} procaddr init alloc 300M ctx 1 alloc 1G alloc 1G wait",
        artefacts().client.display()
    )
    .chars()
    .take(128)
    .collect();
    let dir_text = dir.display().to_string();
    let mut want = vec![
        ("UUID", UUID0),
        ("command", command.as_str()),
        ("container", "main"),
        ("dir", dir_text.as_str()),
        ("gpu", "0"),
        ("group", ""),
        ("namespace", "ml"),
        ("pid", pa.as_str()),
        ("pod", "trainer-0"),
    ];
    want.sort();
    let mut got: Vec<(&str, &str)> = s
        .labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    got.sort();
    assert_eq!(got, want);

    // The uncapped client: no limit sample, no Kubernetes labels.
    let b0 = [("pid", pb.as_str()), ("gpu", "0")];
    assert_eq!(v("vramcap_gpu_memory_limit_bytes", &b0), None);
    assert_eq!(v("vramcap_gpu_memory_used_bytes", &b0), Some(64 * MIB));
    assert_eq!(v("vramcap_gpu_memory_cached_bytes", &b0), Some(64 * MIB));
    assert_eq!(v("vramcap_gpu_memory_peak_bytes", &b0), Some(64 * MIB));
    assert_eq!(v("vramcap_allocations_total", &b0), Some(2));
    assert_eq!(v("vramcap_frees_total", &b0), Some(2));
    assert_eq!(v("vramcap_cache_hits_total", &b0), Some(1));
    assert_eq!(v("vramcap_cache_misses_total", &b0), Some(1));
    let sb = m.find("vramcap_gpu_memory_used_bytes", &b0)[0];
    for k in ["pod", "namespace", "container"] {
        assert_eq!(sb.labels.get(k), None, "{k}");
    }
    assert_eq!(m.value("vramcap_pages_skipped", &[]), Some(0));
    assert_eq!(m.pids(), {
        let mut v = vec![pa.clone(), pb.clone()];
        v.sort();
        v
    });
    matches_stat(&m, &stat_json(&dir));

    ex.stop();
    a.finish();
    b.finish();
}

#[test]
fn a_client_killed_between_scrapes_is_absent_from_the_next() {
    let dir = fresh_dir("exporter-killed");
    let mut doomed = held(&dir, Some("1GiB"), &[], &["init", "alloc", "128M", "wait"]);
    let stays = held(&dir, Some("1GiB"), &[], &["init", "alloc", "32M", "wait"]);
    let ex = Exporter::start(&dir);
    let (pd, ps) = (doomed.pid().to_string(), stays.pid().to_string());
    let m = ex.scrape();
    assert_eq!(
        m.value("vramcap_gpu_memory_used_bytes", &[("pid", &pd)]),
        Some(128 * MIB)
    );
    assert_eq!(
        m.value("vramcap_gpu_memory_used_bytes", &[("pid", &ps)]),
        Some(32 * MIB)
    );

    doomed.child.kill().unwrap();
    doomed.child.wait().unwrap();
    let page = dir.join(format!("{pd}.page"));
    assert!(page.exists(), "SIGKILL leaves the page behind");

    let m = ex.scrape(); // asserts 200
    assert_eq!(m.pids(), [ps.as_str()], "{}", m.text);
    assert_eq!(
        m.value("vramcap_gpu_memory_used_bytes", &[("pid", &ps)]),
        Some(32 * MIB)
    );
    assert_eq!(m.value("vramcap_pages_skipped", &[]), Some(0));
    assert!(!page.exists(), "the dead page is pruned");
    matches_stat(&m, &stat_json(&dir));

    // A client that ends normally is gone too; then nothing is left.
    stays.finish();
    let m = ex.scrape();
    assert_eq!(m.pids(), Vec::<String>::new(), "{}", m.text);
    assert_eq!(m.value("vramcap_pages_skipped", &[]), Some(0));
    ex.stop();
}

#[test]
fn unreadable_pages_are_counted_not_errors() {
    let dir = fresh_dir("exporter-skipped");
    let h = held(&dir, Some("1GiB"), &[], &["init", "alloc", "1M", "wait"]);
    std::fs::write(dir.join("1.page"), b"not a page").unwrap();
    std::fs::write(dir.join("2.page"), []).unwrap();
    std::fs::write(dir.join("group-x.grp"), b"not a group").unwrap();
    std::fs::write(dir.join("notes.txt"), b"ignored").unwrap();
    let ex = Exporter::start(&dir);
    for _ in 0..2 {
        let m = ex.scrape();
        assert_eq!(m.value("vramcap_pages_skipped", &[]), Some(3), "{}", m.text);
        assert_eq!(m.pids(), [h.pid().to_string()]);
        assert_eq!(
            m.value("vramcap_gpu_memory_used_bytes", &[("gpu", "0")]),
            Some(MIB)
        );
    }
    ex.stop();
    h.finish();
}

#[test]
fn groups_have_their_budget_and_members() {
    let dir = fresh_dir("exporter-group");
    let env = [("VRAMCAP_GROUP", "train"), ("VRAMCAP_CACHE", "off")];
    let a = held(&dir, Some("1GiB"), &env, &["init", "alloc", "256M", "wait"]);
    let b = held(&dir, Some("1GiB"), &env, &["init", "alloc", "128M", "wait"]);
    let ex = Exporter::start(&dir);
    let m = ex.scrape();
    let g = [("group", "train"), ("UUID", UUID0)];
    assert_eq!(
        m.value("vramcap_group_memory_limit_bytes", &g),
        Some(GIB),
        "{}",
        m.text
    );
    assert_eq!(
        m.value("vramcap_group_memory_used_bytes", &g),
        Some(384 * MIB)
    );
    assert_eq!(m.value("vramcap_group_members", &g), Some(2));
    for s in m.find("vramcap_group_members", &[]) {
        let mut keys: Vec<&String> = s.labels.keys().collect();
        keys.sort();
        assert_eq!(keys, ["UUID", "dir", "group"]);
        assert_eq!(
            s.labels.get("dir"),
            Some(dir.display().to_string().as_str())
        );
    }
    let pa = a.pid().to_string();
    assert_eq!(
        m.value(
            "vramcap_gpu_memory_used_bytes",
            &[("pid", &pa), ("group", "train")]
        ),
        Some(256 * MIB)
    );
    matches_stat(&m, &stat_json(&dir));

    a.finish();
    let m = ex.scrape();
    assert_eq!(
        m.value("vramcap_group_memory_used_bytes", &g),
        Some(128 * MIB)
    );
    assert_eq!(m.value("vramcap_group_members", &g), Some(1));
    ex.stop();
    b.finish();
}

/// Quotes, backslashes and newlines in the command (here in the program's
/// name) and in the environment come out escaped, one sample per line.
#[test]
fn label_values_are_escaped() {
    let dir = fresh_dir("exporter-escape");
    let link = dir.join("we\"ird\\na\nme");
    std::os::unix::fs::symlink(&artefacts().client, &link).unwrap();
    let pages = dir.join("pages");
    let h = held_program(
        &link,
        &pages,
        Some("1GiB"),
        &[
            ("POD_NAME", "p\"o\\d\n1"),
            ("KUBERNETES_POD_NAME", "ignored"),
        ],
        &["init", "alloc", "2M", "wait"],
    );
    let ex = Exporter::start(&pages);
    let r = ex.get("/metrics");
    assert_eq!(r.status, 200);
    let escaped_command = format!("{} procaddr init alloc 2M wait", link.display())
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n");
    let line = r
        .body
        .lines()
        .find(|l| l.starts_with("vramcap_gpu_memory_used_bytes{"))
        .unwrap_or_else(|| panic!("{}", r.body));
    assert_eq!(
        line,
        format!(
            "vramcap_gpu_memory_used_bytes{{gpu=\"0\",UUID=\"{UUID0}\",pid=\"{}\",command=\"{escaped_command}\",group=\"\",dir=\"{}\",pod=\"p\\\"o\\\\d\\n1\"}} 2097152",
            h.pid(),
            pages.display()
        )
    );
    // The escapes keep every sample on one line.
    Metrics::parse(&r.body);
    ex.stop();
    h.finish();
}

#[test]
fn http_answers_and_bad_requests_never_stop_the_exporter() {
    let dir = fresh_dir("exporter-http");
    let empty = dir.join("never-created");
    let ex = Exporter::start(&empty);

    // No directory yet: an empty scrape, not an error.
    let m = ex.scrape();
    assert_eq!(m.pids(), Vec::<String>::new());
    assert_eq!(m.value("vramcap_pages_skipped", &[]), Some(0));

    let r = ex.get("/");
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/html"));
    assert!(r.body.contains("href=\"/metrics\""), "{}", r.body);

    for path in ["/nope", "/metrics/", "/favicon.ico", "/metricsx"] {
        let r = ex.get(path);
        assert_eq!(r.status, 404, "{path}: {r:?}");
    }
    let r = ex.get("/metrics?name[]=x");
    assert_eq!(r.status, 200);
    let r = ex.send(b"GET http://localhost:9400/metrics HTTP/1.1\r\nHost: localhost\r\n\r\n");
    assert_eq!(r.status, 200);
    let r = ex.send(b"GET /metrics HTTP/1.0\r\n\r\n");
    assert_eq!(
        (r.status, r.header("content-type")),
        (200, Some(CONTENT_TYPE))
    );
    let r = ex.send(b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(r.status, 200);
    assert_eq!(r.body, "");
    assert_ne!(r.header("content-length"), Some("0"));
    let r = ex.send(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello");
    assert_eq!((r.status, r.header("allow")), (405, Some("GET, HEAD")));

    for (raw, status) in [
        (&b"hello\r\n\r\n"[..], 400),
        (b"GET /metrics\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1 extra\r\n\r\n", 400),
        (b"GET /metrics HTTP/2.0\r\n\r\n", 505),
        (b"GET metrics HTTP/1.1\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n", 400),
        (b"GET /\xff\xfe HTTP/1.1\r\n\r\n", 400),
        (b"\x00\x01\x02\x03\r\n\r\n", 400),
    ] {
        let r = ex.send(raw);
        assert_eq!(
            r.status,
            status,
            "{:?}: {r:?}",
            String::from_utf8_lossy(raw)
        );
    }
    // A head past the limit.
    let mut big = b"GET /metrics HTTP/1.1\r\n".to_vec();
    for i in 0..400 {
        big.extend_from_slice(format!("X-Filler-{i}: {}\r\n", "y".repeat(40)).as_bytes());
    }
    big.extend_from_slice(b"\r\n");
    let r = ex.send(&big);
    assert_eq!(r.status, 431);

    // Connections closed before or in the middle of a request.
    drop(TcpStream::connect(ex.addr).unwrap());
    let mut s = TcpStream::connect(ex.addr).unwrap();
    s.write_all(b"GET /met").unwrap();
    drop(s);

    // Concurrent scrapes.
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let addr = ex.addr;
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(addr).unwrap();
                s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                    .unwrap();
                let mut bytes = Vec::new();
                s.read_to_end(&mut bytes).unwrap();
                Response::parse(&bytes).status
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), 200);
    }
    ex.scrape();
    ex.stop();
}

/// The Kubernetes layout (deploy/): every container's shim makes its own
/// directory under one shared parent, and one exporter reads them all
/// through `--dir PARENT/*`, labelling each process with its pod.
#[test]
fn one_exporter_reads_a_directory_per_container_through_a_pattern() {
    let root = fresh_dir("exporter-pods");
    let a_dir = root.join("0b7f-uid-a_main");
    let b_dir = root.join("91c2-uid-b_main");
    let a = held(
        &a_dir,
        Some("1GiB"),
        &[
            ("POD_NAME", "trainer-0"),
            ("POD_NAMESPACE", "ml"),
            ("CONTAINER_NAME", "main"),
        ],
        &["init", "alloc", "300M", "wait"],
    );
    let b = held(
        &b_dir,
        Some("2GiB"),
        &[
            ("POD_NAME", "infer-1"),
            ("POD_NAMESPACE", "serve"),
            ("CONTAINER_NAME", "main"),
        ],
        &["init", "alloc", "700M", "wait"],
    );
    // The shim made each directory itself, closed to others.
    for d in [&a_dir, &b_dir] {
        let mode =
            std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(d).unwrap().permissions());
        assert_eq!(mode & 0o777, 0o700, "{}", d.display());
    }
    // Neither a hidden directory nor a file is a container's directory, and
    // an empty one (a container that has not used CUDA yet) is no error.
    std::fs::create_dir(root.join(".staging")).unwrap();
    std::fs::write(root.join("README"), b"not a directory").unwrap();
    std::fs::create_dir(root.join("c3d4-uid-c_main")).unwrap();

    let pattern = format!("{}/*", root.display());
    // The environment's directory is not read when --dir is given.
    let elsewhere = fresh_dir("exporter-pods-unused");
    let ex = Exporter::start_with(&elsewhere, &["--dir", &pattern]);
    let m = ex.scrape();
    let (pa, pb) = (a.pid().to_string(), b.pid().to_string());
    let mut want = vec![pa.clone(), pb.clone()];
    want.sort();
    assert_eq!(m.pids(), want, "{}", m.text);
    for (pid, pod, ns, used, limit) in [
        (&pa, "trainer-0", "ml", 300u64 << 20, 1u64 << 30),
        (&pb, "infer-1", "serve", 700 << 20, 2 << 30),
    ] {
        let labels = [
            ("pid", pid.as_str()),
            ("gpu", "0"),
            ("UUID", UUID0),
            ("pod", pod),
            ("namespace", ns),
            ("container", "main"),
        ];
        assert_eq!(
            m.value("vramcap_gpu_memory_used_bytes", &labels),
            Some(used),
            "{}",
            m.text
        );
        assert_eq!(
            m.value("vramcap_gpu_memory_limit_bytes", &labels),
            Some(limit),
            "{}",
            m.text
        );
    }
    assert_eq!(m.value("vramcap_pages_skipped", &[]), Some(0), "{}", m.text);

    // `stat` reads the same way and says where each page was found.
    let mut cmd: Command = bare(&artefacts().cli);
    cmd.env("VRAMCAP_STATS_DIR", &elsewhere)
        .args(["stat", "--json", "--dir", &pattern]);
    let j: Json = serde_json::from_str(&run(cmd).ok_lines().join("")).unwrap();
    assert_eq!(j["dir"], pattern.as_str());
    assert_eq!(j["dirs"], serde_json::json!([pattern]));
    let procs = j["processes"].as_array().unwrap();
    let dir_of = |pid: &str| {
        procs
            .iter()
            .find(|p| p["pid"].as_u64().map(|n| n.to_string()).as_deref() == Some(pid))
            .map(|p| p["dir"].as_str().unwrap().to_string())
    };
    assert_eq!(dir_of(&pa), Some(a_dir.display().to_string()));
    assert_eq!(dir_of(&pb), Some(b_dir.display().to_string()));

    // A container that ends is gone from the next scrape.
    let (_, out) = a.finish();
    assert!(out.status.success());
    assert_eq!(ex.scrape().pids(), std::slice::from_ref(&pb));
    b.finish();
    ex.stop();
}

/// A pattern whose fixed part is missing (say, a kubelet that keeps its
/// pods elsewhere) is said once at start, not left to look like "no
/// processes".
#[test]
fn a_pattern_under_a_missing_directory_is_said_at_start() {
    let dir = fresh_dir("exporter-missing-prefix");
    let missing = dir.join("no-such-kubelet/pods");
    let pattern = format!("{}/*/volumes", missing.display());
    let ex = Exporter::start_with(&dir, &["--dir", &pattern]);
    assert_eq!(
        ex.before,
        [format!(
            "vramcap: --dir {pattern}: {} is not a directory, so nothing matches the pattern until it is",
            missing.display()
        )]
    );
    assert_eq!(ex.scrape().pids(), Vec::<String>::new());
    ex.stop();
}

/// `--dir` values: absolute, and `*` only as a whole component.
#[test]
fn bad_dir_values_exit_2_with_one_line() {
    let dir = fresh_dir("exporter-bad-dir");
    for (sub, bad, want) in [
        (
            "exporter",
            "pods/*",
            "expected an absolute directory path, or a pattern such as /run/vramcap/pods/*",
        ),
        (
            "stat",
            "/run/vramcap/pod-*",
            "`*` must be a whole path component (it stands for every subdirectory there), not part of \"pod-*\"",
        ),
        (
            "top",
            "run/vramcap",
            "expected an absolute directory path, or a pattern such as /run/vramcap/pods/*",
        ),
    ] {
        let mut cmd = bare(&artefacts().cli);
        cmd.env("VRAMCAP_STATS_DIR", &dir).args([sub, "--dir", bad]);
        let ran = run(cmd);
        ran.expect_code(2);
        let err = ran.stderr();
        assert!(
            err.starts_with(&format!("vramcap: --dir \"{bad}\" is not valid: "))
                && err.trim_end().ends_with(want)
                && err.lines().count() == 1,
            "{err}"
        );
    }
}

/// A directory that cannot be read is a server error (Prometheus marks the
/// target down), said once on stderr; the exporter keeps serving.
#[test]
fn an_unreadable_directory_answers_500() {
    let dir = fresh_dir("exporter-500");
    let file = dir.join("not-a-directory");
    std::fs::write(&file, b"").unwrap();
    let mut ex = Exporter::start(&file);
    let r = ex.get("/metrics");
    assert_eq!(r.status, 500, "{r:?}");
    let want = format!(
        "vramcap: cannot read the stats directory {}: Not a directory (os error 20)",
        file.display()
    );
    assert_eq!(r.body.trim_end(), want);
    let mut line = String::new();
    ex.stderr.read_line(&mut line).unwrap();
    assert_eq!(line.trim_end(), want);
    assert_eq!(ex.get("/metrics").status, 500);
    assert_eq!(ex.get("/").status, 200);
    ex.stop();
}

#[test]
fn bad_listen_values_exit_2_with_one_line() {
    let dir = fresh_dir("exporter-listen");
    let exporter = |listen: &str| {
        let mut cmd = bare(&artefacts().cli);
        cmd.env("VRAMCAP_STATS_DIR", &dir)
            .args(["exporter", "--listen", listen]);
        run(cmd)
    };
    for bad in ["foo", "127.0.0.1", "127.0.0.1:99999", "9400", ""] {
        let ran = exporter(bad);
        ran.expect_code(2);
        assert_eq!(
            ran.stderr(),
            format!(
                "vramcap: --listen \"{bad}\" is not valid: expected ADDRESS:PORT, e.g. 127.0.0.1:9400\n"
            )
        );
    }
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let ran = exporter(&addr);
    ran.expect_code(2);
    assert_eq!(
        ran.stderr(),
        format!("vramcap: cannot listen on {addr}: Address already in use\n")
    );
}
