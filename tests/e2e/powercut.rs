//! Power cuts during `ftpipe run` (fetch + convert), on a filesystem that
//! keeps only what was fsynced.
//!
//! SIGKILL (the `crash` and `convert_crash` modules) keeps the page cache, so
//! it cannot catch a missing fsync. Here the output directory lives on
//! `ftpipe_fixtures::powercut`, an in-memory FUSE filesystem with the
//! strictest POSIX model: a file's bytes survive only up to its last fsync,
//! a directory entry (create, rename, unlink) only once its directory was
//! fsynced. The filesystem is served from this test process (mounted with
//! mount(2): root and /dev/fuse needed, else `skip_unless_ci`); a cut holds
//! its lock while it writes the durable view to a plain directory, the
//! "disk after the power came back".
//!
//! Setup: a generated qwen4_exp checkpoint (`QwenShape::medium`, ~83 MB of
//! sources, ~26 MB of artifact) on the fixture hub; one uninterrupted
//! `ftpipe run` on the normal disk gives the reference manifest; on the
//! power-cut filesystem a `fetch` then a `run` calibrate both phases' times
//! (and a cut after them must keep the whole result). Then `CUTS` cycles,
//! seeded (`FTPIPE_CRASH_SEED` replays the delays), in chains of `CHAIN`:
//! mount the tree the previous cut left (all of it durable; a chain starts
//! afresh), start `ftpipe run`, wait a random delay within the time the run
//! has left, SIGKILL it, cut the power, unmount. The very first cycle
//! instead aborts at a durable split (`FTPIPE_CRASH_AT=range-split#N`,
//! N seeded): a piece's claim (its split and its attempt's row, one
//! transaction committed while the request is on its way) is durable and
//! its range has no byte yet; the recovered database must hold such a
//! claim whole, and the chain resumes from it.
//!
//! After every cut, on the recovered tree (read-only):
//! * `PRAGMA integrity_check` is `ok`;
//! * every component receipt names a file in `artifact/` with the receipt's
//!   size and SHA-256;
//! * every download receipt names a file in `source/` with the receipt's
//!   size and digest (SHA-256 or git blob id);
//! * every ledger watermark without a receipt is backed by that many bytes
//!   of the `.part` (or final file), equal to the hub's bytes;
//! * the last recorded manifest SHA-256 is that of `artifact/manifest.json`.
//!
//! That is: the database never claims a byte that was not durable. A run that
//! finished before its cut must have kept everything (its manifest equals
//! the reference); the next cycle then starts afresh. At least one cut must
//! land mid-fetch with a surviving database and one mid-convert (extra
//! cycles, bounded, aim at a phase still missing).
//!
//! At the end `ftpipe run` finishes the last recovered tree on the normal
//! disk: the manifest equals the reference and the audit is clean.
//!
//! And every receipt ftpipe reported durable before the kill (its line-log
//! lines) is in the recovered database, a repo file in nested directories
//! included. Each chain starts from an empty, durable `out/`.
//!
//! A Hugging Face cache on the normal disk holds one shard whole and
//! another as an interrupted download (`<sha256>.incomplete`, half of it):
//! every run takes the first from the cache (copied across filesystems,
//! fsynced, renamed, then its receipt) and resumes the second from the
//! prefix; some cut must recover a file adopted from the cache. (The
//! prefix case found a bug: the segmented fetch cut such a prefix down to
//! its 64 KiB alignment before lowering the watermark, so a cut in between
//! left the ledger claiming bytes the file no longer held.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use ftpipe_fixtures::RepoFile;
use ftpipe_fixtures::checkpoint::SplitMix64;
use ftpipe_fixtures::powercut::{CutReport, Kind, Model, Mounted, ROOT};
use ftpipe_fixtures::qwen4::{QwenShape, generate_qwen4_repo};

const CUTS: usize = 24;

/// Cycles per chain of resumptions (see the loop in `power_cuts`).
const CHAIN: usize = 4;

/// Checkpoint the download watermark every 4 MiB (default 64 MiB), so cuts
/// mid-fetch find watermarks between 0 and the file size to check; shards
/// of 4 MiB and more are fetched as ranges (claimed in 2 MiB pieces, split
/// down to 1 MiB), so cuts also find several durable ranges of one file.
const RUN_ARGS: &[&str] = &[
    "--checkpoint-bytes",
    "4194304",
    "--segment-threshold",
    "4MiB",
    "--min-range",
    "1MiB",
    "--piece-size",
    "2MiB",
    "--connections",
    "6",
    "--split-below-rate",
    "0",
];

/// `--hf-cache DIR` of the cache built by `hf_cache_of` (set once).
static HF_CACHE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// `RUN_ARGS` plus the cache.
fn args() -> Vec<&'static str> {
    let mut a = RUN_ARGS.to_vec();
    if let Some(c) = HF_CACHE.get() {
        a.extend(["--hf-cache", c.as_str()]);
    }
    a
}

/// A hub cache for `REPO` under `dir` holding `whole` as a blob and the
/// first half of `half` as an interrupted download.
fn hf_cache_of(dir: &Path, whole: &[u8], half: &[u8]) -> PathBuf {
    let blobs = dir
        .join(format!("models--{}", REPO.replace('/', "--")))
        .join("blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::write(blobs.join(sha256_hex(whole)), whole).unwrap();
    std::fs::write(
        blobs.join(format!("{}.incomplete", sha256_hex(half))),
        &half[..half.len() / 2],
    )
    .unwrap();
    dir.to_owned()
}

/// SIGKILLs the child on drop, so a failing test never leaves a process
/// holding the mount (declared after the mount: dropped first).
struct KillOnDrop(Option<Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn git_blob_id(bytes: &[u8]) -> String {
    use sha1::Digest;
    let mut h = sha1::Sha1::new();
    h.update(format!("blob {}\0", bytes.len()).as_bytes());
    h.update(bytes);
    hex::encode(h.finalize())
}

/// Rows of `sql` (one text column joined with `|`), split into fields; empty
/// when the table does not exist yet (cut before the migration was durable).
pub(crate) fn rows(out: &Path, sql: &str, what: &str) -> Vec<Vec<String>> {
    match try_query(out, sql) {
        Ok(r) => r
            .into_iter()
            .map(|r| r.split('|').map(str::to_owned).collect())
            .collect(),
        Err(e) if e.contains("no such table") => Vec::new(),
        Err(e) => panic!("{what}: {e}"),
    }
}

/// What the recovered database claims, once checked.
#[derive(Debug, Default)]
struct Claims {
    /// Paths with a download receipt.
    receipts: BTreeSet<String>,
    /// Components with a receipt.
    components: BTreeSet<String>,
    /// Σ ledger watermarks.
    committed: u64,
    /// Files without a receipt whose watermark (> 0) was checked against
    /// the bytes of their `.part`.
    watermarks: usize,
    /// Ranges (of files fetched in segments) checked that way.
    ranges: usize,
    /// A manifest is recorded (and its file matches).
    manifest: bool,
    /// The state database survived (else nothing is claimed).
    database: bool,
}

/// Opens the state database of `out` read-write once, so SQLite rolls back
/// its hot journal as ftpipe's next open would; a journal must be there.
fn roll_back_hot_journal(out: &Path, cut: &str) {
    use sqlx::Connection;
    let db = out.join(".ftpipe/state.db");
    let journal = out.join(".ftpipe/state.db-journal");
    assert!(
        journal.is_file(),
        "{cut}: read-only rollback refused without a journal"
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let opts = sqlx::sqlite::SqliteConnectOptions::new().filename(&db);
        let mut conn = sqlx::SqliteConnection::connect_with(&opts)
            .await
            .unwrap_or_else(|e| panic!("{cut}: open state db to roll back: {e}"));
        sqlx::query("PRAGMA integrity_check")
            .fetch_all(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{cut}: roll back the hot journal: {e}"));
        conn.close().await.unwrap();
    });
}

/// False when `out` holds no state database (nothing durable claims
/// anything); else asserts that it is intact after the cut named `cut`.
pub(crate) fn state_db_ok(out: &Path, cut: &str) -> bool {
    if !out.join(".ftpipe/state.db").is_file() {
        return false;
    }
    let integrity = match try_query(out, "PRAGMA integrity_check") {
        // A cut while SQLite created the file (before its WAL header was
        // durable) leaves a hot rollback journal, which a read-only
        // connection cannot roll back (SQLITE_READONLY_ROLLBACK). ftpipe's
        // next open rolls it back (`Store::open`); so does this one.
        Err(e) if e.contains("(code: 776)") => {
            roll_back_hot_journal(out, cut);
            try_query(out, "PRAGMA integrity_check")
        }
        other => other,
    };
    assert_eq!(
        integrity,
        Ok(vec!["ok".to_owned()]),
        "{cut}: state database damaged"
    );
    true
}

/// Checks that everything the database in `out` claims is on disk in `out`
/// (see the module docs). `cut` names the cut in messages.
fn check_recovered(out: &Path, hub_files: &BTreeMap<String, Vec<u8>>, cut: &str) -> Claims {
    let mut claims = Claims::default();
    if !state_db_ok(out, cut) {
        return claims; // nothing durable claims anything
    }
    claims.database = true;

    for r in rows(
        out,
        "SELECT path || '|' || size || '|' || sha256 FROM components",
        "components",
    ) {
        let (p, size, sha) = (&r[0], r[1].parse::<u64>().unwrap(), &r[2]);
        let bytes = std::fs::read(out.join("artifact").join(p)).unwrap_or_else(|e| {
            panic!(
                "{cut}: component receipt for {p} ({size} B) but the file did not survive \
                 the power cut ({e}): the receipt was committed before the file's \
                 directory entry was durable (missing directory fsync?)"
            )
        });
        assert!(
            bytes.len() as u64 == size && sha256_hex(&bytes) == *sha,
            "{cut}: component receipt for {p} claims {size} B sha256 {sha}, but the durable \
             file has {} B sha256 {}: the receipt was committed before the bytes were \
             durable (missing fsync?)",
            bytes.len(),
            sha256_hex(&bytes)
        );
        claims.components.insert(p.clone());
    }

    for r in rows(
        out,
        "SELECT path || '|' || size || '|' || digest_kind || '|' || digest FROM receipts",
        "receipts",
    ) {
        let (p, size, kind, digest) = (&r[0], r[1].parse::<u64>().unwrap(), &r[2], &r[3]);
        let bytes = std::fs::read(out.join("source").join(p)).unwrap_or_else(|e| {
            panic!(
                "{cut}: download receipt for {p} ({size} B) but the file did not survive \
                 the power cut ({e}): missing directory fsync before the receipt?"
            )
        });
        let got = match kind.as_str() {
            "sha256" => sha256_hex(&bytes),
            "git-sha1" => git_blob_id(&bytes),
            other => panic!("{cut}: unknown digest kind {other}"),
        };
        assert!(
            bytes.len() as u64 == size && got == *digest,
            "{cut}: download receipt for {p} claims {size} B {kind} {digest}, but the \
             durable file has {} B {kind} {got} (missing fsync before the receipt?)",
            bytes.len()
        );
        claims.receipts.insert(p.clone());
    }

    for r in rows(
        out,
        "SELECT path || '|' || committed_bytes FROM ledger",
        "ledger",
    ) {
        let (p, committed) = (&r[0], r[1].parse::<usize>().unwrap());
        claims.committed += committed as u64;
        if claims.receipts.contains(p) || committed == 0 {
            continue;
        }
        claims.ranges += check_watermark(
            out,
            &out.join("source"),
            p,
            committed,
            &hub_files[p.as_str()],
            cut,
        );
        claims.watermarks += 1;
    }

    let manifests = rows(
        out,
        "SELECT event || '|' || COALESCE(manifest_sha256, '') FROM artifacts ORDER BY id",
        "artifacts",
    );
    if let Some(last) = manifests.last().filter(|r| r[0] == "manifest") {
        let got = std::fs::read(out.join("artifact/manifest.json"))
            .map(|b| sha256_hex(&b))
            .unwrap_or_else(|e| format!("missing ({e})"));
        assert_eq!(
            got, last[1],
            "{cut}: manifest recorded with sha256 {} but the durable manifest.json is {got}",
            last[1]
        );
        claims.manifest = true;
    }
    claims
}

/// [`check_watermark`] for every ledger row of `out` with committed bytes
/// and no receipt in `receipted`, against `want` (path → bytes); how many.
pub(crate) fn check_watermarks(
    out: &Path,
    dir: &Path,
    receipted: &std::collections::BTreeSet<String>,
    want: &BTreeMap<String, Vec<u8>>,
    cut: &str,
) -> usize {
    let mut n = 0;
    for r in rows(
        out,
        "SELECT path || '|' || committed_bytes FROM ledger",
        "ledger",
    ) {
        let (p, committed) = (&r[0], r[1].parse::<usize>().unwrap());
        if receipted.contains(p) || committed == 0 {
            continue;
        }
        check_watermark(out, dir, p, committed, &want[p.as_str()], cut);
        n += 1;
    }
    n
}

/// Checks the durable bytes of `p` under `dir` (a file without a receipt
/// whose ledger claims `committed` > 0 bytes, in `.part` or, renamed and
/// not yet receipted, final) against `want`: each range of a file fetched
/// in segments at its place, the ranges adding up to the ledger, else the
/// first `committed` bytes. Returns the ranges that claimed bytes.
pub(crate) fn check_watermark(
    out: &Path,
    dir: &Path,
    p: &str,
    committed: usize,
    want: &[u8],
    cut: &str,
) -> usize {
    let fin = dir.join(p);
    let part = PathBuf::from(format!("{}.part", fin.display()));
    let bytes = std::fs::read(&part)
        .or_else(|_| std::fs::read(&fin))
        .unwrap_or_default();
    // A file fetched in ranges: each range's durable bytes, at its place.
    let ranges = rows(
        out,
        &format!(
            "SELECT start || '|' || watermark FROM fetch_ranges WHERE path = {} ORDER BY start",
            sql_str(p)
        ),
        "fetch_ranges",
    );
    if !ranges.is_empty() {
        let (mut sum, mut claimed) = (0, 0);
        for range in &ranges {
            let (start, mark) = (
                range[0].parse::<usize>().unwrap(),
                range[1].parse::<usize>().unwrap(),
            );
            sum += mark - start;
            if mark == start {
                continue; // claims nothing (the sparse size may not have survived)
            }
            assert!(
                bytes.len() >= mark && bytes[start..mark] == want[start..mark],
                "{cut}: the range {start}..{mark} of {p} is claimed durable, but the bytes \
                 there after the power cut differ from the source's (watermark committed \
                 before fdatasync?)"
            );
            claimed += 1;
        }
        assert_eq!(
            sum, committed,
            "{cut}: {p}: ranges do not add up to the ledger"
        );
        return claimed;
    }
    assert!(
        bytes.len() >= committed,
        "{cut}: the ledger of {p} claims {committed} committed bytes but only {} \
         survived the power cut (watermark committed before fdatasync, or the \
         .part's directory entry never fsynced?)",
        bytes.len()
    );
    assert!(
        bytes[..committed] == want[..committed],
        "{cut}: the first {committed} bytes of {p} (committed in the ledger) differ \
         from the source's after the power cut"
    );
    0
}

/// A fresh filesystem holding an empty, durable `out/` (the user made the
/// output directory; what ftpipe creates inside it is its own to fsync).
pub(crate) fn fresh_model() -> Model {
    let mut m = Model::new();
    let out = m
        .create(ROOT, "out".as_ref(), Kind::Dir, 0o755, 0, 0)
        .unwrap();
    m.fsync(out).unwrap();
    m.fsync(ROOT).unwrap();
    m
}

/// Receipts ftpipe reported before it was killed (line-log lines,
/// printed only after the receipt's transaction committed).
#[derive(Debug, Default)]
struct Acked {
    files: BTreeSet<String>,
    components: BTreeSet<String>,
}

fn acked(stderr: &str) -> Acked {
    let mut a = Acked::default();
    for line in stderr.lines() {
        if let Some((path, rest)) = line.split_once(": ") {
            if rest.starts_with("verified and published") {
                a.files.insert(path.to_owned());
            } else if rest.contains(" written and durable") {
                a.components.insert(path.to_owned());
            }
        }
    }
    a
}

/// What one cycle saw.
struct Cycle {
    /// The run had exited (successfully) before the kill.
    finished: bool,
    acked: Acked,
    report: CutReport,
}

/// Where a cycle stops `ftpipe run` before the power is cut.
enum Stop {
    /// SIGKILL after this long.
    After(Duration),
    /// `FTPIPE_CRASH_AT=POINT#N`: the process aborts there.
    At(String),
}

/// One cycle: mount `model` on `mnt`, start `ftpipe run` on `mnt/out`,
/// stop it, cut the power into `dump`, unmount.
fn cycle(endpoint: &str, mnt: &Path, model: Model, dump: &Path, stop: &Stop) -> Cycle {
    std::fs::create_dir_all(mnt).unwrap();
    let mut mounted = Mounted::mount(mnt, model).expect("mount the power-cut filesystem");
    let mut cmd = run_cmd(endpoint, &mnt.join("out"), &args());
    if let Stop::At(point) = stop {
        cmd.env("FTPIPE_CRASH_AT", point);
    }
    let mut child = KillOnDrop(Some(
        cmd.stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    let (finished, o) = match stop {
        Stop::After(delay) => {
            std::thread::sleep(*delay);
            let c = child.0.as_mut().unwrap();
            let finished = c.try_wait().unwrap().is_some();
            let _ = c.kill(); // SIGKILL: the process is gone before the power is
            (
                finished,
                child.0.take().unwrap().wait_with_output().unwrap(),
            )
        }
        Stop::At(point) => {
            let o = child.0.take().unwrap().wait_with_output().unwrap();
            assert!(
                stderr(&o).contains(&format!("FTPIPE_CRASH_AT={point}: aborting here")),
                "{point} not reached: {}",
                stderr(&o)
            );
            (false, o)
        }
    };
    if finished {
        assert!(o.status.success(), "ftpipe run failed: {}", stderr(&o));
    }
    let report = mounted.cut(dump).expect("dump the durable view");
    Cycle {
        finished,
        acked: acked(&stderr(&o)),
        report,
    }
}

/// In-flight attempts that are claims whose range had nothing written
/// yet: each starting at the watermark of the range holding it, in
/// a range that a boundary with an untouched range after it ends (the
/// claim's split, a piece off an idle range or the front of a resumed
/// one). A claim commits its split and its attempt's row together, so a
/// cut right after it finds both.
fn fresh_claims(out: &Path) -> usize {
    rows(
        out,
        "SELECT COUNT(*) FROM attempts a JOIN fetch_ranges r ON r.path = a.path \
           AND a.range_start >= r.start AND a.range_start < r.end_ \
         WHERE a.outcome = 'in_flight' \
           AND a.range_start = r.watermark \
           AND EXISTS (SELECT 1 FROM fetch_ranges n WHERE n.path = r.path \
                       AND n.start = r.end_ AND n.watermark = n.start)",
        "fresh claims",
    )
    .first()
    .map_or(0, |r| r[0].parse().unwrap())
}

/// Runs `cmd` to completion and returns how long it took.
fn timed_ok(cmd: &mut std::process::Command) -> Duration {
    let t = Instant::now();
    run_ok(cmd);
    t.elapsed()
}

/// Regressions found by this harness: during the fetch nothing fsynced
/// `out/` after `.ftpipe/` and `source/` were created, so a cut lost the
/// state database and every downloaded byte; and the intermediate
/// directories of a nested source path were never fsynced into their
/// parents, so a receipt could outlive its file. Now every directory
/// ftpipe creates is fsynced up to an existing ancestor before anything in
/// it is claimed; besides "no false claim", every receipt ftpipe reported
/// before the kill must survive the cut, and a nested repo file is included.
#[test]
fn power_cuts_during_run_lose_nothing_reported_durable() {
    let _heavy = heavy();
    power_cuts(vec![RepoFile::bytes(
        "docs/notes/usage.md",
        &b"nested file: its directories are created by the fetch\n"[..],
    )]);
}

fn power_cuts(extra_files: Vec<RepoFile>) {
    if !Path::new("/dev/fuse").exists() {
        skip_unless_ci("/dev/fuse is missing: cannot mount the power-cut filesystem");
        return;
    }
    let t0 = Instant::now();
    let seed = crash_seed();
    eprintln!("power-cut seed: {seed} (replay with FTPIPE_CRASH_SEED={seed})");
    let mut rng = SplitMix64::new(seed);
    let mut files: Vec<RepoFile> = generate_qwen4_repo(seed % 1000, QwenShape::medium());
    files.extend(extra_files);
    let hub_files = contents_by_path(&files);
    let hub = hub_serving(files);
    let endpoint = hub.endpoint();
    let tmp = tempfile::tempdir().unwrap();
    let mut shards = hub_files.keys().filter(|p| p.ends_with(".safetensors"));
    let (cached, seeded) = (
        shards.next().unwrap().clone(),
        shards.next().unwrap().clone(),
    );
    let cache = hf_cache_of(
        &tmp.path().join("hf-cache"),
        &hub_files[&cached],
        &hub_files[&seeded],
    );
    HF_CACHE.get_or_init(|| cache.display().to_string());

    let reference = tmp.path().join("reference");
    let t = timed_ok(&mut run_cmd(&endpoint, &reference, &args()));
    let want = manifest_sha(&reference);
    eprintln!("reference run on disk: {t:?}, manifest {want}");
    std::fs::remove_dir_all(&reference).unwrap();

    // Calibration on the power-cut filesystem: fetch, then the rest of the
    // run, each timed; then a cut, which must lose nothing.
    let mnt = tmp.path().join("mnt-calibration");
    std::fs::create_dir_all(&mnt).unwrap();
    let mut mounted = match Mounted::mount(&mnt, fresh_model()) {
        Ok(m) => m,
        Err(e) => {
            skip_unless_ci(&format!("cannot mount the power-cut filesystem: {e}"));
            return;
        }
    };
    let out = mnt.join("out");
    let mut fetch = fetch_cmd(&endpoint, &out, &args());
    fetch.arg("--json");
    let started = Instant::now();
    let fetched = run(&mut fetch);
    let t_fetch = started.elapsed();
    assert!(fetched.status.success(), "{}", stderr(&fetched));
    // Files go past the page cache on this filesystem too, split or one
    // stream, so the cuts below cover that path.
    let published = json_events(&fetched, "file_published");
    let past_cache = |split: bool| {
        published.iter().any(|p| {
            p.get("digest_catch_up_bytes").is_some() == split
                && p["direct_io_bytes"].as_u64().unwrap() > 0
        })
    };
    assert!(
        past_cache(true) && past_cache(false),
        "want a split file and a one-stream file written past the page cache: {published:?}"
    );
    let t_convert = timed_ok(&mut run_cmd(&endpoint, &out, &args()));
    let calib = tmp.path().join("calibration");
    let report = mounted.cut(&calib).unwrap();
    drop(mounted);
    let claims = check_recovered(&calib.join("out"), &hub_files, "cut after a finished run");
    assert!(
        claims.manifest,
        "a finished run's manifest did not survive the cut"
    );
    assert_eq!(
        manifest_sha(&calib.join("out")),
        want,
        "finished run, then cut"
    );
    eprintln!(
        "on the power-cut fs: fetch {t_fetch:?}, then run {t_convert:?}; cut after it: {report}"
    );
    std::fs::remove_dir_all(&calib).unwrap();
    let ms = |d: Duration| (d.as_millis() as u64).max(20);
    let (fetch_ms, convert_ms) = (ms(t_fetch), ms(t_convert));

    // Chains of up to CHAIN cycles: the first starts afresh and is cut
    // within the fetch's duration; each next one resumes from the tree the
    // previous cut left (afresh if that run had finished) and is cut within
    // the duration of what is left (the conversion once every download has
    // a receipt, else a whole run). Past CUTS, extra cycles (bounded) aim at
    // a phase no cut has hit yet: mid-fetch with a surviving database, or
    // mid-convert.
    let total = hub_files.len();
    let mut current: Option<(PathBuf, usize)> = None; // (tree, receipts in it)
    let (mut cuts, mut in_fetch, mut in_convert, mut after_finish) = (0, 0, 0, 0);
    // Cuts that found at least two durable ranges of files fetched in segments.
    let mut in_ranges = 0;
    // Cuts that recovered the receipt of the file taken from the cache.
    let mut from_cache = 0;
    // Durable claims found after the cut at a split (see `fresh_claims`).
    let mut at_claim = 0;
    while cuts < CUTS || ((in_fetch == 0 || in_convert == 0 || in_ranges == 0) && cuts < 3 * CUTS) {
        let aim_at_fetch = if cuts < CUTS {
            cuts % CHAIN == 0
        } else {
            in_fetch == 0 || in_ranges == 0
        };
        cuts += 1;
        if aim_at_fetch && let Some((prev, _)) = current.take() {
            std::fs::remove_dir_all(prev).unwrap();
        }
        let fetched = current.as_ref().is_some_and(|(_, r)| *r == total);
        let window = if aim_at_fetch {
            fetch_ms
        } else if fetched {
            convert_ms
        } else {
            fetch_ms + convert_ms
        };
        // The first cut stops at a durable split before its range has a
        // byte: the window between a piece's claim and its first write.
        let stop = if cuts == 1 {
            Stop::At(format!("range-split#{}", 1 + rng.next_u64() % 4))
        } else {
            Stop::After(Duration::from_millis(rng.next_u64() % window))
        };
        let (model, start) = match &current {
            Some((tree, _)) => (Model::load_dir(tree).unwrap(), "resumed"),
            None => (fresh_model(), "empty out/"),
        };
        let dump = tmp.path().join(format!("cut-{cuts}"));
        let mnt = tmp.path().join(format!("mnt-{cuts}"));
        let c = cycle(&endpoint, &mnt, model, &dump, &stop);
        if let Some((prev, _)) = current.take() {
            std::fs::remove_dir_all(prev).unwrap();
        }
        let name = match &stop {
            Stop::After(delay) => format!("cut {cuts} ({start}, after {delay:?})"),
            Stop::At(point) => format!("cut {cuts} ({start}, at {point})"),
        };
        let claims = check_recovered(&dump.join("out"), &hub_files, &name);
        if matches!(stop, Stop::At(_)) {
            let fresh = fresh_claims(&dump.join("out"));
            assert!(
                fresh > 0,
                "{name}: the claim's split and its in-flight attempt did not survive \
                 the cut together"
            );
            at_claim += fresh;
        }
        in_ranges += usize::from(claims.ranges >= 2);
        from_cache += usize::from(claims.receipts.contains(&cached) && !c.finished);
        let lost_files: Vec<_> = c.acked.files.difference(&claims.receipts).collect();
        let lost_components: Vec<_> = c.acked.components.difference(&claims.components).collect();
        let phase = if c.finished {
            "run had finished"
        } else if claims.receipts.len() < total {
            if claims.database {
                in_fetch += 1;
            }
            "mid-fetch"
        } else if !claims.manifest {
            in_convert += 1;
            "mid-convert"
        } else {
            "after the manifest"
        };
        eprintln!(
            "{name}: {phase}; recovered {}/{total} download receipts, {} B committed \
             ({} partial watermarks, {} ranges checked), {} component receipts, manifest {}; \
             reported durable before the kill: {} files, {} components ({} + {} lost); {}",
            claims.receipts.len(),
            claims.committed,
            claims.watermarks,
            claims.ranges,
            claims.components.len(),
            if claims.manifest {
                "recorded"
            } else {
                "not yet"
            },
            c.acked.files.len(),
            c.acked.components.len(),
            lost_files.len(),
            lost_components.len(),
            c.report
        );
        assert!(
            lost_files.is_empty() && lost_components.is_empty(),
            "{name}: receipts ftpipe reported durable were lost in the power cut: \
             files {lost_files:?}, components {lost_components:?} (the state database \
             or a directory on its path was never fsynced into its parent?)"
        );
        if c.finished {
            // Nothing was in flight: everything must have survived.
            after_finish += 1;
            assert_eq!(manifest_sha(&dump.join("out")), want, "{name}");
            std::fs::remove_dir_all(&dump).unwrap();
        } else {
            current = Some((dump, claims.receipts.len()));
        }
    }
    assert!(
        in_fetch > 0 && in_convert > 0,
        "no cut landed mid-fetch (with a surviving database) or mid-convert"
    );
    assert!(
        in_ranges > 0,
        "no cut found several durable ranges of a file fetched in segments"
    );
    assert!(
        from_cache > 0,
        "no cut recovered the receipt of the file taken from the Hugging Face cache"
    );

    let last = match current {
        Some((tree, _)) => tree,
        None => {
            let fresh = tmp.path().join("fresh");
            std::fs::create_dir_all(fresh.join("out")).unwrap();
            fresh
        }
    };
    let out = last.join("out");
    run_ok(&mut run_cmd(&endpoint, &out, &args()));
    assert_eq!(manifest_sha(&out), want, "recovered run's manifest differs");
    assert_clean_audit(&out);
    let cache_bytes = query(
        &out,
        &format!(
            "SELECT cache_bytes FROM ledger WHERE path = {}",
            sql_str(&cached)
        ),
    );
    assert_eq!(
        cache_bytes,
        [hub_files[&cached].len().to_string()],
        "{cached} was not taken from the cache"
    );
    eprintln!(
        "{cuts} cuts ({in_fetch} mid-fetch, {in_ranges} with several durable ranges, \
         one at a durable claim ({at_claim} claims with nothing written), \
         {from_cache} with the cached file's receipt, \
         {in_convert} mid-convert, {after_finish} after the run had finished), then finished \
         on disk; {:?} in all",
        t0.elapsed()
    );
}

/// The durable path a repin adds: the old pin's `.part` geometry kept in
/// `superseded_parts`, its tails recorded as `superseded_by_repin`, the
/// `.part` emptied, then the rows forgotten. A shard is left half fetched
/// in ranges by a SIGKILL (on the normal disk), the branch moves, and
/// `fetch --repin` on the power-cut filesystem is cut again and again: at
/// the crash points after the first tail is recorded and after the `.part`
/// is emptied (no tail is counted twice on the way), then at random
/// delays. After every cut the database
/// claims nothing that is not durable (checked against the content of the
/// commit it is pinned to), rows of the old `.part` outlive neither its
/// emptying nor the start of the new bytes, and the ledger adds up; the
/// last tree then finishes on disk to the new content and a clean audit.
#[test]
fn power_cuts_while_a_repin_settles_a_partly_segmented_part() {
    let _heavy = heavy();
    if !Path::new("/dev/fuse").exists() {
        skip_unless_ci("/dev/fuse is missing: cannot mount the power-cut filesystem");
        return;
    }
    let seed = crash_seed();
    eprintln!("power-cut seed: {seed} (replay with FTPIPE_CRASH_SEED={seed})");
    let mut rng = SplitMix64::new(seed);
    let shard = "model-00001-of-00001.safetensors".to_owned();
    let old: Vec<u8> = (0..9u64 << 20).map(|i| (i * 131 % 251) as u8).collect();
    let mut new = old.clone();
    new[12345] ^= 1;
    let readme = b"# repinned\n".to_vec();
    let contents = |shard_bytes: &[u8]| -> BTreeMap<String, Vec<u8>> {
        [
            (shard.clone(), shard_bytes.to_vec()),
            ("README.md".to_owned(), readme.clone()),
        ]
        .into_iter()
        .collect()
    };
    let (old_files, new_files) = (contents(&old), contents(&new));
    let hub = hub_serving(
        old_files
            .iter()
            .map(|(p, b)| RepoFile::bytes(p.clone(), b.clone()))
            .collect(),
    );
    let endpoint = hub.endpoint();
    let old_commit = hub.commit(REPO, "main").unwrap();
    // About 650 KB/s per connection: the fetch of the shard takes seconds.
    hub.inject(
        ftpipe_fixtures::FaultRule::new(
            &shard,
            ftpipe_fixtures::Fault::Trickle {
                bytes: 64 * 1024,
                every_ms: 100,
            },
        )
        .times(100_000),
    );
    let tmp = tempfile::tempdir().unwrap();

    // The old pin's fetch, killed once two ranges hold durable bytes.
    let first = tmp.path().join("first");
    let out = first.join("out");
    let mut child = KillOnDrop(Some(
        fetch_cmd(&endpoint, &out, RUN_ARGS)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    ));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "ranges never got going");
        let c = child.0.as_mut().unwrap();
        assert!(c.try_wait().unwrap().is_none(), "the first fetch finished");
        let durable = try_query(
            &out,
            "SELECT count(*) FROM fetch_ranges WHERE watermark > start",
        );
        if durable.is_ok_and(|v| v[0].parse::<u32>().unwrap() >= 2) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(child);
    assert!(
        PathBuf::from(format!(
            "{}.part",
            out.join("source").join(&shard).display()
        ))
        .exists()
    );

    // The branch moves; the repin runs on the power-cut filesystem.
    let new_commit = hub.update_file(REPO, &shard, new.clone()).unwrap();
    let mut current = first;
    let (mut settling, mut after_repin) = (0, 0);
    let superseded_bytes = |out: &Path| {
        query(
            out,
            &format!(
                "SELECT COALESCE(SUM(bytes), 0) FROM discards WHERE path = {} \
                 AND reason = 'superseded_by_repin'",
                sql_str(&shard)
            ),
        )[0]
        .parse::<u64>()
        .unwrap()
    };
    let mut superseded_after = Vec::new();
    for cut in 1..=10 {
        // The first two runs abort at the settling's crash points, the
        // others are killed anywhere.
        let crash_at = match cut {
            1 => Some("superseded-tail-recorded"),
            2 => Some("superseded-part-emptied"),
            _ => None,
        };
        let delay = Duration::from_millis(rng.next_u64() % 2500);
        let mnt = tmp.path().join(format!("mnt-{cut}"));
        std::fs::create_dir_all(&mnt).unwrap();
        let mounted = Mounted::mount(&mnt, Model::load_dir(&current).unwrap());
        let mut mounted = match mounted {
            Ok(m) => m,
            Err(e) => {
                skip_unless_ci(&format!("cannot mount the power-cut filesystem: {e}"));
                return;
            }
        };
        let mut args = vec!["--repin"];
        args.extend_from_slice(RUN_ARGS);
        let mut cmd = fetch_cmd(&endpoint, &mnt.join("out"), &args);
        if let Some(point) = crash_at {
            cmd.env("FTPIPE_CRASH_AT", point);
        }
        let mut child = KillOnDrop(Some(
            cmd.stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        ));
        if let Some(point) = crash_at {
            let o = child.0.take().unwrap().wait_with_output().unwrap();
            assert!(
                stderr(&o).contains(&format!("FTPIPE_CRASH_AT={point}#1: aborting here")),
                "cut {cut}: {point} not reached: {}",
                stderr(&o)
            );
        } else {
            std::thread::sleep(delay);
            if let Some(mut c) = child.0.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        let dump = tmp.path().join(format!("cut-{cut}"));
        let report = mounted.cut(&dump).expect("dump the durable view");
        drop(mounted);
        let out = dump.join("out");
        let name = match crash_at {
            Some(point) => format!("repin cut {cut} (at {point})"),
            None => format!("repin cut {cut} (after {delay:?})"),
        };
        let pinned = rows(&out, "SELECT commit_sha FROM pin", "pin");
        let on_new = pinned.first().is_some_and(|r| r[0] == new_commit);
        assert!(
            on_new || pinned.first().is_some_and(|r| r[0] == old_commit),
            "{name}: pinned to {pinned:?}"
        );
        let files = if on_new { &new_files } else { &old_files };
        let claims = check_recovered(&out, files, &name);
        let superseded = rows(
            &out,
            &format!(
                "SELECT count(*) FROM superseded_parts WHERE path = {}",
                sql_str(&shard)
            ),
            "superseded_parts",
        );
        let superseded = superseded.first().is_some_and(|r| r[0] != "0");
        if superseded {
            settling += 1;
            // Until the old `.part` is emptied nothing of the new pin is claimed.
            assert!(on_new, "{name}: superseded rows under the old pin");
            let l = ledger(&out, &shard);
            assert_eq!(l.committed, 0, "{name}: {l:?}");
            assert_eq!(
                query(&out, "SELECT count(*) FROM fetch_ranges"),
                ["0"],
                "{name}: new ranges while the old part is unsettled"
            );
        } else if on_new {
            after_repin += 1;
        }
        if crash_at.is_some() {
            assert!(superseded, "{name}: the old part's rows are gone");
        }
        if crash_at == Some("superseded-part-emptied") {
            let part = PathBuf::from(format!(
                "{}.part",
                out.join("source").join(&shard).display()
            ));
            assert_eq!(
                std::fs::metadata(&part).map(|m| m.len()).ok(),
                Some(0),
                "{name}"
            );
        }
        superseded_after.push(if on_new { superseded_bytes(&out) } else { 0 });
        if claims.database {
            for l in ledger_snapshot(&out) {
                assert_eq!(l.transferred, l.committed + l.discarded, "{name}: {l:?}");
            }
        }
        eprintln!(
            "{name}: pinned to the {} commit, old part {}, {} B committed; {report}",
            if on_new { "new" } else { "old" },
            if superseded {
                "not yet settled"
            } else {
                "settled or none"
            },
            claims.committed
        );
        std::fs::remove_dir_all(&current).unwrap();
        current = dump;
    }
    assert!(
        after_repin > 0,
        "no cut landed after the repin was committed"
    );
    // Recorded tails are never counted again: once the part was emptied,
    // the old pin's discards stay as they were.
    assert!(
        superseded_after[1] >= superseded_after[0],
        "{superseded_after:?}"
    );
    for later in &superseded_after[2..] {
        assert_eq!(*later, superseded_after[1], "{superseded_after:?}");
    }
    eprintln!("{settling} cuts found the old part unsettled, {after_repin} after it");

    let out = current.join("out");
    hub.clear_faults();
    let mut args = vec!["--repin"];
    args.extend_from_slice(RUN_ARGS);
    run_ok(&mut fetch_cmd(&endpoint, &out, &args));
    assert_eq!(std::fs::read(out.join("source").join(&shard)).unwrap(), new);
    assert_clean_audit(&out);
    let l = ledger(&out, &shard);
    assert_eq!(l.transferred, l.committed + l.discarded, "{l:?}");
    assert_eq!(l.committed, new.len() as u64);
    assert_eq!(query(&out, "SELECT count(*) FROM superseded_parts"), ["0"]);
    assert!(
        discard_reasons(&out, &shard).contains(&"superseded_by_repin".to_owned()),
        "{:?}",
        discards(&out, &shard)
    );
}

/// The durable path a Xet resume adds (`xet_tail`): bytes a crash left
/// past a range's watermark, proven by their recorded chunk hashes, are
/// fsynced (`tail-proven`) and only then claimed. A Xet shard fetched in
/// two ranges on the power-cut filesystem is cut again and again: after a
/// checkpoint's fsync whose watermarks were never committed (a durable
/// tail), at `tail-proven` (a proven tail fsynced, not claimed), right
/// after a batch was recorded and before it was written (a tail the cut
/// loses: it must not be claimed), after a kill without a cut whose tail
/// the next run keeps before it is cut (what it claimed must have been
/// fsynced), then at seeded ones of those points until a run finishes. After every cut
/// the database claims nothing that is not durable and the ledger adds
/// up; some resume must have kept a tail; the last tree then finishes on
/// disk, whole, with a clean audit.
#[test]
fn power_cuts_while_a_xet_resume_keeps_its_tails() {
    xet_power_cuts(&["--connections", "2", "--segment-threshold", "4MiB"]);
}

/// The same with the file fetched as one stream (its tail kept by the
/// stream's own path, `transfer::keep_proven_stream_tail`).
#[test]
fn power_cuts_while_a_xet_streams_resume_keeps_its_tail() {
    xet_power_cuts(&["--connections", "1", "--segment-threshold", "1GiB"]);
}

/// A Xet shard fetched with `layout` on the power-cut filesystem, cut at
/// the stops described above.
fn xet_power_cuts(layout: &[&str]) {
    let _heavy = heavy();
    if !Path::new("/dev/fuse").exists() {
        skip_unless_ci("/dev/fuse is missing: cannot mount the power-cut filesystem");
        return;
    }
    let seed = crash_seed();
    eprintln!("power-cut seed: {seed} (replay with FTPIPE_CRASH_SEED={seed})");
    let mut rng = SplitMix64::new(seed);
    let (hub, files, _cas, _proxy, _hashes) =
        crate::xet_source::xet_served_sized(seed % 1000, 64 << 20);
    let f = lfs_file(&files).clone();
    let want = contents_by_path(&files);
    let batches = content_len(&f) >> 20;
    let args = [layout, &["--jobs", "1", "--include", &f.path]].concat();
    let endpoint = hub.endpoint();
    let tmp = tempfile::tempdir().unwrap();
    // Each cut follows the runs of one list, on one mount: the first
    // four lists must be reached, then seeded single stops anywhere in the
    // rest (each run fetches less; once one finishes, the chain ends).
    let mut cycles: Vec<Vec<XetStop>> = vec![
        vec![XetStop::at("checkpoint-synced#2")],
        vec![XetStop::at("tail-proven#1")],
        // The third run has most of the file's batches left to fetch.
        vec![XetStop::at(format!("xet-term-recorded#{}", batches / 7))],
        // Killed without a cut and without a checkpoint (all it wrote is a
        // tail only the page cache holds), then a resume keeps that tail
        // and is cut right after the claim (before the rest is punched or
        // cut off, whose own fsync would hide a missing one): what it
        // claimed must have been fsynced first.
        vec![
            XetStop::unsynced("xet-term-recorded#6"),
            XetStop::at("tail-claimed#1"),
        ],
        // The same, cut once the resume fetches again.
        vec![
            XetStop::unsynced("xet-term-recorded#4"),
            XetStop::at("xet-term-recorded#1"),
        ],
    ];
    for _ in 0..5 {
        let n = 1 + rng.next_u64() % 3;
        cycles.push(vec![XetStop::at(match rng.next_u64() % 3 {
            0 => format!("checkpoint-synced#{n}"),
            1 => format!("xet-term-recorded#{n}"),
            _ => "tail-proven#1".to_owned(),
        })]);
    }
    let (mut current, mut kept) = (None::<PathBuf>, 0);
    for (cut, stops) in cycles.iter().enumerate() {
        let model = match &current {
            None => fresh_model(),
            Some(dir) => Model::load_dir(dir).unwrap(),
        };
        let mnt = tmp.path().join(format!("mnt-{cut}"));
        std::fs::create_dir_all(&mnt).unwrap();
        let mut mounted = match Mounted::mount(&mnt, model) {
            Ok(m) => m,
            Err(e) => {
                skip_unless_ci(&format!("cannot mount the power-cut filesystem: {e}"));
                return;
            }
        };
        let mut finished = false;
        // A list ending at `tail-claimed` is run again (up to 3 times, on the
        // same mount) until its claim kept something: a resume whose ranges
        // all start at a chunk the range before holds has nothing to prove.
        let must_keep = stops.last().is_some_and(|s| s.at == "tail-claimed#1");
        let kept_at_start = kept;
        for _ in 0..if must_keep { 3 } else { 1 } {
            let kept_before = kept;
            for XetStop {
                at: stop,
                args: own,
            } in stops
            {
                let every = [args.as_slice(), own].concat();
                let o = run(
                    fetch_cmd(&endpoint, &mnt.join("out"), &every).env("FTPIPE_CRASH_AT", stop)
                );
                let said = stderr(&o);
                finished = o.status.success();
                assert!(
                    finished && cut > 3
                        || said.contains(&format!("FTPIPE_CRASH_AT={stop}: aborting here")),
                    "cut {cut}: {stop} not reached: {said}"
                );
                kept += said
                    .lines()
                    .filter(|l| l.contains("written past the last checkpoint"))
                    .count();
            }
            if kept > kept_before || finished {
                break;
            }
        }
        assert!(
            !must_keep || finished || kept > kept_at_start,
            "cut {cut}: three resumes stopped at tail-claimed kept nothing"
        );
        let stop = stops
            .iter()
            .map(|s| s.at.as_str())
            .collect::<Vec<_>>()
            .join(", then ");
        let dump = tmp.path().join(format!("cut-{cut}"));
        let report = mounted.cut(&dump).expect("dump the durable view");
        drop(mounted);
        let name = if finished {
            format!("xet cut {cut} (finished before {stop})")
        } else {
            format!("xet cut {cut} (at {stop})")
        };
        let out = dump.join("out");
        let claims = check_recovered(&out, &want, &name);
        if claims.database {
            for l in ledger_snapshot(&out) {
                assert_eq!(l.transferred, l.committed + l.discarded, "{name}: {l:?}");
            }
        }
        eprintln!("{name}: {} B committed; {report}", claims.committed);
        if let Some(old) = current.replace(dump) {
            std::fs::remove_dir_all(old).unwrap();
        }
        if finished {
            break;
        }
    }
    assert!(kept > 0, "no resume kept a tail");
    let out = current.unwrap().join("out");
    run_ok(&mut fetch_cmd(&endpoint, &out, &args));
    assert_eq!(
        std::fs::read(out.join("source").join(&f.path)).unwrap(),
        want[&f.path]
    );
    assert_clean_audit(&out);
}

/// One run of a power-cut cycle over a Xet fetch: where it stops
/// (`FTPIPE_CRASH_AT`) and its checkpoint arguments.
struct XetStop {
    at: String,
    args: &'static [&'static str],
}

impl XetStop {
    /// Stops at `at`, checkpointing every 4 MiB.
    fn at(at: impl Into<String>) -> XetStop {
        XetStop {
            at: at.into(),
            args: &["--checkpoint-bytes", "4194304"],
        }
    }

    /// Stops at `at` before any checkpoint (every 64 MiB, more than the
    /// file, or an hour): all it wrote is a tail past the watermark.
    fn unsynced(at: impl Into<String>) -> XetStop {
        XetStop {
            at: at.into(),
            args: &[
                "--checkpoint-bytes",
                "67108864",
                "--checkpoint-secs",
                "3600",
            ],
        }
    }
}
