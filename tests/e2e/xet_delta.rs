//! Xet revision deltas (issue 37, item 3). After `--repin` to a revision
//! that changed a few tensors of one shard, every Xet client (ftpipe
//! included) fetched the whole changed file from the CAS again, although
//! the new reconstruction names the old xorbs' chunks for every unchanged
//! byte and the old file, whose chunk hashes the store recorded, holds
//! them. Now a term whose every chunk an old file still holds is read back
//! from it, each chunk checked against its recorded Xet hash, recorded as
//! reused, and only the rest is fetched; `--reuse-from OTHER_DIR` does the
//! same from another directory, read-only.
//!
//! The CAS is `local_cas_server`, filled by `hf_xet` (revision 2 is
//! uploaded after revision 1, so hf_xet stores only its new chunks and the
//! new reconstruction names the old xorbs for the rest), behind the lying
//! proxy, which records every xorb range asked (the bytes fetched from the
//! CAS).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::common::lying_proxy::LyingProxy;
use crate::common::xet::{CAS_TOKEN, LocalCas, xet_hub};
use crate::common::*;
use crate::incremental_rebuild::{bf16_experts, change_expert_tensors};
use ftpipe_fixtures::qwen4::{QwenShape, generate_qwen4_repo};
use ftpipe_fixtures::{RepoFile, RunningHub, XetServing};

/// Slack over the new chunks' compressed bytes: the bound is 1.05 × them
/// plus this (a chunk header or two of rounding).
const SLACK: u64 = 4096;

/// A checkpoint whose expert shard is a few MiB (many 64 KiB Xet chunks).
fn shape() -> QwenShape {
    QwenShape {
        hidden: 128,
        experts: 32,
        moe_intermediate: 64,
        ..QwenShape::default()
    }
}

/// A Xet-served checkpoint: the hub, its files, the CAS, the recording
/// proxy the hub names as the CAS, and the Xet hashes by SHA-256.
struct Served {
    hub: RunningHub,
    files: Vec<RepoFile>,
    cas: LocalCas,
    proxy: LyingProxy,
    hashes: BTreeMap<String, String>,
}

impl Served {
    fn start(seed: u64) -> Served {
        let files = generate_qwen4_repo(seed, shape());
        let hub = hub_serving(files.clone());
        let cas = LocalCas::start();
        let hashes = xet_hub(&hub, &cas, &files);
        let proxy = LyingProxy::start(&cas.endpoint());
        let s = Served {
            hub,
            files,
            cas,
            proxy,
            hashes,
        };
        s.serve();
        s
    }

    fn serve(&self) {
        self.hub.serve_xet(XetServing {
            cas_url: self.proxy.endpoint(),
            access_token: CAS_TOKEN.to_owned(),
            hashes: self.hashes.clone(),
            token_lifetime: ftpipe_fixtures::xet::TOKEN_LIFETIME,
        });
    }

    fn endpoint(&self) -> String {
        self.hub.endpoint()
    }

    /// Publishes revision 2 holding exactly `files`: the new contents are
    /// uploaded with hf_xet first (it stores only chunks the CAS lacks).
    fn publish(&mut self, files: Vec<RepoFile>) {
        let new: Vec<&RepoFile> = files
            .iter()
            .filter(|f| {
                let sha = sha256_hex(&ftpipe_fixtures::checkpoint::content_bytes(f).unwrap());
                !self.hashes.contains_key(&sha) && f.path.ends_with(".safetensors")
            })
            .collect();
        if !new.is_empty() {
            self.hashes.extend(self.cas.upload(&new));
        }
        self.serve();
        self.hub.move_branch(REPO, "main", files.clone()).unwrap();
        self.files = files;
    }

    /// Revision 2: `k` BF16 expert tensors of the expert shard changed.
    /// Returns the shard's path.
    fn change_shard(&mut self, k: usize) -> String {
        let (shard, bytes) = expert_shard(&self.files);
        let (changed, _) = change_expert_tensors(&bytes, k);
        let mut files = self.files.clone();
        for f in &mut files {
            if f.path == shard {
                *f = RepoFile::bytes(shard.clone(), changed.clone());
            }
        }
        self.publish(files);
        shard
    }

    /// Compressed xorb bytes asked of the CAS so far (the ranges of every
    /// xorb GET the proxy passed on).
    fn xorb_bytes(&self) -> u64 {
        self.proxy
            .seen()
            .iter()
            .filter(|s| s.target.contains("fetch_term"))
            .map(|s| {
                let r = s.range.as_deref().expect("a xorb GET without Range");
                let (a, b) = r.trim_start_matches("bytes=").split_once('-').unwrap();
                b.parse::<u64>().unwrap() - a.parse::<u64>().unwrap() + 1
            })
            .sum()
    }
}

/// The largest shard holding BF16 expert tensors, and its bytes.
fn expert_shard(files: &[RepoFile]) -> (String, Vec<u8>) {
    files
        .iter()
        .filter(|f| f.path.ends_with(".safetensors"))
        .map(|f| {
            let b = ftpipe_fixtures::checkpoint::content_bytes(f).unwrap();
            (f.path.clone(), b.to_vec())
        })
        .filter(|(_, b)| !bf16_experts(b).1.is_empty())
        .max_by_key(|(_, b)| b.len())
        .expect("a shard with BF16 expert tensors")
}

/// Xet terms recorded for `path`'s current file: (xorb, fetched, decoded,
/// reused, file_start, file_end) per term. A split file's range reads the
/// terms on its edges from a reconstruction of its own, so a term may be
/// recorded whole and in part.
fn terms(out: &Path, path: &str) -> Vec<(String, u64, u64, u64, u64, u64)> {
    query(
        out,
        &format!(
            "SELECT t.xorb || ' ' || t.fetched || ' ' || t.decoded || ' ' || t.reused
                    || ' ' || t.file_start || ' ' || t.file_end
             FROM xet_terms t JOIN files f ON f.path = t.path AND f.xet_hash = t.xet_hash
             WHERE t.path = {} ORDER BY t.file_start",
            sql_str(path)
        ),
    )
    .into_iter()
    .map(|r| {
        let v: Vec<&str> = r.split(' ').collect();
        let n = |i: usize| v[i].parse::<u64>().unwrap();
        (v[0].to_owned(), n(1), n(2), n(3), n(4), n(5))
    })
    .collect()
}

fn xorbs(out: &Path) -> BTreeSet<String> {
    query(out, "SELECT DISTINCT xorb FROM xet_terms")
        .into_iter()
        .collect()
}

/// Bytes of the union of the spans `[start, end)`.
fn union_len(spans: impl Iterator<Item = (u64, u64)>) -> u64 {
    let mut spans: Vec<_> = spans.collect();
    spans.sort_unstable();
    let (mut total, mut reach) = (0, 0);
    for (start, end) in spans {
        let from = start.max(reach);
        total += end.saturating_sub(from);
        reach = reach.max(end);
    }
    total
}

/// `v` with thousands separators, as the audit table prints it.
fn commas(v: u64) -> String {
    let s = v.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Every file under `dir` with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    tree_of(dir)
        .into_iter()
        .filter(|p| dir.join(p).is_file())
        .map(|p| (p.clone(), std::fs::read(dir.join(&p)).unwrap()))
        .collect()
}

/// The source files of two directories are byte-equal.
fn assert_same_sources(a: &Path, b: &Path) {
    let (x, y) = (snapshot(&a.join("source")), snapshot(&b.join("source")));
    assert_eq!(
        x.keys().collect::<Vec<_>>(),
        y.keys().collect::<Vec<_>>(),
        "file lists differ"
    );
    for (k, v) in &x {
        assert!(v == &y[k], "{k} differs from a fresh fetch");
    }
}

/// What a fresh directory's fetch of the new revision fetched for `path`,
/// split by whether the term's xorb is `old` (revision 1's): the new
/// xorbs' compressed and decoded bytes (a range shared by terms is
/// fetched and counted once per body, `xet_source::
/// a_xorb_range_shared_by_terms_is_fetched_once`).
fn new_chunk_bytes(fresh: &Path, path: &str, old: &BTreeSet<String>) -> (u64, u64) {
    terms(fresh, path)
        .iter()
        .filter(|t| !old.contains(&t.0))
        .fold((0, 0), |(c, d), t| (c + t.1, d + t.2))
}

/// Regression (issue 37, item 3): `run --repin` to a revision changing two
/// tensors of one shard fetched the whole shard from the CAS again. Now
/// the CAS sends at most 1.05 × the compressed bytes of the new xorbs'
/// terms (+ slack), every unchanged byte is reused from the old shard
/// (reused = the shard's size − the new chunks' bytes), the sources equal
/// a fresh fetch, the manifest a fresh build, and the audit reconciles
/// with the reused line in its table and JSON.
#[test]
fn a_repin_fetches_only_the_new_chunks_and_reuses_the_rest() {
    repin_fetches_only_the_new_chunks(3701, &[]);
}

/// Regression (issue 37, item 3): the same repin with the shard fetched as
/// several ranges asked the CAS for 1.65× the new chunks (326,460 xorb
/// bytes for 198,368): each range asked a reconstruction of its own span,
/// whose xorb spans were its own, so the new xorb's span crossed the wire
/// once per range, and chunks one range's span held for another's terms
/// were let go. A split file's ranges now share one reconstruction of the
/// whole file, its held chunks and the spans being read.
#[test]
fn a_repin_of_a_shard_fetched_as_ranges_fetches_the_new_chunks_once() {
    repin_fetches_only_the_new_chunks(3703, RANGES);
}

/// Arguments that fetch the expert shard (a few MiB) as several ranges.
const RANGES: &[&str] = &[
    "--segment-threshold",
    "1MiB",
    "--min-range",
    "256KiB",
    "--split-below-rate",
    "0",
];

/// The repin of a revision changing two tensors of the expert shard, the
/// fetches run with `args`, asks the CAS for at most 1.05× the new
/// chunks' compressed bytes (+ slack), and reuses every other byte.
fn repin_fetches_only_the_new_chunks(seed: u64, args: &[&str]) {
    let mut s = Served::start(seed);
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    run_ok(&mut run_cmd(&s.endpoint(), &out, args));
    let old = xorbs(&out);
    let shard = s.change_shard(2);
    let size = content_len(s.files.iter().find(|f| f.path == shard).unwrap());

    // `plan` says before the fetch that the changed shard is in Xet
    // storage, so that what the CAS sends is at most its size.
    let plan = |json: bool| {
        let mut cmd = ftpipe();
        cmd.args(["plan", REPO, "--endpoint", &s.endpoint(), "--out"])
            .arg(&out)
            .args(["--remote", "--repin"]);
        if json {
            cmd.arg("--json");
        }
        run_ok(&mut cmd)
    };
    let o = plan(true);
    let p: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(p["repin"]["fetch_files"], serde_json::json!([shard]), "{p}");
    assert_eq!(p["repin"]["xet_fetch_bytes"], size, "{p}");
    let human = String::from_utf8_lossy(&plan(false).stdout).into_owned();
    assert!(
        human.contains(&format!("({size} bytes) of them in Xet storage")),
        "{human}"
    );

    let before = s.xorb_bytes();
    run_ok(&mut run_cmd(
        &s.endpoint(),
        &out,
        &[args, &["--repin"]].concat(),
    ));
    let cas = s.xorb_bytes() - before;

    let fresh = tmp.path().join("fresh");
    run_ok(&mut run_cmd(&s.endpoint(), &fresh, &[]));
    assert_same_sources(&out, &fresh);
    assert_eq!(
        std::fs::read(out.join("artifact/manifest.json")).unwrap(),
        std::fs::read(fresh.join("artifact/manifest.json")).unwrap(),
        "the manifest differs from a fresh build"
    );
    let (new_compressed, new_decoded) = new_chunk_bytes(&fresh, &shard, &old);
    assert!(
        new_decoded > 0 && new_decoded < size / 2,
        "hf_xet did not dedupe revision 2 against revision 1: {new_decoded} new of {size}"
    );
    let bound = new_compressed + new_compressed / 20 + SLACK;
    assert!(
        cas <= bound,
        "the repin asked {cas} xorb bytes of the CAS; the new chunks are {new_compressed}"
    );
    let mine = terms(&out, &shard);
    let fetched: u64 = mine.iter().map(|t| t.1).sum();
    let reused: u64 = mine.iter().map(|t| t.3).sum();
    eprintln!(
        "repin of {shard} ({size} bytes): {cas} xorb bytes from the CAS, new chunks \
         {new_compressed} compressed / {new_decoded} decoded, {reused} reused"
    );
    assert!(fetched <= bound, "xet_terms.fetched {fetched} > {bound}");
    let reused_spans = mine.iter().filter(|t| t.3 > 0).map(|t| (t.4, t.5));
    assert_eq!(
        union_len(reused_spans),
        size - new_decoded,
        "reused terms: {mine:?}"
    );
    for t in mine.iter().filter(|t| old.contains(&t.0)) {
        assert_eq!(
            (t.1, t.3),
            (0, t.2),
            "an old xorb's term was fetched: {t:?}"
        );
    }

    let a = assert_clean_audit(&out);
    let x = &a["xet"];
    assert_eq!(x["reused_bytes"], reused, "{x}");
    assert!(x["reused_terms"].as_u64().unwrap() > 0, "{x}");
    let table = run_ok(ftpipe().args(["audit", "--out"]).arg(&out));
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.lines()
            .any(|l| l.contains("reused from the previous revision")
                && l.contains(&commas(reused))),
        "{text}"
    );
}

/// Regression (issue 37, item 3): an old file changed on disk before the
/// repin (a span overwritten with zeros, as a punched hole reads; or the
/// file cut short) must never give its bytes to the new file: the terms
/// whose chunks no longer hash right are fetched from the CAS, the rest
/// still reused, and the new file is byte-equal to revision 2 and verifies.
#[test]
fn an_old_file_changed_on_disk_is_fetched_not_reused() {
    let mut s = Served::start(3702);
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    run_ok(&mut fetch_cmd(&s.endpoint(), &base, &[]));
    let old = xorbs(&base);
    let (shard, _) = expert_shard(&s.files);
    let size = std::fs::metadata(base.join("source").join(&shard))
        .unwrap()
        .len();
    let zeroed = tmp.path().join("zeroed");
    let cut = tmp.path().join("cut");
    copy_tree(&base, &zeroed);
    copy_tree(&base, &cut);
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(zeroed.join("source").join(&shard))
            .unwrap();
        f.write_all_at(&vec![0u8; 8192], size / 2).unwrap();
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(cut.join("source").join(&shard))
            .unwrap();
        f.set_len(size - 8192).unwrap();
    }
    s.change_shard(1);
    let fresh = tmp.path().join("fresh");
    run_ok(&mut fetch_cmd(&s.endpoint(), &fresh, &[]));
    let (_, new_decoded) = new_chunk_bytes(&fresh, &shard, &old);
    for out in [&zeroed, &cut] {
        let o = run_ok(fetch_cmd(&s.endpoint(), out, &["--repin"]).env("FTPIPE_LOG", "info"));
        assert_same_sources(out, &fresh);
        assert_clean_audit(out);
        let mine = terms(out, &shard);
        let reused: u64 = mine.iter().map(|t| t.3).sum();
        let refetched = mine
            .iter()
            .filter(|t| old.contains(&t.0) && t.1 > 0)
            .count();
        assert!(
            reused > 0 && reused < size - new_decoded,
            "{}: reused {reused} of {} unchanged bytes",
            out.display(),
            size - new_decoded
        );
        assert!(refetched > 0, "{}: {mine:?}", out.display());
        assert!(
            stderr(&o).contains("not reused"),
            "{}: no line says why: {}",
            out.display(),
            stderr(&o)
        );
    }
}

/// Regression (issue 37, item 3): `--reuse-from OTHER_DIR` into an empty
/// directory takes every term OTHER_DIR's files hold from them (the
/// unchanged files wholly: no CAS byte), fetches only the new chunks, and
/// leaves OTHER_DIR as it was (its database and files byte-equal: opened
/// read-only, never locked or migrated).
#[test]
fn reuse_from_another_directory_reads_it_and_leaves_it_unchanged() {
    let mut s = Served::start(3703);
    let tmp = tempfile::tempdir().unwrap();
    let other = tmp.path().join("other");
    run_ok(&mut fetch_cmd(&s.endpoint(), &other, &[]));
    let old = xorbs(&other);
    let shard = s.change_shard(2);
    let before = snapshot(&other);

    let out = tmp.path().join("out");
    let start = s.xorb_bytes();
    let o = run(fetch_cmd(&s.endpoint(), &out, &["--reuse-from"]).arg(&other));
    assert!(o.status.success(), "{}", stderr(&o));
    let cas = s.xorb_bytes() - start;
    assert_files_match(&out, &s.files);
    assert_clean_audit(&out);
    assert!(snapshot(&other) == before, "OTHER_DIR changed");

    let mut new_compressed = 0;
    for f in s.files.iter().filter(|f| f.path.ends_with(".safetensors")) {
        for t in terms(&out, &f.path) {
            if old.contains(&t.0) {
                assert_eq!((t.1, t.3), (0, t.2), "{}: {t:?} fetched", f.path);
            } else {
                assert_eq!(f.path, shard, "a new xorb in an unchanged file");
                new_compressed += t.1;
            }
        }
    }
    assert!(new_compressed > 0);
    assert!(
        cas <= new_compressed + new_compressed / 20 + SLACK,
        "{cas} xorb bytes asked; the new chunks are {new_compressed}"
    );

    // With Xet off the flag would do nothing: refused.
    let o = run(fetch_cmd(
        &s.endpoint(),
        &tmp.path().join("y"),
        &["--no-xet", "--reuse-from"],
    )
    .arg(&other));
    assert!(!o.status.success());
    assert_names(&stderr(&o), &["--reuse-from", "Xet is off"]);
    // An OTHER_DIR without state is refused naming it.
    let o = run(fetch_cmd(&s.endpoint(), &tmp.path().join("x"), &["--reuse-from"]).arg(tmp.path()));
    assert!(!o.status.success());
    assert_names(
        &stderr(&o),
        &[&tmp.path().display().to_string(), "no ftpipe state"],
    );
}

/// Regression (issue 37, item 3): a shard renamed, unchanged, in
/// revision 2 is a new path with the old Xet hash: its terms are all
/// reused from the old path's file, no xorb byte is asked of the CAS.
#[test]
fn a_renamed_unchanged_shard_is_reused_whole() {
    let mut s = Served::start(3704);
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    run_ok(&mut fetch_cmd(&s.endpoint(), &out, &[]));
    let (shard, _) = expert_shard(&s.files);
    let renamed = format!("moved/{shard}");
    let files = s
        .files
        .iter()
        .map(|f| match f.path == shard {
            true => RepoFile::bytes(
                renamed.clone(),
                ftpipe_fixtures::checkpoint::content_bytes(f).unwrap(),
            ),
            false => f.clone(),
        })
        .collect();
    s.publish(files);
    let before = s.xorb_bytes();
    // The fetch publishes the renamed shard, then fails its audit: the old
    // path left the listing and its file stays on disk, an orphan the
    // audit names (removed below to audit the rest).
    let o = run(&mut fetch_cmd(&s.endpoint(), &out, &["--repin"]));
    let said = format!("{}{}", String::from_utf8_lossy(&o.stdout), stderr(&o));
    assert!(
        said.contains(&format!("{renamed}: verified and published")),
        "{said}"
    );
    assert_eq!(
        s.xorb_bytes(),
        before,
        "xorb bytes asked for a renamed shard"
    );
    let size = content_len(s.files.iter().find(|f| f.path == renamed).unwrap());
    let mine = terms(&out, &renamed);
    assert!(!mine.is_empty());
    assert!(mine.iter().all(|t| t.1 == 0), "{mine:?}");
    assert_eq!(mine.iter().map(|t| t.3).sum::<u64>(), size);
    std::fs::remove_file(out.join("source").join(&shard)).unwrap();
    assert_files_match(&out, &s.files);
    assert_clean_audit(&out);
}

/// A kill storm over `run --repin` with reuse: SIGKILLs at seeded moments
/// (`KILLS`, default the hundred, about 20 s on two idle cores;
/// the seed is printed,
/// `FTPIPE_CRASH_SEED` replays it). After every kill each component
/// receipt names its file; every finished chain has the fresh build's
/// manifest, reused bytes and a clean audit. Every other chain fetches the
/// changed shard as ranges sharing one reconstruction.
#[test]
fn kill_storm_over_a_reusing_repin_ends_with_the_fresh_manifest() {
    use ftpipe_fixtures::checkpoint::SplitMix64;
    use std::time::Instant;
    let _heavy = heavy();
    let kills: usize = std::env::var("KILLS")
        .ok()
        .map(|k| k.parse().expect("KILLS must be a number"))
        .unwrap_or(100);
    let seed = crash_seed();
    eprintln!("reusing repin kill storm seed: {seed} (replay with FTPIPE_CRASH_SEED={seed})");
    let mut rng = SplitMix64::new(seed);
    let mut s = Served::start(3705);
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    run_ok(&mut run_cmd(&s.endpoint(), &out, &[]));
    let shard = s.change_shard(2);
    let fresh_dir = tmp.path().join("fresh");
    run_ok(&mut run_cmd(&s.endpoint(), &fresh_dir, &[]));
    let fresh = std::fs::read(fresh_dir.join("artifact/manifest.json")).unwrap();
    let copy = |n: usize| {
        let dir = tmp.path().join(format!("chain-{n}"));
        copy_tree(&out, &dir);
        dir
    };
    let finished = |dir: &Path, label: &str| {
        let manifest = std::fs::read(dir.join("artifact/manifest.json")).unwrap();
        assert!(manifest == fresh, "{label}: manifest differs");
        assert!(
            terms(dir, &shard).iter().any(|t| t.3 > 0),
            "{label}: nothing reused"
        );
        assert_clean_audit(dir);
    };
    let start = Instant::now();
    run_ok(&mut run_cmd(&s.endpoint(), &copy(0), &["--repin"]));
    finished(&tmp.path().join("chain-0"), "calibration");
    let chain_ms = (start.elapsed().as_millis() as u64).max(20);
    let (chains, landed) = crate::incremental_rebuild::repin_kill_storm(
        &s.endpoint(),
        kills,
        chain_ms,
        &mut rng,
        &copy,
        &finished,
        &|chain| {
            if chain % 2 == 0 {
                RANGES.to_vec()
            } else {
                Vec::new()
            }
        },
    );
    eprintln!(
        "reusing repin kill storm (seed {seed}): {kills} kills over {chains} chains in {:?}; by place: {landed:?}",
        start.elapsed()
    );
    assert!(
        landed.get("fetch").is_some_and(|n| *n > 0),
        "no kill landed in the reusing fetch: {landed:?}"
    );
}
