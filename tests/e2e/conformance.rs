//! The conformance suite of the byte sources: the same end-to-end checks,
//! once per implementation of the fetch's source seam, the way
//! `object_store`'s integration tests run against every backend. A new
//! source is held to them by one line in the `conformance!` list at the
//! end (and a [`Source`] implementation saying how to reach it, how to lie
//! to it, how to replace a file in it and, where its right behaviour is
//! not that of a file sent as one HTTP body, what it is held to instead:
//! [`Source::expect`]). Every check that runs can fail.
//!
//! The implementations: the hub's HTTP (the fixture hub, which injects the
//! faults), a mirror in object storage (`fetch --endpoint s3://…`, moto
//! behind the lying proxy of `common::lying_proxy`), `pull` of a
//! published artifact (the same), `pull oci://…` from the distribution
//! registry (behind the same proxy), and the hub's Xet storage
//! (`local_cas_server` filled by `hf_xet`, behind the same proxy: the
//! file's xorb ranges are its body requests). Each check drives the real
//! binary with one connection, so the file under test is read as one
//! stream:
//!
//! - `resume_after_a_kill`: killed after a checkpoint, the re-run asks
//!   from the durable watermark under the kept bytes' validator (Xet: the
//!   reconstruction of the span from the watermark);
//! - `a_short_body_resumes`: a body that ends early is asked again within
//!   what arrived, at most a checkpoint and [`Expect::cut_loses_at_most`]
//!   before its end (by the client's own retry or by ftpipe's; Xet hands a
//!   term on a recorded 1 MiB batch at a time, so a cut loses the batch
//!   being read);
//! - `a_200_to_a_range_is_never_spliced`: a server that answers a ranged
//!   request with a `200`: as [`Expect::on_a_200`] says, the whole file
//!   is taken from 0, the kept prefix dropped (a recorded
//!   `range_not_honoured` discard; a pull gave up after four attempts
//!   before, issue 35), or (Xet, whose range is a xorb's, not the file's)
//!   the answer is refused and the span asked again from the watermark,
//!   nothing kept dropped; never the answer's bytes after the kept ones;
//! - `a_changed_validator_restarts_from_byte_0`: the file replaced by the
//!   same bytes under a new validator between a kill and the re-run: the
//!   prefix is dropped, never spliced with the new object's bytes;
//! - `a_refused_range_is_retried_from_the_watermark`: a `416` to the
//!   resumed range is a failed attempt, retried; nothing kept is dropped
//!   (Xet: a `416` to the reconstruction's range, then one to the xorb's;
//!   the first failed the file before);
//! - `an_endless_body_is_bounded`: a body that never ends is cut (at the
//!   file's size, or refused), the fetch finishes with the file verified
//!   and the ledger adds up, within a bound;
//! - `a_stalled_body_ends_at_the_read_timeout`: a body that stops after a
//!   third of the file, the connection held open, ends at `--read-timeout`
//!   and is retried (object storage waited 300 s, then 300 s more, and
//!   ignored `--read-timeout`, issue 35).
//!
//! The registry and Xet run every check but the changed validator: a
//! blob's validator is its digest and a Xet file's its Xet hash, each
//! naming its bytes, so the same name never holds other bytes (other
//! bytes are another name: a new pin).
//!
//! Every check ends with the file's bytes verified and a clean audit
//! (`transferred = committed + discarded`).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::lying_proxy::{Lie, LyingProxy};
use crate::common::s3::*;
use crate::common::xet::LocalCas;
use crate::common::*;
use crate::s3::{built, publish};
use ftpipe_fixtures::{Fault, FaultRule, RunningHub};

/// What a check needs of one implementation.
trait Source {
    /// The command that takes every file into `out` (with `extra`).
    fn command(&self, out: &Path, extra: &[&str]) -> Command;
    /// The largest file: its path and size.
    fn largest(&self) -> (String, u64);
    /// Tells `lie` to the next `times` body requests of `path`.
    fn lie(&self, path: &str, lie: Lie, times: usize);
    /// Puts the same bytes of `path` back under a new validator.
    fn replace(&self, path: &str);
    /// The `Range` of every body request of `path` so far.
    fn ranges(&self, path: &str) -> Vec<Option<String>>;
    /// Checks `out` holds every file, verified.
    fn verify(&self, out: &Path);
    /// Where its right behaviour differs from a file sent as one HTTP body.
    fn expect(&self) -> Expect {
        Expect::ONE_BODY
    }
}

/// What a source is held to where a file it serves is not one HTTP body
/// (Xet: terms of xorbs, each asked as a range of its own).
#[derive(Debug, Clone, Copy)]
struct Expect {
    /// What a `200` (the whole object) to a ranged request does.
    on_a_200: On200,
    /// The most of what a cut body delivered that may be asked again,
    /// besides a checkpoint's worth: bytes the source hands on a piece at
    /// a time (a cut loses the piece being read).
    cut_loses_at_most: u64,
}

impl Expect {
    /// A file sent as one body, handed on as it arrives.
    const ONE_BODY: Expect = Expect {
        on_a_200: On200::TakenFromByte0,
        cut_loses_at_most: 0,
    };
}

/// What a `200` to a ranged request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum On200 {
    /// The answer is the whole file: taken, the kept prefix dropped (a
    /// recorded `range_not_honoured` discard), so a server answering
    /// every range so still ends in the file.
    TakenFromByte0,
    /// The answer is refused (a failed attempt, nothing written) and the
    /// span asked again from the watermark, nothing kept dropped: the
    /// range holds only part of the file (a Xet term's xorb range), so a
    /// whole answer is not the file. A server answering every range so
    /// fails the file; the check tells the lie [`REFUSED_200S`] times.
    RefusedAndAskedAgain,
}

/// How many `200`s an [`On200::RefusedAndAskedAgain`] source is told
/// (fewer than the default `--retries`, 8).
const REFUSED_200S: usize = 3;

/// One stream per file, a checkpoint every [`CHECKPOINT`] bytes.
const ONE_STREAM: &[&str] = &[
    "--jobs",
    "1",
    "--connections",
    "1",
    "--checkpoint-bytes",
    "65536",
];

/// The checkpoint interval of [`ONE_STREAM`].
const CHECKPOINT: u64 = 65536;

/// The hub's HTTP: the fixture hub and its faults.
struct Hub {
    hub: RunningHub,
    files: Vec<ftpipe_fixtures::RepoFile>,
}

fn hub(_tmp: &Path) -> Box<dyn Source> {
    let (hub, files) = hub_with_repo(61, 2 * 1024 * 1024);
    Box::new(Hub { hub, files })
}

impl Source for Hub {
    fn command(&self, out: &Path, extra: &[&str]) -> Command {
        fetch_cmd(&self.hub.endpoint(), out, extra)
    }

    fn largest(&self) -> (String, u64) {
        let f = lfs_file(&self.files);
        (f.path.clone(), content_len(f))
    }

    fn lie(&self, path: &str, lie: Lie, times: usize) {
        let fault = match lie {
            Lie::IgnoreRange => Fault::IgnoreRange,
            Lie::ShortBody { after } => Fault::ShortBody {
                after: after as u64,
            },
            Lie::RefuseRange => Fault::RangeNotSatisfiable,
            Lie::Endless => Fault::EndlessBody,
            // The hub's load shedding: a 503 (no S3 error document).
            Lie::SlowDown => Fault::RetryAfter {
                status: 503,
                secs: 1,
            },
            // The body's byte `at` of a whole answer is the file's.
            Lie::Corrupt { at } => Fault::FlipByte { offset: at as u64 },
            Lie::Stall { after, hold } => Fault::Stall {
                after: after as u64,
                for_ms: u64::try_from(hold.as_millis()).unwrap(),
            },
            Lie::ForbidHead => Fault::Status { code: 403 },
            Lie::StatusOk
            | Lie::Status { .. }
            | Lie::ShiftRange { .. }
            | Lie::Truncate { .. }
            | Lie::Reconstruction(_) => {
                unreachable!("the conformance checks tell no such lie")
            }
        };
        let times = u32::try_from(times).unwrap();
        self.hub.inject(FaultRule::new(path, fault).times(times));
    }

    fn replace(&self, path: &str) {
        self.hub.inject(FaultRule::new(path, Fault::ChangeEtag));
    }

    fn ranges(&self, path: &str) -> Vec<Option<String>> {
        body_gets(&self.hub, path)
            .into_iter()
            .map(|r| r.range)
            .collect()
    }

    fn verify(&self, out: &Path) {
        assert_files_match(out, &self.files);
        assert_clean_audit(out);
    }
}

/// Object storage behind the lying proxy: a mirror or a pull.
struct Stored {
    moto: Moto,
    proxy: LyingProxy,
    home: PathBuf,
    /// The `s3://` location and the key prefix of the files under it.
    location: String,
    files_prefix: String,
    /// `Some`: a pull, with the artifact it must reproduce.
    pulled: Option<PathBuf>,
    /// A mirror: the fetched DIR it was written from.
    mirrored: Option<(RunningHub, Vec<ftpipe_fixtures::RepoFile>)>,
    largest: (String, u64),
}

fn mirror(tmp: &Path) -> Box<dyn Source> {
    let (hub, files) = hub_with_repo(62, 2 * 1024 * 1024);
    let src = tmp.join("mirrored");
    run_ok(&mut fetch_cmd(&hub.endpoint(), &src, &[]));
    let moto = Moto::start();
    let location = "s3://models/mirror".to_owned();
    run_ok(
        moto.ftpipe(tmp)
            .arg("mirror")
            .arg(&src)
            .arg(&location)
            .args(["--part-size", PART_SIZE]),
    );
    let commit = query(&src, "SELECT commit_sha FROM pin").remove(0);
    let f = lfs_file(&files);
    let largest = (f.path.clone(), content_len(f));
    let proxy = LyingProxy::start(&moto.endpoint());
    Box::new(Stored {
        moto,
        proxy,
        home: tmp.to_owned(),
        location,
        files_prefix: format!("mirror/{commit}"),
        pulled: None,
        mirrored: Some((hub, files)),
        largest,
    })
}

fn pull(tmp: &Path) -> Box<dyn Source> {
    let src = built(tmp, 63);
    let moto = Moto::start();
    let location = "s3://models/published".to_owned();
    let o = publish(&moto, tmp, &src, &location);
    assert!(o.status.success(), "publish: {}", stderr(&o));
    let manifest = manifest_json(&src);
    let fingerprint = manifest["fingerprint"].as_str().unwrap().to_owned();
    let largest = manifest["components"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let path = c["path"].as_str().unwrap().to_owned();
            (path, c["size"].as_u64().unwrap())
        })
        .max_by_key(|(_, size)| *size)
        .unwrap();
    let proxy = LyingProxy::start(&moto.endpoint());
    Box::new(Stored {
        moto,
        proxy,
        home: tmp.to_owned(),
        location,
        files_prefix: format!("published/{fingerprint}"),
        pulled: Some(src.join("artifact")),
        mirrored: None,
        largest,
    })
}

impl Source for Stored {
    fn command(&self, out: &Path, extra: &[&str]) -> Command {
        let mut cmd = self.moto.ftpipe(&self.home);
        cmd.env("AWS_ENDPOINT_URL", self.proxy.endpoint());
        match self.pulled {
            Some(_) => cmd.args(["pull", &self.location]),
            None => cmd.args(["fetch", REPO, "--endpoint", &self.location]),
        };
        cmd.arg("--out")
            .arg(out)
            .args(["--retry-base-ms", "20"])
            .args(extra);
        cmd
    }

    fn largest(&self) -> (String, u64) {
        self.largest.clone()
    }

    fn lie(&self, path: &str, lie: Lie, times: usize) {
        self.proxy.lie(path, lie, times);
    }

    fn replace(&self, path: &str) {
        // One put of the bytes a multipart upload wrote: a new ETag.
        let key = format!("{}/{path}", self.files_prefix);
        let bytes = self.moto.get_object(&key).unwrap();
        self.moto.put_object(&key, &bytes);
    }

    fn ranges(&self, path: &str) -> Vec<Option<String>> {
        let suffix = format!("/{path}");
        self.proxy
            .seen()
            .into_iter()
            .filter(|r| r.method == "GET" && r.target.split('?').next().unwrap().ends_with(&suffix))
            .map(|r| r.range)
            .collect()
    }

    fn verify(&self, out: &Path) {
        match (&self.pulled, &self.mirrored) {
            (Some(artifact), _) => {
                assert_eq!(manifest_sha(out), manifest_sha_in(artifact));
                run_ok(
                    ftpipe()
                        .arg("verify")
                        .arg(out.join("artifact"))
                        .arg("--deep"),
                );
            }
            (None, Some((_, files))) => {
                assert_files_match(out, files);
                assert_clean_audit(out);
            }
            (None, None) => unreachable!("a stored source is a pull or a mirror"),
        }
    }
}

/// The first byte a `Range` asks for.
fn range_start(range: &str) -> Option<u64> {
    range
        .strip_prefix("bytes=")?
        .split('-')
        .next()?
        .parse()
        .ok()
}

fn succeeded(o: &std::process::Output, what: &str) {
    assert!(
        o.status.success(),
        "{what}: exit {:?}\n{}",
        o.status.code(),
        stderr(o)
    );
}

fn discards_of(out: &Path, path: &str) -> Vec<String> {
    query(
        out,
        &format!(
            "SELECT reason FROM discards WHERE path = {} ORDER BY id",
            sql_str(path)
        ),
    )
}

/// Killed at the second durable checkpoint: the path partly fetched.
fn killed_mid_file(s: &dyn Source, out: &Path) -> String {
    let o = run(s
        .command(out, ONE_STREAM)
        .env("FTPIPE_CRASH_AT", "checkpoint-synced#2"));
    assert_eq!(o.status.code(), None, "not killed: {}", stderr(&o));
    let mut partial = query(
        out,
        "SELECT path FROM ledger WHERE committed_bytes > 0 AND path NOT IN (SELECT path FROM receipts)",
    );
    assert_eq!(partial.len(), 1, "{partial:?}");
    partial.remove(0)
}

fn resume_after_a_kill(s: &dyn Source, tmp: &Path) {
    let out = tmp.join("out");
    let path = killed_mid_file(s, &out);
    let watermark = committed_of(&out, &path);
    let o = run(&mut s.command(&out, ONE_STREAM));
    succeeded(&o, "resumed");
    s.verify(&out);
    let committed = resume_point(&stderr(&o), &path, watermark);
    let resumed = query(
        &out,
        &format!(
            "SELECT range_start FROM attempts WHERE path = {} AND if_range IS NOT NULL ORDER BY id",
            sql_str(&path)
        ),
    );
    assert_eq!(
        resumed,
        [committed.to_string()],
        "resumed from the watermark"
    );
    assert!(
        !discards_of(&out, &path).contains(&"range_not_honoured".to_owned()),
        "the kept prefix was dropped"
    );
}

fn a_short_body_resumes(s: &dyn Source, tmp: &Path) {
    let out = tmp.join("out");
    let (path, size) = s.largest();
    let after = usize::try_from(size / 3).unwrap();
    s.lie(&path, Lie::ShortBody { after }, 1);
    succeeded(&run(&mut s.command(&out, ONE_STREAM)), "fetch");
    s.verify(&out);
    let ranges = s.ranges(&path);
    // Asked again within what arrived, and no further back than a
    // checkpoint and the piece the source was handing on.
    let lost = CHECKPOINT + s.expect().cut_loses_at_most;
    let earliest = (after as u64).saturating_sub(lost);
    assert!(
        ranges
            .iter()
            .flatten()
            .filter_map(|r| range_start(r))
            .any(|n| n > 0 && n >= earliest && n <= after as u64),
        "no request resumed within {earliest}..={after} of what arrived: {ranges:?}"
    );
}

fn a_200_to_a_range_is_never_spliced(s: &dyn Source, tmp: &Path) {
    let out = tmp.join("out");
    let path = killed_mid_file(s, &out);
    let watermark = committed_of(&out, &path);
    let killed = last_attempt(&out);
    let on_a_200 = s.expect().on_a_200;
    let told = match on_a_200 {
        // Every ranged request from here on answered with the whole file.
        On200::TakenFromByte0 => 50,
        On200::RefusedAndAskedAgain => REFUSED_200S,
    };
    s.lie(&path, Lie::IgnoreRange, told);
    let o = run(&mut s.command(&out, ONE_STREAM));
    succeeded(&o, "resumed");
    s.verify(&out);
    let watermark = resume_point(&stderr(&o), &path, watermark);
    let reasons = discards_of(&out, &path);
    let resumed = attempts_after(&out, &path, killed);
    let first = resumed.first().map(|(_, from)| *from);
    assert_eq!(first, Some(watermark), "{resumed:?}");
    match on_a_200 {
        On200::TakenFromByte0 => assert!(
            reasons.contains(&"range_not_honoured".to_owned()),
            "{reasons:?}"
        ),
        On200::RefusedAndAskedAgain => {
            // Each refused attempt failed having written nothing, and the
            // next asked from the watermark again; never from byte 0.
            assert!(
                !reasons.contains(&"range_not_honoured".to_owned()),
                "the kept prefix was dropped: {reasons:?}"
            );
            let failed = resumed.iter().take_while(|(ok, _)| !ok).count();
            assert!(
                failed >= told && resumed.iter().all(|(_, from)| *from == watermark),
                "not {told} refusals, each asked again from {watermark}: {resumed:?}"
            );
        }
    }
}

/// The ledger's committed bytes of `path`.
fn committed_of(out: &Path, path: &str) -> u64 {
    query(
        out,
        &format!(
            "SELECT committed_bytes FROM ledger WHERE path = {}",
            sql_str(path)
        ),
    )[0]
    .parse()
    .unwrap()
}

/// The id of the last attempt recorded (0: none).
fn last_attempt(out: &Path) -> u64 {
    query(out, "SELECT IFNULL(MAX(id), 0) FROM attempts")[0]
        .parse()
        .unwrap()
}

/// The attempts of `path` after attempt `id`: (succeeded, first byte asked).
fn attempts_after(out: &Path, path: &str, id: u64) -> Vec<(bool, u64)> {
    query(
        out,
        &format!(
            "SELECT outcome || ' ' || range_start FROM attempts \
             WHERE path = {} AND id > {id} ORDER BY id",
            sql_str(path)
        ),
    )
    .iter()
    .map(|row| {
        let (outcome, from) = row.split_once(' ').unwrap();
        (outcome == "ok", from.parse().unwrap())
    })
    .collect()
}

fn a_changed_validator_restarts_from_byte_0(s: &dyn Source, tmp: &Path) {
    let out = tmp.join("out");
    let path = killed_mid_file(s, &out);
    s.replace(&path);
    succeeded(&run(&mut s.command(&out, ONE_STREAM)), "resumed");
    s.verify(&out);
    let reasons = discards_of(&out, &path);
    assert!(
        reasons.contains(&"range_not_honoured".to_owned()),
        "{reasons:?}"
    );
    let asked = query(
        &out,
        &format!(
            "SELECT IFNULL(if_range, '') || ' ' || IFNULL(etag, '') FROM attempts WHERE path = {} ORDER BY id",
            sql_str(&path)
        ),
    );
    let last = asked.last().unwrap();
    let (sent, got) = last.split_once(' ').unwrap();
    assert!(
        !sent.is_empty() && sent != got,
        "resumed under the old validator, answered under the new: {asked:?}"
    );
}

/// Regression (Xet): a `416` to a resumed reconstruction (its `Range`
/// the span from the watermark) failed the file at once, its status taken
/// as final, where the hub and a registry ask the range again; now it is
/// a failed attempt, retried from the watermark.
fn a_refused_range_is_retried_from_the_watermark(s: &dyn Source, tmp: &Path) {
    let out = tmp.join("out");
    let path = killed_mid_file(s, &out);
    s.lie(&path, Lie::RefuseRange, 1);
    succeeded(&run(&mut s.command(&out, ONE_STREAM)), "resumed");
    s.verify(&out);
    // The refused attempt failed, and the next one asked the same range:
    // the watermark, not byte 0 (a 416 says nothing about the kept bytes).
    let resumed = query(
        &out,
        &format!(
            "SELECT outcome || ' ' || range_start FROM attempts \
             WHERE path = {} AND range_start > 0 ORDER BY id",
            sql_str(&path)
        ),
    );
    let [refused, retried, ..] = resumed.as_slice() else {
        panic!("no retry after the refusal: {resumed:?}");
    };
    let (outcome, from) = refused.split_once(' ').unwrap();
    assert_ne!(outcome, "ok", "{resumed:?}");
    assert_eq!(retried.split_once(' ').unwrap().1, from, "{resumed:?}");
    let reasons = discards_of(&out, &path);
    assert!(
        !reasons.contains(&"range_not_honoured".to_owned())
            && !reasons.contains(&"validator_changed".to_owned()),
        "kept bytes were dropped for a refused range: {reasons:?}"
    );
}

fn an_endless_body_is_bounded(s: &dyn Source, tmp: &Path) {
    let out = tmp.join("out");
    let (path, size) = s.largest();
    s.lie(&path, Lie::Endless, 1);
    let started = std::time::Instant::now();
    succeeded(&run(&mut s.command(&out, ONE_STREAM)), "fetch");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(60),
        "an endless body held the fetch for {:?}",
        started.elapsed()
    );
    s.verify(&out);
    let committed = committed_of(&out, &path);
    assert_eq!(committed, size, "more than the file was claimed");
}

/// How long a stalled body is held open: far past the read timeout the
/// check gives (2 s), so only the timeout can end it in time.
const STALL_HOLD: std::time::Duration = std::time::Duration::from_secs(90);

fn a_stalled_body_ends_at_the_read_timeout(s: &dyn Source, tmp: &Path) {
    let out = tmp.join("out");
    let (path, size) = s.largest();
    let after = usize::try_from(size / 3).unwrap();
    s.lie(
        &path,
        Lie::Stall {
            after,
            hold: STALL_HOLD,
        },
        1,
    );
    let mut args = ONE_STREAM.to_vec();
    args.extend(["--read-timeout", "2"]);
    let started = std::time::Instant::now();
    succeeded(&run(&mut s.command(&out, &args)), "fetch");
    let took = started.elapsed();
    assert!(
        took < STALL_HOLD / 2,
        "the stall was waited out: {took:?} with --read-timeout 2"
    );
    s.verify(&out);
    // The stalled read is an attempt of ftpipe's own, ended and retried.
    let outcomes = query(
        &out,
        &format!(
            "SELECT outcome FROM attempts WHERE path = {} ORDER BY id",
            sql_str(&path)
        ),
    );
    assert!(
        outcomes.len() >= 2 && outcomes.first().is_some_and(|o| o != "ok"),
        "the stall is not a recorded attempt: {outcomes:?}"
    );
}

/// Runs `check` against a fresh instance of `source`.
fn conform(source: fn(&Path) -> Box<dyn Source>, check: fn(&dyn Source, &Path)) {
    let tmp = tempfile::tempdir().unwrap();
    let s = source(tmp.path());
    check(s.as_ref(), tmp.path());
}

/// One module per implementation, one test per check: every check, or
/// (`source: check, …`) those listed.
macro_rules! conformance {
    ($source:ident: $($check:ident),+ $(,)?) => {
        mod $source {
            $(
                #[test]
                fn $check() {
                    super::conform(super::$source, super::$check);
                }
            )+
        }
    };
    ($($source:ident),* $(,)?) => {$(
        conformance!(
            $source: resume_after_a_kill,
            a_short_body_resumes,
            a_200_to_a_range_is_never_spliced,
            a_changed_validator_restarts_from_byte_0,
            a_refused_range_is_retried_from_the_watermark,
            an_endless_body_is_bounded,
            a_stalled_body_ends_at_the_read_timeout,
        );
    )*};
}

conformance!(hub, mirror, pull);

/// The registry's blobs (`pull oci://…`, the distribution registry behind
/// the lying proxy): a layer is asked by its digest.
struct Oci {
    _reg: crate::common::registry::Registry,
    proxy: LyingProxy,
    home: PathBuf,
    source: String,
    artifact: PathBuf,
    digests: std::collections::HashMap<String, String>,
    largest: (String, u64),
}

fn registry(tmp: &Path) -> Box<dyn Source> {
    let src = built(tmp, 64);
    let reg = crate::common::registry::Registry::start();
    let o = crate::oci::publish(tmp, &src, &reg.reference("models/qwen:v1"), &[]);
    assert!(o.status.success(), "publish: {}", stderr(&o));
    let manifest = manifest_json(&src);
    let components = manifest["components"].as_array().unwrap();
    let digests = components
        .iter()
        .map(|c| {
            let path = c["path"].as_str().unwrap().to_owned();
            (path, format!("sha256:{}", c["sha256"].as_str().unwrap()))
        })
        .collect();
    let largest = components
        .iter()
        .map(|c| {
            (
                c["path"].as_str().unwrap().to_owned(),
                c["size"].as_u64().unwrap(),
            )
        })
        .max_by_key(|(_, size)| *size)
        .unwrap();
    let proxy = LyingProxy::start(&format!("http://{}", reg.host()));
    let host = proxy.endpoint().trim_start_matches("http://").to_owned();
    Box::new(Oci {
        _reg: reg,
        proxy,
        home: tmp.to_owned(),
        source: format!("oci://{host}/models/qwen:v1"),
        artifact: src.join("artifact"),
        digests,
        largest,
    })
}

impl Oci {
    fn blob(&self, path: &str) -> String {
        format!("blobs/{}", self.digests[path])
    }
}

impl Source for Oci {
    fn command(&self, out: &Path, extra: &[&str]) -> Command {
        let mut cmd = ftpipe();
        cmd.env("HOME", &self.home)
            .env_remove("REGISTRY_AUTH_FILE")
            .args(["pull", &self.source, "--plain-http", "--out"])
            .arg(out)
            .args(["--retry-base-ms", "20"])
            .args(extra);
        cmd
    }

    fn largest(&self) -> (String, u64) {
        self.largest.clone()
    }

    fn lie(&self, path: &str, lie: Lie, times: usize) {
        self.proxy.lie(&self.blob(path), lie, times);
    }

    fn replace(&self, _path: &str) {
        unreachable!("a blob is content-addressed: its bytes cannot change under its digest")
    }

    fn ranges(&self, path: &str) -> Vec<Option<String>> {
        let suffix = format!("/{}", self.blob(path));
        self.proxy
            .seen()
            .into_iter()
            .filter(|r| r.method == "GET" && r.target.split('?').next().unwrap().ends_with(&suffix))
            .map(|r| r.range)
            .collect()
    }

    fn verify(&self, out: &Path) {
        assert_eq!(manifest_sha(out), manifest_sha_in(&self.artifact));
        run_ok(
            ftpipe()
                .arg("verify")
                .arg(out.join("artifact"))
                .arg("--deep"),
        );
    }
}

// The registry runs every check but `a_changed_validator_restarts_from_byte_0`:
// a blob's validator is its digest, which names its bytes; the same name
// can never hold other bytes (a moved tag is a new pin, refused without
// `--repin`: `oci::a_tag_naming_another_artifact_is_refused_unless_forced`).
conformance!(
    registry: resume_after_a_kill,
    a_short_body_resumes,
    a_200_to_a_range_is_never_spliced,
    a_refused_range_is_retried_from_the_watermark,
    an_endless_body_is_bounded,
    a_stalled_body_ends_at_the_read_timeout,
);

/// Xet storage: the fixture hub names the Xet hash of the repo's one
/// shard and a read token for Hugging Face's `local_cas_server` (filled
/// by `hf_xet`), behind the lying proxy; the file is fetched by
/// reconstruction (`fetch/src/xet`). Its body requests, told the lies,
/// are the GETs of its xorb ranges: the repo has one LFS file, so every
/// xorb GET is of it. Its `ranges` are theirs too, in xorb bytes as the
/// lies' `after` are (where a cut body is asked again); the span a resume
/// asks the reconstruction for is the attempt's `range_start`, which the
/// checks read from the state.
struct Xet {
    hub: RunningHub,
    _cas: LocalCas,
    proxy: LyingProxy,
    files: Vec<ftpipe_fixtures::RepoFile>,
    largest: (String, u64),
    xet_hash: String,
}

/// The path of every xorb GET the CAS names (`local_cas_server`'s
/// `/v1/fetch_term?term=…`).
const XORB_GET: &str = "v1/fetch_term";

fn xet(_tmp: &Path) -> Box<dyn Source> {
    // One shard of a ~16 MiB repo (~5 MiB, several 1 MiB batches: a cut
    // at a third of it is past the first) and its small files; the index
    // naming the others is left out (a fetch never reads it).
    let generated = ftpipe_fixtures::checkpoint::generate_small_repo(65, 16 << 20);
    let shard = lfs_file(&generated).path.clone();
    let files: Vec<_> = generated
        .into_iter()
        .filter(|f| f.path == shard || !f.path.contains(".safetensors"))
        .collect();
    let hub = hub_serving(files.clone());
    let (cas, proxy, hashes) = crate::xet_source::behind_proxy(&hub, &files);
    assert_eq!(hashes.len(), 1, "one file in Xet: {hashes:?}");
    let xet_hash = hashes.into_values().next().unwrap();
    let largest = (shard.clone(), content_len(lfs_file(&files)));
    Box::new(Xet {
        hub,
        _cas: cas,
        proxy,
        files,
        largest,
        xet_hash,
    })
}

impl Source for Xet {
    fn command(&self, out: &Path, extra: &[&str]) -> Command {
        fetch_cmd(&self.hub.endpoint(), out, extra)
    }

    fn largest(&self) -> (String, u64) {
        self.largest.clone()
    }

    fn lie(&self, path: &str, lie: Lie, times: usize) {
        assert_eq!(path, self.largest.0, "the one Xet file");
        let lie = match lie {
            // `local_cas_server` answers a xorb GET without `Range` with
            // the range its URL names (`206`), not the whole xorb: the
            // whole-object answer is told as its status line, `200`.
            Lie::IgnoreRange => Lie::StatusOk,
            // The resumed range is asked twice: of the reconstruction (in
            // file bytes) and then of the xorb; each refuses it once.
            Lie::RefuseRange => {
                let recon = format!("v2/reconstructions/{}", self.xet_hash);
                self.proxy.lie(&recon, lie, times);
                lie
            }
            other => other,
        };
        self.proxy.lie(XORB_GET, lie, times);
    }

    fn replace(&self, _path: &str) {
        unreachable!("a Xet file is content-addressed: its Xet hash names its bytes")
    }

    fn ranges(&self, path: &str) -> Vec<Option<String>> {
        assert_eq!(path, self.largest.0, "the one Xet file");
        self.proxy
            .seen()
            .into_iter()
            .filter(|r| r.method == "GET" && r.target.contains(XORB_GET))
            .map(|r| r.range)
            .collect()
    }

    fn verify(&self, out: &Path) {
        assert_files_match(out, &self.files);
        assert_clean_audit(out);
        // Through the CAS: no body from the hub, its terms recorded.
        let path = &self.largest.0;
        assert!(
            body_requests(&self.hub, path).is_empty(),
            "{path} via resolve"
        );
        let terms = query(
            out,
            &format!(
                "SELECT COUNT(*) FROM xet_terms WHERE path = {}",
                sql_str(path)
            ),
        );
        assert_ne!(terms, ["0"], "{path}: no Xet term recorded");
    }

    fn expect(&self) -> Expect {
        Expect {
            on_a_200: On200::RefusedAndAskedAgain,
            // A batch (1 MiB decoded, ending at a chunk: up to 128 KiB
            // more) is recorded before it is handed on; a cut inside one
            // loses it.
            cut_loses_at_most: (1 << 20) + (128 << 10),
        }
    }
}

// Xet runs every check but `a_changed_validator_restarts_from_byte_0`: its
// validator is the file's Xet hash, which names its bytes (other bytes are
// another hash, another listing: a new pin).
conformance!(
    xet: resume_after_a_kill,
    a_short_body_resumes,
    a_200_to_a_range_is_never_spliced,
    a_refused_range_is_retried_from_the_watermark,
    an_endless_body_is_bounded,
    a_stalled_body_ends_at_the_read_timeout,
);
