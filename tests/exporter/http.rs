//! How the exporter answers over HTTP: paths, methods, malformed and
//! oversized requests, clients that go away, concurrent scrapes, a
//! directory that cannot be read, and addresses it cannot listen on.

use super::*;

#[test]
fn http_answers_and_bad_requests_never_stop_the_exporter() {
    let dir = scratch_dir();
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

/// A directory that cannot be read is a server error (Prometheus marks the
/// target down), said once on stderr; the exporter keeps serving.
#[test]
fn an_unreadable_directory_answers_500() {
    let dir = scratch_dir();
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
    let dir = scratch_dir();
    let exporter = |listen: &str| {
        let mut cmd = bare(&artefacts().cli);
        cmd.env("VRAMCAP_STATS_DIR", &dir)
            .args(["exporter", "--listen", listen]);
        run(cmd)
    };
    for bad in ["foo", "127.0.0.1", "127.0.0.1:99999", "10077", ""] {
        let ran = exporter(bad);
        ran.expect_code(2);
        assert_eq!(
            ran.stderr(),
            format!(
                "vramcap: --listen \"{bad}\" is not valid: expected ADDRESS:PORT, e.g. 127.0.0.1:10077\n"
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

/// 200 idle connections held open (a client that connects and sends
/// nothing, as a port scanner or a hostile pod does), and more opened
/// between scrapes, then slow ones (a head trickled in part, an answer
/// never read): every scrape still answers 200 within a second. The
/// oldest connection still waiting for its head gives way to a new one
/// (it is answered 408 and closed). It used to answer 503 to every scrape
/// until the idle ones timed out, 10 s later, and for good if they were
/// reopened.
#[test]
fn idle_connections_never_keep_scrapes_out() {
    use std::time::{Duration, Instant};
    let dir = crate::util::scratch_dir();
    let ex = Exporter::start(&dir);
    let mut idle: Vec<TcpStream> = (0..200)
        .map(|_| TcpStream::connect(ex.addr).expect("connect"))
        .collect();
    for round in 0..20 {
        let start = Instant::now();
        let r = ex.get("/metrics");
        let took = start.elapsed();
        assert_eq!(r.status, 200, "scrape {round}: {r:?}");
        assert!(
            took < Duration::from_secs(1),
            "scrape {round} took {took:?}"
        );
        idle.extend((0..10).map(|_| TcpStream::connect(ex.addr).expect("connect")));
    }
    // Slow clients: heads trickled in part, and whole requests whose
    // answers are never read. Scrapes still get in.
    for i in 0..100 {
        let mut s = TcpStream::connect(ex.addr).expect("connect");
        let raw: &[u8] = if i % 2 == 0 {
            b"GET /metr"
        } else {
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
        };
        s.write_all(raw).unwrap();
        idle.push(s);
        if i % 10 == 9 {
            let start = Instant::now();
            assert_eq!(ex.get("/metrics").status, 200, "among slow clients {i}");
            assert!(
                start.elapsed() < Duration::from_secs(1),
                "{:?}",
                start.elapsed()
            );
        }
    }
    // The oldest idle connection was answered and closed.
    let mut first = idle.remove(0);
    first
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut bytes = Vec::new();
    first.read_to_end(&mut bytes).unwrap();
    let r = Response::parse(&bytes);
    assert_eq!(r.status, 408, "{r:?}");
    assert_eq!(
        r.body,
        "request timeout: no request came and another client needed the connection\n"
    );
    drop(idle);
    ex.scrape();
    ex.stop();
}
