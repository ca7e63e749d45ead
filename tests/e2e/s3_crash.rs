//! Kill storms over `publish` and over `pull` against a real S3-compatible
//! server (moto on loopback): at least 20 seeded SIGKILLs each (`KILLS`
//! to change, `FTPIPE_CRASH_SEED` to replay), at moments drawn over a
//! calibrated uninterrupted run. After every kill: the state database is
//! intact; a prefix holding a manifest holds every object it names with
//! the manifest's size (nothing half-published is ever visible); a pull's
//! ledger claims no byte not on disk (`transferred = committed +
//! discarded`), a receipt only for a whole file, and a manifest in
//! `DIR/artifact` only for an artifact that verifies deep. Every chain of
//! killed runs ends, resumed, with the published artifact byte-identical.
//! Every named crash point of the two commands is also hit once and
//! resumed. A session killed mid-upload resumes at the part size it
//! recorded, whatever the next run's `--part-size`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use ftpipe_fixtures::checkpoint::SplitMix64;

use crate::common::s3::*;
use crate::common::*;
use crate::s3::{built, manifest_sha_of_prefix, publish, pull, verify_deep};

pub fn kills() -> usize {
    std::env::var("KILLS")
        .ok()
        .map(|k| k.parse().expect("KILLS must be a number"))
        .unwrap_or(20)
}

/// Spawns `cmd`, SIGKILLs it after `delay`; whether it finished by itself.
pub fn kill_after(cmd: &mut std::process::Command, delay: Duration, label: &str) -> bool {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn ftpipe");
    std::thread::sleep(delay);
    let _ = child.kill();
    let status = child.wait().unwrap();
    assert!(
        status.success() || status.code().is_none(),
        "{label}: exited with {status} on its own"
    );
    status.success()
}

/// A prefix holding a manifest holds every object it names, with its size.
fn check_prefix(m: &Moto, prefix: &str, src: &Path, label: &str) -> bool {
    let Some(bytes) = m.get_object(&format!("{prefix}/manifest.json")) else {
        return false;
    };
    let published: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let ours = manifest_json(src);
    assert_eq!(published["fingerprint"], ours["fingerprint"], "{label}");
    assert_eq!(
        bytes,
        std::fs::read(src.join("artifact/manifest.json")).unwrap(),
        "{label}: the manifest is the artifact's, byte for byte"
    );
    let fp = ours["fingerprint"].as_str().unwrap();
    for c in ours["components"].as_array().unwrap() {
        let key = format!("{prefix}/{fp}/{}", c["path"].as_str().unwrap());
        let obj = m
            .get_object(&key)
            .unwrap_or_else(|| panic!("{label}: manifest published, {key} missing"));
        assert_eq!(
            obj.len() as u64,
            c["size"].as_u64().unwrap(),
            "{label}: {key}"
        );
        assert_eq!(
            sha256_hex(&obj),
            c["sha256"].as_str().unwrap(),
            "{label}: {key}"
        );
    }
    true
}

/// The publisher's records after a kill: intact, every part row of an
/// upload in progress within the file.
pub fn check_publish_state(src: &Path, label: &str) {
    assert_eq!(query(src, "PRAGMA integrity_check"), ["ok"], "{label}");
    let bad = query(
        src,
        "SELECT u.path FROM upload_parts p JOIN uploads u ON u.id = p.upload
         WHERE (p.part_number - 1) * u.part_size + p.size > u.size",
    );
    assert!(bad.is_empty(), "{label}: parts past the end of {bad:?}");
}

/// A pulled DIR after a kill (see the module doc).
pub fn check_pull_state(out: &Path, label: &str) {
    if !out.join(".ftpipe/state.db").exists() {
        return;
    }
    let rows = match try_ledger_snapshot(out) {
        Ok(rows) => rows,
        Err(_) if out.join(".ftpipe/state.db-journal").exists() => return,
        Err(e) => panic!("{label}: cannot read the state database: {e}"),
    };
    if !rows.is_empty() {
        assert_eq!(query(out, "PRAGMA integrity_check"), ["ok"], "{label}");
    }
    for r in &rows {
        let fin = out.join("artifact").join(&r.path);
        let part = PathBuf::from(format!("{}.part", fin.display()));
        let disk = std::fs::metadata(&fin)
            .or_else(|_| std::fs::metadata(&part))
            .map(|m| m.len())
            .unwrap_or(0);
        assert!(
            r.committed <= disk,
            "{label}: {r:?} but {disk} bytes on disk"
        );
        assert_eq!(r.transferred, r.committed + r.discarded, "{label}: {r:?}");
        if r.receipt {
            assert_eq!(
                std::fs::metadata(&fin).map(|m| m.len()).ok(),
                Some(r.expected),
                "{label}: {r:?}"
            );
        }
    }
    if out.join("artifact/manifest.json").exists() {
        verify_deep(&out.join("artifact"));
    }
}

#[test]
fn kill_storm_over_publish() {
    let _heavy = heavy();
    let seed = crash_seed();
    eprintln!("publish kill storm seed: {seed} (replay with FTPIPE_CRASH_SEED={seed})");
    let mut rng = SplitMix64::new(seed);
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let src = built(tmp.path(), 311);
    let m = Moto::start();
    let t = Instant::now();
    let o = publish(&m, home, &src, "s3://models/calibration");
    assert!(o.status.success(), "{}", stderr(&o));
    let ms = (t.elapsed().as_millis() as u64).max(20);
    eprintln!("calibration: a publish takes {ms} ms");
    let (mut chain, mut kill, mut finished) = (0usize, 0usize, 0usize);
    let prefix = |n: usize| format!("storm-{n}");
    while kill < kills() {
        let delay = rng.next_u64() % ms;
        let label = format!(
            "publish kill {} after {delay} ms into {}",
            kill + 1,
            prefix(chain)
        );
        let mut cmd = m.ftpipe(home);
        cmd.arg("publish")
            .arg(&src)
            .arg(format!("s3://models/{}", prefix(chain)))
            .args(["--part-size", PART_SIZE]);
        if kill_after(&mut cmd, Duration::from_millis(delay), &label) {
            assert!(
                check_prefix(&m, &prefix(chain), &src, &label),
                "{label}: finished, nothing published"
            );
            finished += 1;
            chain += 1;
            continue;
        }
        kill += 1;
        check_publish_state(&src, &label);
        check_prefix(&m, &prefix(chain), &src, &label);
    }
    let o = publish(&m, home, &src, &format!("s3://models/{}", prefix(chain)));
    assert!(o.status.success(), "last chain: {}", stderr(&o));
    assert!(check_prefix(&m, &prefix(chain), &src, "last chain"));
    // What the storm published pulls clean.
    let out = tmp.path().join("node");
    let o = pull(
        &m,
        home,
        &format!("s3://models/{}", prefix(chain)),
        &out,
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    verify_deep(&out.join("artifact"));
    assert_eq!(manifest_sha(&out), manifest_sha(&src));
    eprintln!(
        "{kill} kills over {} chains ({finished} finished before their kill)",
        chain + 1
    );
}

#[test]
fn kill_storm_over_pull() {
    let _heavy = heavy();
    let seed = crash_seed();
    eprintln!("pull kill storm seed: {seed} (replay with FTPIPE_CRASH_SEED={seed})");
    let mut rng = SplitMix64::new(seed);
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let src = built(tmp.path(), 312);
    let m = Moto::start();
    let dest = "s3://models/pulled";
    let o = publish(&m, home, &src, dest);
    assert!(o.status.success(), "{}", stderr(&o));
    let args = RANGED_PULL;
    let t = Instant::now();
    let o = pull(&m, home, dest, &tmp.path().join("calibration"), args);
    assert!(o.status.success(), "{}", stderr(&o));
    let ms = (t.elapsed().as_millis() as u64).max(20);
    eprintln!("calibration: a pull takes {ms} ms");
    let (mut chain, mut kill, mut finished) = (0usize, 0usize, 0usize);
    let dir = |n: usize| tmp.path().join(format!("node-{n}"));
    let finished_ok = |out: &Path, label: &str| {
        verify_deep(&out.join("artifact"));
        assert_eq!(manifest_sha(out), manifest_sha(&src), "{label}");
        assert_clean_audit(out);
    };
    while kill < kills() {
        let delay = rng.next_u64() % ms;
        let label = format!(
            "pull kill {} after {delay} ms into {}",
            kill + 1,
            dir(chain).display()
        );
        let mut cmd = m.ftpipe(home);
        cmd.args(["pull", dest, "--out"])
            .arg(dir(chain))
            .args(args)
            .args(["--retry-base-ms", "20"]);
        if kill_after(&mut cmd, Duration::from_millis(delay), &label) {
            finished_ok(&dir(chain), &label);
            finished += 1;
            chain += 1;
            continue;
        }
        kill += 1;
        check_pull_state(&dir(chain), &label);
    }
    let o = pull(&m, home, dest, &dir(chain), args);
    assert!(o.status.success(), "last chain: {}", stderr(&o));
    finished_ok(&dir(chain), "last chain");
    assert_eq!(manifest_sha_of_prefix(&m, "pulled"), manifest_sha(&src));
    eprintln!(
        "{kill} kills over {} chains ({finished} finished before their kill)",
        chain + 1
    );
}

#[test]
fn every_named_crash_point_of_publish_and_pull_resumes() {
    let _heavy = heavy();
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let src = built(tmp.path(), 313);
    let m = Moto::start();
    for (n, (point, nth)) in [
        ("upload-created", 2),
        ("upload-part-sent", 2),
        ("upload-part-recorded", 2),
        ("upload-completed", 2),
        ("upload-verified", 2),
        ("publish-components-done", 1),
        ("publish-manifest-put", 1),
    ]
    .into_iter()
    .enumerate()
    {
        let dest = format!("s3://models/point-{n}");
        let o = run(m
            .ftpipe(home)
            .arg("publish")
            .arg(&src)
            .arg(&dest)
            .args(["--part-size", PART_SIZE, "--concurrency", "1"])
            .env("FTPIPE_CRASH_AT", format!("{point}#{nth}")));
        assert_eq!(
            o.status.code(),
            None,
            "{point}: not reached: {}",
            stderr(&o)
        );
        let published = check_prefix(&m, &format!("point-{n}"), &src, point);
        assert_eq!(published, point == "publish-manifest-put", "{point}");
        // The parts whose rows the killed run committed: never sent again.
        // (Rows alone decide: a part's acknowledgement and its row are two
        // commits, and the next part is sent as soon as the last one is
        // answered, so the kill can fall between a later part's two; that
        // part is rightly sent again.)
        let recorded = if point == "upload-part-recorded" {
            query(
                &src,
                &format!(
                    "SELECT u.key || '|' || p.part_number || '|' || p.run_id
                     FROM upload_parts p JOIN uploads u ON u.id = p.upload
                     WHERE u.key LIKE 's3://models/point-{n}/%'"
                ),
            )
        } else {
            Vec::new()
        };
        let o = publish(&m, home, &src, &dest);
        assert!(o.status.success(), "{point}: resume: {}", stderr(&o));
        assert!(check_prefix(&m, &format!("point-{n}"), &src, point));
        if point == "upload-part-recorded" {
            assert!(
                !recorded.is_empty(),
                "{point}: no part row before the resume"
            );
            for part in &recorded {
                let [key, number, run] = part.split('|').collect::<Vec<_>>()[..] else {
                    panic!("{point}: a part row {part:?}");
                };
                let again = query(
                    &src,
                    &format!(
                        "SELECT COUNT(*) FROM upload_attempts
                         WHERE op = 'send_part' AND outcome = 'ok' AND key = '{key}'
                           AND part_number = {number} AND run_id > {run}"
                    ),
                );
                assert_eq!(again, ["0"], "{point}: recorded part {part} was sent again");
            }
        }
    }
    let dest = "s3://models/point-0";
    for point in [
        "pull-components-done",
        "pull-manifest-written",
        "fetch-renamed",
        "checkpoint-synced",
    ] {
        let out = tmp.path().join(format!("node-{point}"));
        let o = run(m
            .ftpipe(home)
            .args(["pull", dest, "--out"])
            .arg(&out)
            .args(["--checkpoint-bytes", "65536"])
            .env("FTPIPE_CRASH_AT", point));
        assert_eq!(
            o.status.code(),
            None,
            "{point}: not reached: {}",
            stderr(&o)
        );
        check_pull_state(&out, point);
        let o = pull(&m, home, dest, &out, &[]);
        assert!(o.status.success(), "{point}: resume: {}", stderr(&o));
        verify_deep(&out.join("artifact"));
        assert_eq!(manifest_sha(&out), manifest_sha(&src), "{point}");
    }
}

/// Without `--part-size` an upload's part size is chosen from the object's
/// size: 16 MiB parts for a file of 264 MiB (a power of two about a 32nd
/// of it; the fixed 8 MiB default before), as moto's ListParts of the
/// session in progress shows, and recorded with the session. A run killed
/// mid-session and resumed with another `--part-size` completes the
/// session at its recorded part size (its object assembled from 17 parts),
/// while a file whose session starts after the resume takes the size
/// given. The big file is sparse on the hub's side.
#[test]
fn a_chosen_part_size_is_recorded_and_a_resumed_session_keeps_it() {
    const CHOSEN: u64 = 16 << 20;
    const BIG: u64 = 264 << 20;
    let _heavy = heavy();
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let sparse = |name: &str, len: u64| {
        let path = tmp.path().join(name);
        std::fs::File::create(&path).unwrap().set_len(len).unwrap();
        ftpipe_fixtures::RepoFile::disk(name, path)
    };
    let hub = hub_serving(vec![
        sparse("big.bin", BIG),
        ftpipe_fixtures::RepoFile::bytes("config.json", &b"{}"[..]),
        sparse("mid.bin", 10 << 20),
    ]);
    let src = tmp.path().join("src");
    run_ok(&mut fetch_cmd(&hub.endpoint(), &src, &[]));
    let m = Moto::start();
    let mirror = "s3://models/mirrors/parts";
    let o = run(m
        .ftpipe(home)
        .arg("mirror")
        .arg(&src)
        .arg(mirror)
        .args(["--concurrency", "1"])
        .env("FTPIPE_CRASH_AT", "upload-part-recorded#1"));
    assert_eq!(o.status.code(), None, "not killed: {}", stderr(&o));
    let live = |col: &str| {
        query(
            &src,
            &format!("SELECT {col} FROM uploads WHERE state = 'uploading'"),
        )
    };
    assert_eq!(live("part_size"), [CHOSEN.to_string()]);
    let (url, session) = (live("key").remove(0), live("session").remove(0));
    assert!(url.ends_with("/big.bin"), "{url}");
    let key = url.strip_prefix("s3://").expect("an s3:// key");
    let (status, body) = m
        .raw("GET", &format!("/{key}?uploadId={session}"), &[], &[])
        .unwrap();
    let parts = String::from_utf8_lossy(&body).into_owned();
    assert_eq!(status, 200, "ListParts: {parts}");
    assert_eq!(
        xml_text(&parts, "PartNumber").as_deref(),
        Some("1"),
        "{parts}"
    );
    assert_eq!(
        xml_text(&parts, "Size"),
        Some(CHOSEN.to_string()),
        "{parts}"
    );

    let o = run(m.ftpipe(home).arg("mirror").arg(&src).arg(mirror).args([
        "--part-size",
        "1MiB",
        "--json",
    ]));
    assert!(o.status.success(), "resume: {}", stderr(&o));
    let verified = |col: &str, path: &str| {
        query(
            &src,
            &format!(
                "SELECT {col} FROM uploads WHERE state = 'verified' AND path = {}",
                sql_str(path)
            ),
        )
    };
    // The resumed session kept its part size.
    assert_eq!(verified("part_size", "big.bin"), [CHOSEN.to_string()]);
    assert!(etag_of(&m, key).ends_with("-17\""), "{}", etag_of(&m, key));
    // A session begun after the resume: the size given, 1 MiB.
    assert_eq!(verified("part_size", "mid.bin"), [(1u64 << 20).to_string()]);
    let mid = verified("key", "mid.bin").remove(0);
    let mid = mid.strip_prefix("s3://").unwrap();
    assert!(etag_of(&m, mid).ends_with("-10\""), "{}", etag_of(&m, mid));
}

/// The ETag moto answers for `bucket/key` (quoted).
fn etag_of(m: &Moto, key: &str) -> String {
    let (status, head, _) = m
        .raw_with_head("HEAD", &format!("/{key}"), &[], &[])
        .unwrap();
    assert_eq!(status, 200, "HEAD {key}: {head}");
    head.lines()
        .find_map(|l| {
            l.split_once(':')
                .filter(|(k, _)| k.eq_ignore_ascii_case("etag"))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| panic!("no ETag for {key}: {head}"))
}
