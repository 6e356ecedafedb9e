//! The exporter's HTTP/1.1 serving: one request per connection, its head
//! parsed by `httparse`, the answer written whole, then the connection
//! closed gently.
//!
//! `httparse` (the parser under hyper) checks the request line and the
//! header fields. What no HTTP crate enforces the way the exporter needs is
//! this module's, a thin layer around it:
//!
//! - the head (request line and headers) may take [`MAX_HEAD`] bytes
//!   (431 past that) and must arrive within [`READ_TIMEOUT`] of the first
//!   read (408 after); the whole answer must be taken by the client within
//!   [`WRITE_TIMEOUT`] (a total, not per write), else the connection is
//!   closed;
//! - at most [`MAX_CONNECTIONS`] are served at once, one thread each. When
//!   all are taken, the oldest that is idle (its head has not come, or its
//!   answer is sent and it is only being drained) gives way to the new one:
//!   it is answered 408 (or just closed) at once. When none is idle, the
//!   oldest whose answer is still being written (a client that does not
//!   read it: an answer larger than the socket buffers waits on it) is
//!   closed instead. Only when every one is busy working out its answer is
//!   the new one answered 503. So idle, slow or non-reading clients,
//!   however many and however often they reconnect, never keep a scrape
//!   out: a scrape sends its head at once, reads its answer at once, and
//!   is then never the oldest idle or stalled connection for long;
//! - every answer is `HTTP/1.1`, with `Content-Length`, `Cache-Control:
//!   no-store` and `Connection: close`; a request body is never read, only
//!   drained (at most [`MAX_DRAIN`] bytes for [`DRAIN_TIMEOUT`]) after the
//!   answer, so closing does not reset the connection and lose the answer;
//! - a malformed request is 400, one of another HTTP version 505, whatever
//!   it holds; a client that goes away is no error. Nothing a client sends
//!   can make the server panic or stop.
//!
//! What to answer a well-formed request is the caller's ([`serve`]'s
//! handler); this module knows no paths.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The most bytes a request line and its headers may take.
const MAX_HEAD: usize = 8192;
/// How long a client has to send its request head.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client has to take its whole answer.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once; more are answered 503.
const MAX_CONNECTIONS: usize = 64;
/// What is read (and dropped) after the answer, so closing never resets it.
const MAX_DRAIN: usize = 1 << 20;
const DRAIN_TIMEOUT: Duration = Duration::from_secs(1);
/// More header fields than a head of [`MAX_HEAD`] bytes can hold (the
/// shortest field line is `a:` and a newline), so no head within the
/// limit has too many.
const MAX_HEADERS: usize = MAX_HEAD / 3 + 1;

/// A request the handler is asked to answer.
#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    /// The path, without query or fragment.
    pub path: String,
}

/// What a handler answers.
pub type Handler = dyn Fn(&Request) -> Vec<u8> + Send + Sync;

/// An I/O error's text without Rust's " (os error N)" suffix.
pub fn error_text(e: &io::Error) -> String {
    let s = e.to_string();
    match s.rfind(" (os error ") {
        Some(i) if s.ends_with(')') => s[..i].to_string(),
        _ => s,
    }
}

/// Where a connection is: waiting for its head, working out its answer,
/// writing it, draining after it, or closed to make room for another.
const HEAD: u8 = 0;
const BUSY: u8 = 1;
const DRAIN: u8 = 2;
const EVICTED: u8 = 3;
const WRITE: u8 = 4;

/// A connection being served: a handle on its socket (to close it from the
/// accepting thread) and where it is. Moves are compare-and-swaps, so a
/// connection is either taken back from its thread or answered by it,
/// never both.
struct Conn {
    id: u64,
    stream: TcpStream,
    state: Arc<AtomicU8>,
}

/// The connections being served, oldest first.
type Open = Arc<Mutex<Vec<Conn>>>;

/// Leaves the list of open connections when its thread ends.
struct Slot {
    open: Open,
    id: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.retain(|c| c.id != self.id);
    }
}

/// With every slot taken: closes the oldest idle connection (its head not
/// come yet: answered 408; or draining after its answer), or when none is
/// idle the oldest still writing its answer (its client is not reading:
/// a client that reads takes an answer at once), and says whether one was.
fn evict_oldest_idle(open: &mut Vec<Conn>) -> bool {
    if evict_idle(open) {
        return true;
    }
    for i in 0..open.len() {
        if open[i]
            .state
            .compare_exchange(WRITE, EVICTED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            // Wakes its thread (its write then fails); it leaves at once.
            let _ = open.remove(i).stream.shutdown(Shutdown::Both);
            return true;
        }
    }
    false
}

fn evict_idle(open: &mut Vec<Conn>) -> bool {
    for i in 0..open.len() {
        let state = &open[i].state;
        let was_head = state
            .compare_exchange(HEAD, EVICTED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        let was_drain = !was_head
            && state
                .compare_exchange(DRAIN, EVICTED, Ordering::AcqRel, Ordering::Acquire)
                .is_ok();
        if !(was_head || was_drain) {
            continue;
        }
        let mut c = open.remove(i);
        if was_head {
            let _ = c.stream.set_write_timeout(Some(Duration::from_millis(10)));
            let _ = c.stream.write_all(&error_response(
                408,
                "request timeout: no request came and another client needed the connection\n",
            ));
        }
        // Wakes its thread (a read then ends); the thread leaves at once.
        let _ = c.stream.shutdown(Shutdown::Both);
        return true;
    }
    false
}

/// Accepts connections on `listener` for ever, each answered by `handler`
/// on a thread of its own.
pub fn serve(listener: TcpListener, handler: Arc<Handler>) -> ! {
    let open: Open = Arc::new(Mutex::new(Vec::new()));
    let mut next_id = 0u64;
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
        let state = Arc::new(AtomicU8::new(HEAD));
        let id = next_id;
        next_id += 1;
        {
            let mut list = open.lock().unwrap_or_else(|p| p.into_inner());
            let full = list.len() >= MAX_CONNECTIONS && !evict_oldest_idle(&mut list);
            let handle_copy = if full { None } else { stream.try_clone().ok() };
            let Some(copy) = handle_copy else {
                drop(list);
                let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
                let _ = stream.write_all(&response(
                    503,
                    "text/plain; charset=utf-8",
                    &[],
                    b"too many connections\n",
                    false,
                ));
                continue;
            };
            list.push(Conn {
                id,
                stream: copy,
                state: state.clone(),
            });
        }
        let slot = Slot {
            open: open.clone(),
            id,
        };
        let handler = handler.clone();
        // A thread that cannot start drops the closure, its slot and stream.
        let _ = std::thread::Builder::new()
            .name("vramcap-http".into())
            .spawn(move || {
                let _slot = slot;
                handle(stream, &*handler, &state);
            });
    }
}

fn handle(mut stream: TcpStream, handler: &Handler, state: &AtomicU8) {
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    let _ = stream.set_nodelay(true);
    let head = read_head(&mut stream);
    // Busy from here on; a connection closed to make room is left alone.
    if state
        .compare_exchange(HEAD, BUSY, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return;
    }
    let answer = match head {
        Ok(head) => match parse_request(&head) {
            Ok(req) => handler(&req),
            Err(505) => error_response(505, "only HTTP/1.0 and HTTP/1.1 are served\n"),
            Err(status) => error_response(status, "malformed request\n"),
        },
        Err(HeadError::TooLarge) => error_response(431, "request head too large\n"),
        Err(HeadError::Timeout) => error_response(408, "request timeout\n"),
        Err(HeadError::Gone) => return,
    };
    // Being written: a client that does not read it may be closed to make
    // room from here on.
    if state
        .compare_exchange(BUSY, WRITE, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return;
    }
    if write_within(&mut stream, &answer, WRITE_TIMEOUT).is_err() {
        return;
    }
    // Close gently: unread input (a body, a second request) would otherwise
    // make the kernel reset the connection and the client lose the answer.
    let _ = stream.shutdown(Shutdown::Write);
    // Idle again: a new connection may take this one's place (unless it
    // was closed to make room just as the answer was taken).
    if state
        .compare_exchange(WRITE, DRAIN, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return;
    }
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

/// Writes all of `buf` within `limit` in total (each write waits only for
/// what is left of it), so a client that reads a byte now and then cannot
/// hold its connection for longer.
fn write_within(stream: &mut TcpStream, mut buf: &[u8], limit: Duration) -> io::Result<()> {
    let deadline = Instant::now() + limit;
    while !buf.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        stream.set_write_timeout(Some(left))?;
        match stream.write(buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
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

/// Reads up to the end of the head, within [`MAX_HEAD`] bytes and
/// [`READ_TIMEOUT`].
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

/// Parses a whole request head; `Err(status)` for what cannot be served.
///
/// On top of `httparse`'s checks: the head must be UTF-8 as a whole, the
/// target printable ASCII in origin form (`/path?query`), absolute form
/// (`http://host/path`) or `*`; and a request line that is well formed but
/// for its version (`HTTP/2.0`) is 505, not 400.
fn parse_request(head: &[u8]) -> Result<Request, u16> {
    let text = std::str::from_utf8(head).map_err(|_| 400u16)?;
    let mut headers = vec![httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        // The head ended at a blank line, so a part missing is malformed.
        Ok(httparse::Status::Partial) => return Err(400),
        Err(httparse::Error::Version) => return Err(version_status(text)),
        Err(httparse::Error::TooManyHeaders) => return Err(431),
        Err(_) => return Err(400),
    }
    let (Some(method), Some(target)) = (req.method, req.path) else {
        return Err(400);
    };
    if !is_target(target) {
        return Err(400);
    }
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

fn is_target(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic())
}

/// The status for a request line `httparse` refused for its version: 505
/// when it is `METHOD TARGET HTTP/d.d` (a version this server does not
/// speak), else 400.
fn version_status(head: &str) -> u16 {
    let line = head
        .split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .find(|l| !l.is_empty())
        .unwrap_or("");
    let parts: Vec<&str> = line.split(' ').collect();
    let [_, target, version] = parts[..] else {
        return 400;
    };
    let v = version.as_bytes();
    let other_version = v.len() == 8
        && v.starts_with(b"HTTP/")
        && v[5].is_ascii_digit()
        && v[6] == b'.'
        && v[7].is_ascii_digit();
    if other_version && is_target(target) {
        505
    } else {
        400
    }
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

/// A whole answer: status line, headers, and the body unless `head_only`
/// (a `HEAD` request, which still gets the body's `Content-Length`).
pub fn response(
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

/// A plain-text answer with this status.
pub fn error_response(status: u16, text: &str) -> Vec<u8> {
    response(
        status,
        "text/plain; charset=utf-8",
        &[],
        text.as_bytes(),
        false,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// Where `httparse` and the head's own checks meet: the version is
    /// judged only on an otherwise good request line, and the most header
    /// fields a head within the limit can hold are accepted.
    #[test]
    fn versions_and_header_counts() {
        for (head, status) in [
            ("GET /metrics HTTP/3.0\r\n\r\n", 505),
            ("GET /metrics HTTP/2.0 x\r\n\r\n", 400),
            ("GET /\u{e9} HTTP/2.0\r\n\r\n", 400),
            ("GET /metrics HTTP/1.10\r\n\r\n", 400),
            ("GET /metrics HTTP/1.1\r\nA: b\rc\r\n\r\n", 400),
        ] {
            assert_eq!(parse_request(head.as_bytes()), Err(status), "{head:?}");
        }
        let mut head = String::from("GET /metrics HTTP/1.1\n");
        while head.len() + 4 < MAX_HEAD {
            head.push_str("a:\n");
        }
        head.push('\n');
        assert!(head.len() <= MAX_HEAD);
        assert_eq!(
            parse_request(head.as_bytes()).map(|r| r.path),
            Ok("/metrics".to_string())
        );
    }
}
