//! S3 through the output-target seam, against a real S3-compatible server
//! (moto's server mode on loopback, as the end-to-end tests use it; a
//! missing moto fails the test with the command that installs it). Holds
//! the S3 implementation to what `OutputTarget` promises publish and
//! mirror: create-only puts, sessions whose receipts complete the object,
//! aborts, bounded gets and lists, and a head whose store checksum proves
//! exactly the bytes the store holds (reuse only what it proves).

// A test crate sees every dependency of the library.
#![allow(unused_crate_dependencies)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ftpipe_objstore::{
    ObjStoreError, PartRequest, Put, PutMode, S3, S3Config, S3Location, SharedTarget,
    StoreChecksum, sha256_of,
};

const BUCKET: &str = "models";
const PART: usize = 64 * 1024;

struct Moto {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One unsigned HTTP/1.1 request to `addr`; its status.
fn raw(addr: SocketAddr, method: &str, path: &str) -> std::io::Result<u16> {
    raw_with(addr, method, path, "", b"")
}

/// One unsigned HTTP/1.1 request to `addr` with `headers` (each ending in
/// CRLF) and `body`; its status. Places objects as another tool would.
fn raw_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &str,
    body: &[u8],
) -> std::io::Result<u16> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n{headers}\
         Authorization: AWS4-HMAC-SHA256 Credential=AKIAFTPIPETESTKEY001/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00\r\n\r\n",
        body.len()
    )?;
    s.write_all(body)?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp)?;
    let head = String::from_utf8_lossy(&resp);
    head.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other("no status"))
}

fn start_moto() -> Moto {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port();
    let child = Command::new("python3")
        .args([
            "-m",
            "moto.server",
            "-H",
            "127.0.0.1",
            "-p",
            &port.to_string(),
        ])
        .env("S3_UPLOAD_PART_MIN_SIZE", PART.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn python3 -m moto.server (python3 -m pip install 'moto[server]==5.2.1')");
    let m = Moto {
        child,
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
    };
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(30) {
        if let Ok(200) = raw(m.addr, "GET", "/") {
            assert_eq!(raw(m.addr, "PUT", &format!("/{BUCKET}")).unwrap(), 200);
            return m;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("moto did not start (python3 -m pip install 'moto[server]==5.2.1')");
}

fn target(m: &Moto, prefix: &str) -> SharedTarget {
    let endpoint = format!("http://{}", m.addr);
    let config = S3Config::from_keys(
        Some(&endpoint),
        "us-east-1",
        "AKIAFTPIPETESTKEY001",
        "ftpipe-test-secret-access-key-0001",
    )
    .unwrap();
    let location = S3Location::parse(&format!("s3://{BUCKET}/{prefix}")).unwrap();
    Arc::new(S3::open(&config, location).unwrap())
}

fn sha(n: u8) -> String {
    format!("{n:02x}").repeat(32)
}

#[tokio::test(flavor = "multi_thread")]
async fn s3_keeps_the_promises_of_the_output_target() {
    let m = start_moto();
    let t = target(&m, "p");
    assert_eq!(t.dest(), "s3://models/p");
    let key = t.key("manifest.json");
    assert_eq!(t.url_of(&key), "s3://models/p/manifest.json");
    assert!(!t.part_rules().in_order);

    // Create-only: the second create finds the first and writes nothing.
    let first = t
        .put(
            &key,
            Bytes::from_static(b"one"),
            &hex_sha256(b"one"),
            PutMode::CreateOnly,
        )
        .await
        .unwrap();
    assert!(matches!(first, Put::Written { .. }), "{first:?}");
    let second = t
        .put(
            &key,
            Bytes::from_static(b"two"),
            &hex_sha256(b"two"),
            PutMode::CreateOnly,
        )
        .await
        .unwrap();
    assert_eq!(second, Put::Exists);
    let body = t.get_bounded(&key, 3).await.unwrap().unwrap();
    assert_eq!(&body.bytes[..], b"one");
    let head = t.head(&key).await.unwrap().unwrap();
    assert_eq!((head.size, head.sha256), (3, Some(hex_sha256(b"one"))));
    assert!(matches!(
        t.get_bounded(&key, 2).await,
        Err(ObjStoreError::TooLarge { .. })
    ));
    assert!(t.head(&t.key("absent")).await.unwrap().is_none());

    // A session of two parts, completed from their receipts in order.
    let big = t.key("fp/big.ftw");
    let session = t.begin_upload(&big, &sha(3)).await.unwrap();
    let mut receipts = Vec::new();
    for (number, fill) in [(1u64, b'a'), (2, b'b')] {
        let part = PartRequest {
            number,
            offset: (number - 1) * PART as u64,
            bytes: Bytes::from(vec![fill; PART]),
            sha256: sha256_of(&vec![fill; PART]),
            previous: None,
        };
        receipts.push(t.send_part(&big, &session, part).await.unwrap());
    }
    let version = t
        .complete_upload(&big, &session, receipts, &sha(3))
        .await
        .unwrap();
    let head = t.head(&big).await.unwrap().unwrap();
    assert_eq!((head.size, head.sha256), (2 * PART as u64, Some(sha(3))));
    assert_eq!(
        version.as_deref().map(|v| v.trim_matches('"')),
        head.etag.as_deref().map(|v| v.trim_matches('"'))
    );

    // Aborting a session frees it; aborting it again is no error. (That
    // a forgotten session is `UploadGone` is S3's 404 `NoSuchUpload`; moto
    // answers a part or a completion of an aborted upload with a 500, so
    // it is not asserted here.)
    let gone_key = t.key("fp/gone");
    let gone = t.begin_upload(&gone_key, &sha(4)).await.unwrap();
    t.abort_upload(&gone_key, &gone).await.unwrap();
    t.abort_upload(&gone_key, &gone).await.unwrap();
    assert!(t.head(&gone_key).await.unwrap().is_none());

    // A bounded list: every object under the prefix, or an error past the
    // limit (never a silent cut).
    let mut listed = t.list(&t.key("fp"), 10).await.unwrap();
    listed.sort_by(|a, b| a.key.cmp(&b.key));
    let listed: Vec<_> = listed.into_iter().map(|l| (l.key, l.size)).collect();
    assert_eq!(listed, [("p/fp/big.ftw".to_owned(), 2 * PART as u64)]);
    let err = t.list(&t.key(""), 1).await.unwrap_err();
    assert!(
        matches!(err, ObjStoreError::TooManyObjects { max: 1, .. }),
        "{err}"
    );
}

/// The promise publish's reuse rests on: a head reports the store's own
/// checksum of the bytes it holds (computed by the store, not the claim in
/// the `ftpipe-sha256` metadata), which proves the bytes a put or a
/// session sent, proves nothing for other bytes under the same metadata,
/// and is absent for an object stored without one.
#[tokio::test(flavor = "multi_thread")]
async fn s3_reuses_only_what_the_store_checksum_proves() {
    let m = start_moto();
    let t = target(&m, "q");

    // A put (its SHA-256 the caller's, sent as its checksum): the checksum
    // is the whole object's SHA-256.
    let one = t.key("one");
    let put = t
        .put(
            &one,
            Bytes::from_static(b"one"),
            &hex_sha256(b"one"),
            PutMode::Replace,
        )
        .await
        .unwrap();
    assert!(matches!(put, Put::Written { .. }));
    let head = t.head(&one).await.unwrap().unwrap();
    assert_eq!(
        head.checksum,
        Some(StoreChecksum::Sha256(sha256_of(b"one")))
    );
    let checksum = head.checksum.unwrap();
    assert!(checksum.proves_whole(&sha256_of(b"one")));
    assert!(!checksum.proves_whole(&sha256_of(b"two")));

    // A session: the checksum is over its parts, with their count.
    let big = t.key("big");
    let session = t.begin_upload(&big, &sha(2)).await.unwrap();
    let (a, b) = (vec![b'a'; PART], vec![b'b'; 100]);
    let mut receipts = Vec::new();
    for (number, bytes) in [(1u64, &a), (2, &b)] {
        let part = PartRequest {
            number,
            offset: (number - 1) * PART as u64,
            bytes: Bytes::from(bytes.clone()),
            sha256: sha256_of(bytes),
            previous: None,
        };
        receipts.push(t.send_part(&big, &session, part).await.unwrap());
    }
    t.complete_upload(&big, &session, receipts, &sha(2))
        .await
        .unwrap();
    let checksum = t.head(&big).await.unwrap().unwrap().checksum.unwrap();
    assert_eq!(checksum.parts(), Some(2), "{checksum:?}");
    assert!(checksum.proves_parts(&[sha256_of(&a), sha256_of(&b)]));
    assert!(!checksum.proves_parts(&[sha256_of(&b), sha256_of(&a)]));
    let mut whole = a.clone();
    whole.extend_from_slice(&b);
    assert!(!checksum.proves_whole(&sha256_of(&whole)));

    // Another tool's object claiming `one`'s SHA-256 in the metadata, with
    // other bytes: stored without a checksum, the head reports none.
    let claim = format!("x-amz-meta-ftpipe-sha256: {}\r\n", hex_sha256(b"one"));
    let placed = t.key("placed");
    let status = raw_with(
        m.addr,
        "PUT",
        &format!("/{BUCKET}/{placed}"),
        &claim,
        b"bad",
    )
    .unwrap();
    assert_eq!(status, 200);
    let head = t.head(&placed).await.unwrap().unwrap();
    assert_eq!(head.sha256.as_deref(), Some(hex_sha256(b"one").as_str()));
    assert_eq!(head.checksum, None);

    // The same claim with a checksum the store computed from the bytes it
    // received: it proves those bytes, not the claimed ones.
    let computed = format!("{claim}x-amz-sdk-checksum-algorithm: SHA256\r\n");
    let status = raw_with(
        m.addr,
        "PUT",
        &format!("/{BUCKET}/{placed}"),
        &computed,
        b"bad",
    )
    .unwrap();
    assert_eq!(status, 200);
    let checksum = t.head(&placed).await.unwrap().unwrap().checksum.unwrap();
    assert!(checksum.proves_whole(&sha256_of(b"bad")));
    assert!(!checksum.proves_whole(&sha256_of(b"one")));
}

fn hex_sha256(bytes: &[u8]) -> String {
    sha256_of(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
