//! A lying HTTP proxy on loopback in front of a real server (moto, the
//! distribution registry): every request is passed through unchanged,
//! except the next GETs (or, for [`Lie::ForbidHead`], HEADs) of an object
//! a [`Lie`] was armed for. It speaks plain HTTP/1.1, one request per
//! connection (it answers `Connection: close`), which every client the
//! tests drive handles.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the proxy does to one GET (one HEAD for [`Lie::ForbidHead`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lie {
    /// Answers `code` with no body; nothing goes upstream (an expired
    /// presigned URL's `403`, a token the server refuses: `401`).
    Status {
        /// The status.
        code: u16,
    },
    /// Passes the answer on with a `Content-Range` for the range asked
    /// moved `by` bytes on (its body unchanged): the header says the
    /// body holds other bytes than those asked.
    ShiftRange {
        /// Bytes the range is moved by.
        by: u64,
    },
    /// Passes the answer on without its last `drop` body bytes, its
    /// `Content-Length` saying so: an honest answer from a store whose
    /// copy is truncated.
    Truncate {
        /// Bytes left off the end.
        drop: usize,
    },
    /// Passes a Xet reconstruction answer (v2 JSON) on edited.
    Reconstruction(ReconEdit),
    /// Answers a ranged GET with `200` and the whole object: the request
    /// goes upstream without its `Range`.
    IgnoreRange,
    /// Sends the answer's head (its full `Content-Length`) and `after`
    /// body bytes, then closes the connection.
    ShortBody {
        /// Body bytes sent before the close.
        after: usize,
    },
    /// Sends the answer's head chunked (no `Content-Length`), its body, and
    /// then zeros without end (at most [`ENDLESS_CAP`] bytes, or until the
    /// client hangs up).
    Endless,
    /// Answers a ranged GET `416 Range Not Satisfiable` (`Content-Range:
    /// bytes */SIZE` of the object upstream), whatever was asked.
    RefuseRange,
    /// Passes the answer on with its status line made `200 OK` (its
    /// headers and body unchanged): a server that says it sent the whole
    /// object.
    StatusOk,
    /// Passes the answer with the body byte at `at` flipped (the bytes no
    /// longer those of the object's digest).
    Corrupt {
        /// Offset in the body of the flipped byte.
        at: usize,
    },
    /// Answers `503 Slow Down` with S3's `SlowDown` error document, as S3
    /// does when it sheds load; nothing goes upstream.
    SlowDown,
    /// Answers a HEAD `403 Forbidden` with no body, as S3 answers a HEAD
    /// its policy refuses (a HEAD never carries an error document); nothing
    /// goes upstream.
    ForbidHead,
    /// Sends the answer's head and `after` body bytes, then nothing for
    /// `hold` (the connection open), then the rest.
    Stall {
        /// Body bytes sent before the stall.
        after: usize,
        /// How long nothing is sent.
        hold: Duration,
    },
}

/// How [`Lie::Reconstruction`] edits a v2 reconstruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReconEdit {
    /// The terms hold fewer bytes than asked: the last term left off (one
    /// byte less in it when it is the only one).
    FewerBytes,
    /// The terms hold more bytes than asked: the last term twice.
    MoreBytes,
    /// The last term ends one chunk past the chunks its xorb's fetch
    /// ranges hold.
    TermPastChunks,
    /// The byte range of the fetch holding the last term ends 4 KiB
    /// past where it does (past the xorb's end when the term ends it).
    BytesPastRange,
    /// The last term and the fetch range holding it end one chunk
    /// further (past the xorb's last chunk when the term ends the xorb),
    /// the byte range unchanged.
    RangeOneChunkShort,
}

/// The most an [`Lie::Endless`] answer sends: the proxy's own loop is
/// bounded even if a client never hangs up.
pub const ENDLESS_CAP: usize = 1 << 30;

/// One request as the proxy saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// `GET`, `HEAD`, ...
    pub method: String,
    /// The request target.
    pub target: String,
    /// Its `Range`, if any.
    pub range: Option<String>,
    /// The access key id its `Authorization` header names, if any.
    pub key_id: Option<String>,
    /// Its `Authorization` header, if any.
    pub authorization: Option<String>,
}

#[derive(Default)]
struct Book {
    /// Armed lies: (suffix of the request path, lie), in arming order.
    lies: Vec<(String, Lie)>,
    seen: Vec<Seen>,
    /// The `Host` every request is passed upstream with, when set.
    host: Option<String>,
    /// Answer body bytes handed to the kernel, by request target.
    sent: Vec<(String, u64)>,
    /// How long every PUT is held before it goes upstream.
    put_hold: Option<Duration>,
    /// When each request was in flight: from its head read to just before
    /// the last piece of its answer was written (`None`: not yet, or an
    /// answer a lie other than a short body replaced or cut). A client asks
    /// again on a connection only after that last piece, so one client's
    /// sequential requests never overlap here.
    spans: Vec<(String, Instant, Option<Instant>)>,
}

/// The proxy; stops accepting when dropped (its thread ends with the
/// test process).
pub struct LyingProxy {
    addr: SocketAddr,
    book: Arc<Mutex<Book>>,
}

impl LyingProxy {
    /// A proxy in front of `upstream` (`http://HOST:PORT`).
    pub fn start(upstream: &str) -> LyingProxy {
        let upstream: SocketAddr = upstream
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .parse()
            .expect("upstream as http://IP:PORT");
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let addr = listener.local_addr().unwrap();
        let book = Arc::new(Mutex::new(Book::default()));
        let shared = book.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let book = shared.clone();
                std::thread::spawn(move || {
                    let _ = serve(conn, upstream, &book);
                });
            }
        });
        LyingProxy { addr, book }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Tells `lie` to the next `times` GETs whose path ends with
    /// `/suffix` ([`Lie::IgnoreRange`]: the next ranged ones).
    pub fn lie(&self, suffix: &str, lie: Lie, times: usize) {
        let mut book = self.book.lock().unwrap();
        for _ in 0..times {
            book.lies.push((format!("/{suffix}"), lie));
        }
    }

    /// Passes every request upstream with `Host: host` (a server that
    /// builds URLs from it then names another host).
    pub fn rewrite_host(&self, host: &str) {
        self.book.lock().unwrap().host = Some(host.to_owned());
    }

    /// Holds every PUT `hold` (its body read) before passing it upstream:
    /// a store slow to take each object, whose puts overlap only when the
    /// client sends them at once.
    pub fn hold_puts(&self, hold: Duration) {
        self.book.lock().unwrap().put_hold = Some(hold);
    }

    /// Answer body bytes sent so far (written to the socket) to requests
    /// whose target contains `part`.
    pub fn body_bytes_sent(&self, part: &str) -> u64 {
        let book = self.book.lock().unwrap();
        book.sent
            .iter()
            .filter(|(t, _)| t.contains(part))
            .map(|(_, n)| n)
            .sum()
    }

    /// The most requests whose target contains `part` that were in flight
    /// at once (see `Book::spans`; one still in flight counts as such).
    pub fn peak_in_flight(&self, part: &str) -> usize {
        let book = self.book.lock().unwrap();
        // (when, is a start): at one instant an end sorts before a start.
        let mut edges: Vec<(Instant, bool)> = Vec::new();
        for (_, start, end) in book.spans.iter().filter(|(t, ..)| t.contains(part)) {
            edges.push((*start, true));
            if let Some(end) = end {
                edges.push((*end, false));
            }
        }
        edges.sort();
        let (mut now, mut peak) = (0usize, 0usize);
        for (_, start) in edges {
            if start {
                now += 1;
                peak = peak.max(now);
            } else {
                now = now.saturating_sub(1);
            }
        }
        peak
    }

    /// Every request seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.book.lock().unwrap().seen.clone()
    }
}

/// One request: read, passed upstream (lied about if armed), answered.
fn serve(conn: TcpStream, upstream: SocketAddr, book: &Mutex<Book>) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut head = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        if line == "\r\n" {
            break;
        }
        head.push(line.trim_end().to_owned());
    }
    let Some(request_line) = head.first().cloned() else {
        return Ok(());
    };
    let mut parts = request_line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_owned();
    let target = parts.next().unwrap_or_default().to_owned();
    let header = |name: &str| {
        head.iter().skip(1).find_map(|h| {
            let (k, v) = h.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    };
    let range = header("range");
    let length: usize = header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    let lie = take_lie(book, &method, &target, range.is_some());
    let span = {
        let mut b = book.lock().unwrap();
        b.spans.push((target.clone(), Instant::now(), None));
        b.spans.len() - 1
    };
    book.lock().unwrap().seen.push(Seen {
        method,
        target: target.clone(),
        range: range.clone(),
        key_id: header("authorization").and_then(|a| {
            let (_, rest) = a.split_once("Credential=")?;
            rest.split('/').next().map(str::to_owned)
        }),
        authorization: header("authorization"),
    });
    if let Some(Lie::Status { code }) = lie {
        let mut conn = conn;
        let canned =
            format!("HTTP/1.1 {code} Lied\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        conn.write_all(canned.as_bytes())?;
        conn.flush()?;
        return conn.shutdown(Shutdown::Both);
    }
    if let Some(canned @ (Lie::SlowDown | Lie::ForbidHead)) = lie {
        let mut conn = conn;
        conn.write_all(if canned == Lie::SlowDown {
            SLOW_DOWN.as_bytes()
        } else {
            FORBIDDEN_HEAD.as_bytes()
        })?;
        conn.flush()?;
        return conn.shutdown(Shutdown::Both);
    }
    let put_hold = book.lock().unwrap().put_hold;
    if let Some(hold) = put_hold.filter(|_| request_line.starts_with("PUT ")) {
        std::thread::sleep(hold);
    }
    let mut up = format!("{request_line}\r\n");
    let host = book.lock().unwrap().host.clone();
    if let Some(host) = &host {
        up.push_str(&format!("Host: {host}\r\n"));
    }
    for h in head.iter().skip(1) {
        let name = h.split(':').next().unwrap_or_default().trim();
        if host.is_some() && name.eq_ignore_ascii_case("host") {
            continue;
        }
        let drop_range = lie == Some(Lie::IgnoreRange) && name.eq_ignore_ascii_case("range");
        if drop_range || name.eq_ignore_ascii_case("connection") {
            continue;
        }
        up.push_str(h);
        up.push_str("\r\n");
    }
    up.push_str("Connection: close\r\n\r\n");
    let mut server = TcpStream::connect(upstream)?;
    server.set_read_timeout(Some(Duration::from_secs(60)))?;
    server.write_all(up.as_bytes())?;
    server.write_all(&body)?;
    let mut answer = Vec::new();
    server.read_to_end(&mut answer)?;
    let mut conn = conn;
    let end = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(answer.len(), |p| p + 4);
    let (answer_head, answer_body) = answer.split_at(end);
    let edited;
    let (answer_head, answer_body) = match lie {
        Some(Lie::Truncate { drop }) => {
            let body = &answer_body[..answer_body.len().saturating_sub(drop)];
            edited = with_length(answer_head, body.len());
            (&edited[..], body)
        }
        Some(Lie::Reconstruction(edit)) => {
            let body = edit_reconstruction(answer_body, edit);
            let head = with_length(answer_head, body.len());
            let at = head.len();
            edited = [head, body].concat();
            edited.split_at(at)
        }
        Some(Lie::ShiftRange { by }) => {
            edited = with_shifted_range(answer_head, range.as_deref(), by);
            (&edited[..], answer_body)
        }
        _ => (answer_head, answer_body),
    };
    if lie == Some(Lie::RefuseRange) {
        let size = total_size(answer_head).unwrap_or(0);
        let refusal = format!(
            "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{size}\r\n\
             Content-Length: 0\r\nConnection: close\r\n\r\n"
        );
        conn.write_all(refusal.as_bytes())?;
        conn.flush()?;
        return conn.shutdown(Shutdown::Both);
    }
    if lie == Some(Lie::Endless) {
        return send_endless(conn, answer_head, answer_body);
    }
    let head = closing(answer_head);
    if lie == Some(Lie::StatusOk) {
        let line_end = head.iter().position(|&b| b == b'\r').unwrap_or(0);
        conn.write_all(b"HTTP/1.1 200 OK")?;
        conn.write_all(&head[line_end..])?;
    } else {
        conn.write_all(&head)?;
    }
    match lie {
        Some(Lie::ShortBody { after }) => {
            send_counted(
                &mut conn,
                &answer_body[..after.min(answer_body.len())],
                book,
                &target,
                span,
            )?;
        }
        Some(Lie::Corrupt { at }) => {
            let mut body = answer_body.to_vec();
            if let Some(b) = body.get_mut(at) {
                *b ^= 0xff;
            }
            conn.write_all(&body)?;
        }
        Some(Lie::Stall { after, hold }) => {
            let (first, rest) = answer_body.split_at(after.min(answer_body.len()));
            conn.write_all(first)?;
            conn.flush()?;
            std::thread::sleep(hold);
            conn.write_all(rest)?;
        }
        _ => send_counted(&mut conn, answer_body, book, &target, span)?,
    }
    conn.flush()?;
    conn.shutdown(Shutdown::Both)
}

/// What S3 answers when it sheds load.
const SLOW_DOWN: &str = "HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n\
    Content-Length: 163\r\nConnection: close\r\n\r\n\
    <?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code>\
    <Message>Please reduce your request rate.</Message><RequestId>LYINGPROXY0001</RequestId></Error>";

/// What S3 answers to a HEAD its policy refuses.
const FORBIDDEN_HEAD: &str = "HTTP/1.1 403 Forbidden\r\nx-amz-request-id: LYINGPROXY0002\r\n\
    Content-Length: 0\r\nConnection: close\r\n\r\n";

/// `head` re-sent chunked and `body` followed by zeros, until the client
/// hangs up or [`ENDLESS_CAP`] bytes went out.
fn send_endless(mut conn: TcpStream, head: &[u8], body: &[u8]) -> std::io::Result<()> {
    let text = String::from_utf8_lossy(&closing(head)).into_owned();
    let mut out = String::new();
    for line in text.split("\r\n").filter(|l| !l.is_empty()) {
        let name = line.split(':').next().unwrap_or_default().trim();
        if !name.eq_ignore_ascii_case("content-length") {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    out.push_str("Transfer-Encoding: chunked\r\n\r\n");
    conn.write_all(out.as_bytes())?;
    let zeros = vec![0u8; 64 * 1024];
    let mut sent = 0usize;
    let mut chunk = body;
    while sent < ENDLESS_CAP {
        if chunk.is_empty() {
            chunk = &zeros;
        }
        if conn
            .write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
            .is_err()
            || conn.write_all(chunk).is_err()
            || conn.write_all(b"\r\n").is_err()
        {
            return Ok(());
        }
        sent += chunk.len();
        chunk = &[];
    }
    Ok(())
}

/// The object's total size from an upstream answer's head
/// (`Content-Range: bytes a-b/SIZE`).
fn total_size(head: &[u8]) -> Option<u64> {
    let text = String::from_utf8_lossy(head);
    text.split("\r\n").find_map(|line| {
        let (k, v) = line.split_once(':')?;
        if !k.trim().eq_ignore_ascii_case("content-range") {
            return None;
        }
        v.rsplit('/').next()?.trim().parse().ok()
    })
}

/// The first lie armed for a request of `target` by `method`, disarmed (a
/// lie about a range only for a ranged GET, [`Lie::ForbidHead`] only for a
/// HEAD, every other lie only for a GET).
fn take_lie(book: &Mutex<Book>, method: &str, target: &str, ranged: bool) -> Option<Lie> {
    let path = target.split('?').next().unwrap_or_default();
    let mut book = book.lock().unwrap();
    let i = book.lies.iter().position(|(s, l)| {
        let about_a_range = matches!(l, Lie::IgnoreRange | Lie::RefuseRange);
        let for_method = if *l == Lie::ForbidHead { "HEAD" } else { "GET" };
        method == for_method && path.ends_with(s.as_str()) && (ranged || !about_a_range)
    })?;
    Some(book.lies.remove(i).1)
}

/// The answer's head with `Connection: close` instead of any other.
fn closing(head: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(head);
    let mut out = String::new();
    for line in text.split("\r\n").filter(|l| !l.is_empty()) {
        if line
            .split(':')
            .next()
            .is_some_and(|k| k.trim().eq_ignore_ascii_case("connection"))
        {
            continue;
        }
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str("Connection: close\r\n\r\n");
    out.into_bytes()
}

/// `body` written in pieces, each counted for `target` once the socket
/// took it; request `span` ends just before its last piece is written.
fn send_counted(
    conn: &mut TcpStream,
    body: &[u8],
    book: &Mutex<Book>,
    target: &str,
    span: usize,
) -> std::io::Result<()> {
    let pieces = body.len().div_ceil(16 * 1024);
    for (i, piece) in body.chunks(16 * 1024).enumerate() {
        if i + 1 == pieces {
            book.lock().unwrap().spans[span].2 = Some(Instant::now());
        }
        conn.write_all(piece)?;
        let mut book = book.lock().unwrap();
        match book.sent.iter_mut().find(|(t, _)| t == target) {
            Some((_, n)) => *n += piece.len() as u64,
            None => book.sent.push((target.to_owned(), piece.len() as u64)),
        }
    }
    if pieces == 0 {
        book.lock().unwrap().spans[span].2 = Some(Instant::now());
    }
    Ok(())
}

/// `head` with its `Content-Length` (if any) replaced by `len`.
fn with_length(head: &[u8], len: usize) -> Vec<u8> {
    rewrite_head(
        head,
        "content-length",
        Some(format!("Content-Length: {len}")),
    )
}

/// `head` with a `Content-Range` for `range` (`bytes=A-B`) moved `by`.
fn with_shifted_range(head: &[u8], range: Option<&str>, by: u64) -> Vec<u8> {
    let (a, b) = range
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.split_once('-'))
        .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)))
        .expect("ShiftRange needs a ranged GET");
    let line = format!("Content-Range: bytes {}-{}/*", a + by, b + by);
    rewrite_head(head, "content-range", Some(line))
}

/// `head` without its `name` headers, with `line` added.
fn rewrite_head(head: &[u8], name: &str, line: Option<String>) -> Vec<u8> {
    let text = String::from_utf8_lossy(head);
    let mut out = String::new();
    for l in text.split("\r\n").filter(|l| !l.is_empty()) {
        let key = l.split(':').next().unwrap_or_default().trim();
        if !key.eq_ignore_ascii_case(name) {
            out.push_str(l);
            out.push_str("\r\n");
        }
    }
    if let Some(line) = line {
        out.push_str(&line);
        out.push_str("\r\n");
    }
    out.push_str("\r\n");
    out.into_bytes()
}

/// A v2 reconstruction `body` edited by `edit`.
fn edit_reconstruction(body: &[u8], edit: ReconEdit) -> Vec<u8> {
    let mut v: serde_json::Value = serde_json::from_slice(body).expect("a v2 reconstruction");
    let terms = v["terms"].as_array_mut().expect("terms");
    let last = terms.last().cloned().expect("a term");
    let xorb = last["hash"].as_str().unwrap().to_owned();
    let end = last["range"]["end"].as_u64().unwrap();
    match edit {
        ReconEdit::FewerBytes if terms.len() > 1 => {
            terms.pop();
        }
        ReconEdit::FewerBytes => {
            let n = last["unpacked_length"].as_u64().unwrap();
            terms[0]["unpacked_length"] = (n - 1).into();
        }
        ReconEdit::MoreBytes => terms.push(last),
        ReconEdit::TermPastChunks => {
            let i = terms.len() - 1;
            terms[i]["range"]["end"] = (end + 1).into();
        }
        ReconEdit::BytesPastRange => {
            for fetch in v["xorbs"][&xorb]
                .as_array_mut()
                .expect("the xorb's fetches")
            {
                for r in fetch["ranges"].as_array_mut().expect("ranges") {
                    if r["chunks"]["end"].as_u64() == Some(end) {
                        let last = r["bytes"]["end"].as_u64().unwrap();
                        r["bytes"]["end"] = (last + 4096).into();
                    }
                }
            }
        }
        ReconEdit::RangeOneChunkShort => {
            let i = terms.len() - 1;
            terms[i]["range"]["end"] = (end + 1).into();
            for fetch in v["xorbs"][&xorb]
                .as_array_mut()
                .expect("the xorb's fetches")
            {
                for r in fetch["ranges"].as_array_mut().expect("ranges") {
                    if r["chunks"]["end"].as_u64() == Some(end) {
                        r["chunks"]["end"] = (end + 1).into();
                    }
                }
            }
        }
    }
    serde_json::to_vec(&v).unwrap()
}
