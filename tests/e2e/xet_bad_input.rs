//! Xet answers that lie (issue 37, bad input), each against the real
//! `local_cas_server` behind the lying proxy, or the fixture hub's read-token
//! route with a fault: a clear error naming the file and the answer, or a
//! refused attempt and a refetch; never a wrong byte published.
//!
//! `local_cas_server` checks no token, so a CAS refusing the token (one
//! for another repo) is the proxy answering `401`.

use crate::common::lying_proxy::{Lie, ReconEdit};
use crate::common::*;
use crate::xet_source::{ONE_STREAM, refused_once_then_fetched, xet_served};
use ftpipe_fixtures::xet::TokenFault;

/// The reconstruction path of the LFS file `f` of `hashes`.
fn recon_suffix(f: &ftpipe_fixtures::RepoFile, hashes: &crate::xet_source::Hashes) -> String {
    let sha = sha256_hex(&ftpipe_fixtures::checkpoint::content_bytes(f).unwrap());
    format!("v2/reconstructions/{}", hashes[&sha])
}

/// Regression: a reconstruction whose terms hold fewer bytes than the
/// file was refused, but one whose terms hold more (a term past the
/// file's end) was taken, its extra terms never asked: an answer that
/// does not describe the file. Both are now refused before any xorb is
/// asked, naming the file, what the terms hold and what was asked; the
/// fetch fails (exit 1) and nothing is written.
#[test]
fn terms_that_do_not_add_up_to_the_file_are_refused() {
    let (hub, files, _cas, proxy, hashes) = xet_served(386);
    let f = lfs_file(&files);
    let size = content_len(f);
    let tmp = tempfile::tempdir().unwrap();
    for (edit, says) in [
        (ReconEdit::FewerBytes, "fewer"),
        (
            ReconEdit::MoreBytes,
            "before the last term, which is past the span",
        ),
    ] {
        let out = tmp.path().join(format!("{edit:?}"));
        proxy.lie(&recon_suffix(f, &hashes), Lie::Reconstruction(edit), 1);
        let before = proxy.body_bytes_sent("fetch_term");
        let args = [ONE_STREAM, &["--include", &f.path, "--retries", "0"]].concat();
        let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &args));
        assert_eq!(o.status.code(), Some(1), "{edit:?}: {}", stderr(&o));
        assert_names(
            &stderr(&o),
            &[
                "Xet reconstruction for",
                &f.path,
                says,
                &format!("{size} bytes were asked"),
            ],
        );
        assert_eq!(proxy.body_bytes_sent("fetch_term"), before, "{edit:?}");
        assert!(!out.join("source").join(&f.path).exists());
        assert_eq!(ledger(&out, &f.path).committed, 0);
    }
}

/// A term whose chunks no fetch range of its xorb holds is refused,
/// naming the file, the term, its chunks and the xorb (exit 1).
#[test]
fn a_term_past_its_xorbs_chunks_is_refused_naming_term_and_xorb() {
    let (hub, files, _cas, proxy, hashes) = xet_served(387);
    let f = lfs_file(&files);
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    proxy.lie(
        &recon_suffix(f, &hashes),
        Lie::Reconstruction(ReconEdit::TermPastChunks),
        1,
    );
    let args = [ONE_STREAM, &["--include", &f.path, "--retries", "0"]].concat();
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &args));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_names(
        &stderr(&o),
        &[&f.path, "terms[", "no fetch holds chunks", "of xorb"],
    );
    assert!(!out.join("source").join(&f.path).exists());
}

/// A xorb range that holds one chunk fewer than its term says (the term
/// and its fetch range claiming a chunk past the xorb's end), a byte range
/// that ends 4 KiB past the xorb's range (what comes is not its length or
/// not its chunks), an honest
/// `206` of a truncated xorb (its last bytes missing, its `Content-Length`
/// saying so), a `206` whose `Content-Range` names other bytes than asked,
/// and an expired presigned URL (`403`): each attempt is refused before its
/// bad bytes are handed on, the reconstruction is asked again, and the file
/// is published verified with a ledger that adds up.
#[test]
fn a_short_truncated_shifted_or_expired_xorb_range_is_refused_and_refetched() {
    let (hub, files, _cas, proxy, hashes) = xet_served(388);
    let f = lfs_file(&files);
    let tmp = tempfile::tempdir().unwrap();
    let lies = [
        (
            recon_suffix(f, &hashes),
            Lie::Reconstruction(ReconEdit::RangeOneChunkShort),
        ),
        (
            recon_suffix(f, &hashes),
            Lie::Reconstruction(ReconEdit::BytesPastRange),
        ),
        ("v1/fetch_term".to_owned(), Lie::Truncate { drop: 1000 }),
        ("v1/fetch_term".to_owned(), Lie::ShiftRange { by: 1 }),
        ("v1/fetch_term".to_owned(), Lie::Status { code: 403 }),
    ];
    for (i, (suffix, lie)) in lies.into_iter().enumerate() {
        let out = tmp.path().join(format!("out-{i}"));
        refused_once_then_fetched(&hub, &proxy, f, (&suffix, lie), &out);
    }
}

/// A CAS that refuses the read token (one the hub issued for another
/// repo: `401` to every reconstruction) fails the file with the status,
/// the file and the range named (exit 1) after asking the hub for a new
/// token on the retry; nothing is written.
#[test]
fn a_token_the_cas_refuses_fails_the_file_naming_the_status() {
    let (hub, files, _cas, proxy, hashes) = xet_served(389);
    let f = lfs_file(&files);
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    proxy.lie(&recon_suffix(f, &hashes), Lie::Status { code: 401 }, 10);
    hub.clear_requests();
    let args = [ONE_STREAM, &["--include", &f.path, "--retries", "1"]].concat();
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &args));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_names(
        &stderr(&o),
        &["Xet CAS answered 401", "reconstruction of", &f.path],
    );
    let tokens = hub
        .requests()
        .iter()
        .filter(|r| r.path.contains("/xet-read-token/"))
        .count();
    assert!(tokens >= 2, "the token was not asked for again: {tokens}");
    assert!(!out.join("source").join(&f.path).exists());
    assert_eq!(ledger(&out, &f.path).committed, 0);
}

/// A read-token answer larger than its bound (1 MiB of JSON, sent chunked
/// so only reading shows its size) is refused at 64 KiB, naming the route
/// and the bound; one that never ends (its head, then nothing) ends at
/// `--read-timeout`. Both fail the fetch (exit 1) with nothing written.
#[test]
fn a_huge_or_endless_token_answer_is_bounded() {
    let (hub, files, _cas, _proxy, _hashes) = xet_served(390);
    let f = lfs_file(&files);
    let tmp = tempfile::tempdir().unwrap();
    let cases = [
        (
            TokenFault::Huge { bytes: 1 << 20 },
            "exceeds the limit of 65536 bytes",
        ),
        (TokenFault::Stall, "timed out"),
    ];
    for (fault, says) in cases {
        hub.xet_token_fault(Some(fault));
        let out = tmp.path().join(format!("{fault:?}"));
        let args = [
            ONE_STREAM,
            &[
                "--include",
                &f.path,
                "--retries",
                "0",
                "--read-timeout",
                "2",
            ],
        ]
        .concat();
        let started = std::time::Instant::now();
        let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &args));
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "{fault:?}: {:?}",
            started.elapsed()
        );
        assert_eq!(o.status.code(), Some(1), "{fault:?}: {}", stderr(&o));
        assert_names(
            &stderr(&o),
            &["Xet read token from", "xet-read-token", says],
        );
        assert!(!out.join("source").join(&f.path).exists());
    }
    hub.xet_token_fault(None);
}
