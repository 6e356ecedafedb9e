//! The exporter against what a tenant can do from outside (the cases of
//! `readers`, for the reader that runs as root with `--all-users` in the
//! DaemonSet): truncate a page under it, plant thousands of live pages,
//! put escape sequences and quotes in a page or a directory name.

use std::time::Instant;

use super::*;
use crate::readers::{Forge, Truncator, forge, forge_full_pages, peak_rss, room_for_files};

/// A page truncated and restored without pause while the exporter is
/// scraped 300 times: every answer is 200, the exporter lives on (it used
/// to die of SIGBUS, exit 135), and the page, when shown, has its values.
#[test]
fn a_page_truncated_under_the_exporter_never_kills_it() {
    let dir = scratch_dir();
    let page = forge(&dir, &Forge::pid(940_001));
    let ex = Exporter::start(&dir);
    let t = Truncator::start(&page.file, &page.bytes);
    let mut shown = 0;
    for _ in 0..300 {
        let m = ex.scrape();
        if let Some(v) = m.value("vramcap_gpu_memory_used_bytes", &[("pid", "940001")]) {
            assert_eq!(v, 1 << 20);
            shown += 1;
        }
    }
    let rounds = t.finish();
    eprintln!("{rounds} truncations; the page was in {shown} of 300 scrapes");
    assert!(
        rounds > 100,
        "the truncations overlapped the scrapes: {rounds}"
    );
    ex.stop();
}

/// 2000 forged live pages, each claiming all 64 GPUs (35 MB of pages): one
/// scrape holds the first 4096 process-GPU rows, counts the 1936 pages it
/// left out in `vramcap_pages_skipped`, and the exporter stays small and
/// fast (it used to take 385 MB and 3 s).
#[test]
fn two_thousand_forged_pages_cost_a_scrape_a_bounded_amount() {
    const N: u32 = 2000;
    room_for_files(N as u64);
    // Named by hand, short: the path is in the `dir` label of each of the
    // scrape's ~90,000 samples, which the bound on its size counts.
    let dir = fresh_dir("exporter-bounded");
    let forged = forge_full_pages(&dir, 950_000, N);
    let ex = Exporter::start(&dir);
    let start = Instant::now();
    let r = ex.get("/metrics");
    let took = start.elapsed();
    assert_eq!(r.status, 200);
    let m = Metrics::parse(&r.body);
    assert_eq!(m.pids().len(), 64);
    assert_eq!(m.find("vramcap_gpu_memory_used_bytes", &[]).len(), 4096);
    assert_eq!(m.value("vramcap_pages_skipped", &[]), Some(1936));
    let rss = peak_rss(ex.child.id());
    eprintln!(
        "one scrape of {N} forged pages: {took:?}, {} KiB of metrics, exporter peak RSS {} MiB",
        r.body.len() >> 10,
        rss >> 20
    );
    assert!(r.body.len() < 16 << 20, "{} bytes", r.body.len());
    assert!(rss < 96 << 20, "peak RSS {rss}");
    ex.stop();
    drop(forged);
}

/// Escape sequences, quotes, newlines and bytes that are not UTF-8 in a
/// page's command and identity, and in the directory name a `*` matched:
/// every label value is printable, the exposition stays one sample per
/// line, and the values are what `stat --json` shows. (No `}` in a value:
/// the format allows it, the test's parser does not.)
#[test]
fn hostile_text_in_pages_and_directory_names_is_escaped_in_labels() {
    let root = scratch_dir();
    let sub = root.join("pod\x1b[2J\"x\"\n\u{202e}");
    std::fs::create_dir(&sub).unwrap();
    let page = forge(
        &sub,
        &Forge::hostile(960_001, b"g\"x\n", b"p\x07od", b"n\xffs"),
    );
    let pattern = format!("{}/*", root.display());
    let ex = Exporter::start_with(&root, &["--dir", &pattern]);
    let r = ex.get("/metrics");
    assert_eq!(r.status, 200);
    let bad: Vec<char> = r
        .body
        .chars()
        .filter(|c| c.is_control() && *c != '\n' || *c == '\u{202e}')
        .collect();
    assert!(bad.is_empty(), "control characters in the scrape: {bad:?}");
    let m = Metrics::parse(&r.body);
    let s = m.find("vramcap_gpu_memory_used_bytes", &[("pid", "960001")]);
    assert_eq!(s.len(), 1, "{}", r.body);
    // The parser leaves the format's escapes in: compare with them.
    let labels = &s[0].labels;
    let get = |k: &str| labels.get(k).map(str::to_string);
    let esc = |v: &str| Some(v.replace('\\', "\\\\").replace('"', "\\\""));
    assert_eq!(get("command"), esc(crate::readers::SHOWN_COMMAND));
    assert_eq!(get("group"), esc("g\"x\\x0a"));
    assert_eq!(get("pod"), esc("p\\x07od"));
    assert_eq!(get("namespace"), esc("n\\xffs"));
    assert_eq!(
        get("dir"),
        esc(&format!("{}/pod\\x1b[2J\"x\"\\x0a\\u202e", root.display()))
    );
    // And they are what `stat --json` shows.
    let mut cmd: Command = bare(&artefacts().cli);
    cmd.args(["stat", "--json", "--dir", &pattern]);
    let j: Json = serde_json::from_str(&run(cmd).ok_lines().join("")).unwrap();
    let p = &j["processes"][0];
    assert_eq!(get("command"), p["command"].as_str().and_then(esc));
    assert_eq!(get("pod"), p["pod"].as_str().and_then(esc));
    assert_eq!(get("dir"), p["dir"].as_str().and_then(esc));
    ex.stop();
    drop(page);
}

/// 64 clients (every slot) that ask for a large `/metrics` (1536
/// process-GPU rows, 6 MB: more than the socket buffers hold) and
/// never read it: a scrape after them still answers 200 at once, and so
/// do the ones after it while they keep the connections open. The oldest
/// connection whose answer is not being taken is closed to make room. It
/// used to answer 503 to every scrape while their writes waited (10 s
/// each, and for good if they were reopened).
#[test]
fn clients_that_never_read_a_large_scrape_never_keep_scrapes_out() {
    use std::time::Duration;
    const STALLED: usize = 64;
    let dir = fresh_dir("exporter-stalled");
    let forged = forge_full_pages(&dir, 970_000, 24);
    let ex = Exporter::start(&dir);
    let t0 = Instant::now();
    let size = ex.get("/metrics").body.len();
    eprintln!("one scrape: {size} bytes in {:?}", t0.elapsed());
    assert!(size > 5 << 20, "a large scrape: {size} bytes");
    let stalled: Vec<TcpStream> = (0..STALLED)
        .map(|_| {
            let s = TcpStream::connect(ex.addr).expect("connect");
            (&s).write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap();
            s
        })
        .collect();
    // Every one's answer has started (the exporter is writing to all 64):
    // its first bytes are there to peek at, none of it is taken.
    for s in &stalled {
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        let mut b = [0u8; 16];
        assert_eq!(s.peek(&mut b).expect("the answer starts"), 16);
        assert_eq!(&b[..12], b"HTTP/1.1 200");
    }
    eprintln!("all {STALLED} answers started after {:?}", t0.elapsed());
    for round in 0..5 {
        let start = Instant::now();
        let r = ex.get("/metrics");
        let took = start.elapsed();
        assert_eq!(r.status, 200, "scrape {round}: {:?}", r.headers);
        assert_eq!(r.body.len(), size, "scrape {round}");
        assert!(
            took < Duration::from_secs(5),
            "scrape {round} took {took:?}"
        );
    }
    // The oldest stalled ones were closed: the end of their answer never
    // comes (read until the connection ends, within the deadline).
    let mut first = &stalled[0];
    let mut bytes = Vec::new();
    first
        .read_to_end(&mut bytes)
        .expect("closed, not timed out");
    assert!(bytes.len() < size, "{} bytes of {size}", bytes.len());
    drop(stalled);
    ex.scrape();
    ex.stop();
    drop(forged);
}
