//! Power cuts during `pull` and during `publish`, on the filesystem that
//! keeps only what was fsynced (`ftpipe_fixtures::powercut`, see the
//! `powercut` module), against a real S3-compatible server (moto).
//!
//! SIGKILL (`s3_crash`) keeps the page cache, so it cannot catch a missing
//! fsync. Here the pulling node's `DIR`, or the publishing node's `DIR`
//! (artifact and state database), lives on the power-cut filesystem. Seeded
//! cycles in chains: mount what the previous cut left, run the command,
//! SIGKILL it after a random delay within a calibrated run, cut the power,
//! unmount. After every cut, on the recovered tree:
//! * a pull's state database is intact; every download receipt names a
//!   file in `artifact/` with the receipt's size and SHA-256; every ledger
//!   watermark (and range) without a receipt is backed by that many bytes
//!   of the `.part`, equal to the published object's; a `manifest.json`
//!   in `artifact/` belongs to an artifact that verifies deep;
//! * a publish's state database is intact, no acknowledged part lies past
//!   its file's end, and a prefix holding a manifest holds every object it
//!   names, byte for byte the artifact's.
//!
//! Each chain ends, resumed on the normal disk, with the published
//! artifact byte-identical (`verify --deep`, same manifest SHA-256).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use ftpipe_fixtures::checkpoint::SplitMix64;
use ftpipe_fixtures::powercut::{Model, Mounted};

use crate::common::s3::*;
use crate::common::*;
use crate::powercut::{check_watermarks, fresh_model, rows, state_db_ok};
use crate::s3::{built, manifest_sha_of_prefix, publish, pull, verify_deep};

const CUTS: u64 = 12;

/// Cuts past [`CUTS`] while none has yet landed mid-pull with anything
/// claimed: the delays are drawn below one calibrated pull, and on a busy
/// machine a pull's first claim can come late in it.
const MORE_CUTS: u64 = 24;

/// Cycles per chain of resumptions.
const CHAIN: u64 = 4;

/// Ranges and frequent checkpoints, so cuts find durable watermarks.
const PULL_ARGS: &[&str] = RANGED_PULL;

/// Mounts `model` on `mnt`, runs the command `make` builds for the mount
/// point, SIGKILLs it after `delay` unless it exited first, cuts the power
/// into `dump`; whether the command had finished (successfully) first, and
/// how long it ran. `None`: the filesystem cannot be mounted here.
pub(crate) fn cycle(
    mnt: &Path,
    model: Model,
    dump: &Path,
    delay: Duration,
    make: impl FnOnce(&Path) -> std::process::Command,
) -> Option<(bool, Duration)> {
    std::fs::create_dir_all(mnt).unwrap();
    let mut mounted = match Mounted::mount(mnt, model) {
        Ok(m) => m,
        Err(e) => {
            skip_unless_ci(&format!("cannot mount the power-cut filesystem: {e}"));
            return None;
        }
    };
    let mut child = make(mnt)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let finished = loop {
        if child.try_wait().unwrap().is_some() {
            break true;
        }
        if started.elapsed() >= delay {
            break false;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let ran = started.elapsed();
    let _ = child.kill();
    let o = child.wait_with_output().unwrap();
    if finished {
        assert!(o.status.success(), "the command failed: {}", stderr(&o));
    }
    mounted.cut(dump).expect("dump the durable view");
    drop(mounted);
    Some((finished, ran))
}

/// The artifact's files by path (what every pulled object must equal).
fn artifact_files(src: &Path) -> BTreeMap<String, Vec<u8>> {
    let root = src.join("artifact");
    let mut files = BTreeMap::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(&root).unwrap().to_str().unwrap().to_owned();
                files.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    files
}

/// Everything a recovered pull claims is on disk (see the module doc);
/// how many claims (receipts, and watermarks of files without one) were
/// checked.
fn check_pulled(out: &Path, want: &BTreeMap<String, Vec<u8>>, cut: &str) -> (usize, usize) {
    if !state_db_ok(out, cut) {
        return (0, 0);
    }
    let mut receipts = std::collections::BTreeSet::new();
    for r in rows(
        out,
        "SELECT path || '|' || size || '|' || digest FROM receipts",
        "receipts",
    ) {
        let (p, size, digest) = (&r[0], r[1].parse::<u64>().unwrap(), &r[2]);
        let bytes = std::fs::read(out.join("artifact").join(p)).unwrap_or_else(|e| {
            panic!("{cut}: receipt for {p} but the file did not survive the cut ({e})")
        });
        assert!(
            bytes.len() as u64 == size && sha256_hex(&bytes) == *digest,
            "{cut}: receipt for {p} claims {size} B {digest}, the durable file differs"
        );
        receipts.insert(p.clone());
    }
    let watermarks = check_watermarks(out, &out.join("artifact"), &receipts, want, cut);
    if out.join("artifact/manifest.json").exists() {
        verify_deep(&out.join("artifact"));
    }
    (receipts.len(), watermarks)
}

#[test]
fn power_cuts_during_pull_lose_nothing_claimed() {
    let _heavy = heavy();
    if !Path::new("/dev/fuse").exists() {
        skip_unless_ci("/dev/fuse is missing: cannot mount the power-cut filesystem");
        return;
    }
    let seed = crash_seed();
    eprintln!("pull power-cut seed: {seed} (replay with FTPIPE_CRASH_SEED={seed})");
    let mut rng = SplitMix64::new(seed);
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let src = built(tmp.path(), 321);
    let want = artifact_files(&src);
    let m = Moto::start();
    let dest = "s3://models/powercut";
    let o = publish(&m, home, &src, dest);
    assert!(o.status.success(), "{}", stderr(&o));
    let pull_on = |mnt: &Path| {
        let mut cmd = m.ftpipe(home);
        cmd.args(["pull", dest, "--out"])
            .arg(mnt.join("out"))
            .args(PULL_ARGS)
            .args(["--retry-base-ms", "20"]);
        cmd
    };
    // Calibration: one whole pull on the power-cut filesystem.
    let Some((done, took)) = cycle(
        &tmp.path().join("mnt-calibration"),
        fresh_model(),
        &tmp.path().join("cut-calibration"),
        Duration::from_secs(60),
        pull_on,
    ) else {
        return;
    };
    assert!(done, "the calibration pull did not finish in 60 s");
    let out = tmp.path().join("cut-calibration/out");
    check_pulled(&out, &want, "after a finished pull");
    assert_eq!(
        manifest_sha(&out),
        manifest_sha(&src),
        "a finished pull lost its manifest"
    );
    let ms = (took.as_millis() as u64).max(50);
    eprintln!("calibration: a pull on the power-cut filesystem takes {ms} ms");
    let mut current: Option<PathBuf> = None;
    let (mut mid, mut receipts, mut watermarks) = (0, 0, 0);
    for cut in 1..=CUTS + MORE_CUTS {
        if cut > CUTS && mid >= 1 && receipts + watermarks >= 1 {
            break;
        }
        let model = match (&current, cut % CHAIN) {
            (Some(dir), c) if c != 1 => Model::load_dir(dir).unwrap(),
            _ => fresh_model(),
        };
        let delay = Duration::from_millis(rng.next_u64() % ms);
        let dump = tmp.path().join(format!("cut-{cut}"));
        let name = format!("pull cut {cut} after {delay:?}");
        let Some((finished, _)) = cycle(
            &tmp.path().join(format!("mnt-{cut}")),
            model,
            &dump,
            delay,
            pull_on,
        ) else {
            return;
        };
        let out = dump.join("out");
        let (r, w) = check_pulled(&out, &want, &name);
        if !finished {
            receipts += r;
            watermarks += w;
        }
        if finished {
            assert_eq!(manifest_sha(&out), manifest_sha(&src), "{name}");
        } else {
            mid += 1;
        }
        current = Some(dump);
    }
    eprintln!(
        "{mid} cuts mid-pull: {receipts} receipts and {watermarks} watermarks of unfinished \
         files checked against the durable bytes"
    );
    assert!(
        mid >= 1 && receipts + watermarks >= 1,
        "no cut landed mid-pull with anything claimed"
    );
    // The last recovered tree resumes on the normal disk.
    let out = current.unwrap().join("out");
    let o = pull(&m, home, dest, &out, PULL_ARGS);
    assert!(o.status.success(), "{}", stderr(&o));
    verify_deep(&out.join("artifact"));
    assert_eq!(manifest_sha(&out), manifest_sha(&src));
    assert_clean_audit(&out);
}

#[test]
fn power_cuts_during_publish_never_publish_what_is_not_whole() {
    let _heavy = heavy();
    if !Path::new("/dev/fuse").exists() {
        skip_unless_ci("/dev/fuse is missing: cannot mount the power-cut filesystem");
        return;
    }
    let seed = crash_seed();
    eprintln!("publish power-cut seed: {seed} (replay with FTPIPE_CRASH_SEED={seed})");
    let mut rng = SplitMix64::new(seed);
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let base = tmp.path().join("base");
    std::fs::create_dir_all(&base).unwrap();
    let src = built(&base, 322);
    let src_name = src.file_name().unwrap().to_owned();
    let m = Moto::start();
    let publish_on = |prefix: String| {
        let (m, src_name) = (&m, &src_name);
        move |mnt: &Path| {
            let mut cmd = m.ftpipe(home);
            cmd.arg("publish")
                .arg(mnt.join(src_name))
                .arg(format!("s3://models/{prefix}"))
                .args(["--part-size", PART_SIZE]);
            cmd
        }
    };
    let Some((done, took)) = cycle(
        &tmp.path().join("mnt-calibration"),
        Model::load_dir(&base).unwrap(),
        &tmp.path().join("cut-calibration"),
        Duration::from_secs(60),
        publish_on("calibration".into()),
    ) else {
        return;
    };
    assert!(done, "the calibration publish did not finish in 60 s");
    let ms = (took.as_millis() as u64).max(50);
    eprintln!("calibration: a publish from the power-cut filesystem takes {ms} ms");
    let mut current = base.clone();
    let (mut chain, mut mid) = (0u64, 0);
    for cut in 1..=CUTS {
        if cut % CHAIN == 1 && cut > 1 {
            chain += 1;
            current = base.clone();
        }
        let prefix = format!("pc-{chain}");
        let delay = Duration::from_millis(rng.next_u64() % ms);
        let dump = tmp.path().join(format!("cut-{cut}"));
        let name = format!("publish cut {cut} after {delay:?} into {prefix}");
        let Some((finished, _)) = cycle(
            &tmp.path().join(format!("mnt-{cut}")),
            Model::load_dir(&current).unwrap(),
            &dump,
            delay,
            publish_on(prefix.clone()),
        ) else {
            return;
        };
        let dir = dump.join(&src_name);
        if state_db_ok(&dir, &name) {
            let bad = query(
                &dir,
                "SELECT u.path FROM upload_parts p JOIN uploads u ON u.id = p.upload
                 WHERE (p.part_number - 1) * u.part_size + p.size > u.size",
            );
            assert!(bad.is_empty(), "{name}: parts past the end of {bad:?}");
        }
        if let Some(bytes) = m.get_object(&format!("{prefix}/manifest.json")) {
            assert_eq!(
                bytes,
                std::fs::read(src.join("artifact/manifest.json")).unwrap(),
                "{name}: a manifest that is not the artifact's"
            );
            for (path, object) in artifact_files(&src) {
                if path == "manifest.json" {
                    continue;
                }
                let key = m
                    .keys(&prefix)
                    .into_iter()
                    .find(|k| k.ends_with(&format!("/{path}")))
                    .unwrap_or_else(|| panic!("{name}: manifest published without {path}"));
                assert!(
                    m.get_object(&key).as_deref() == Some(&object[..]),
                    "{name}: {key} is not the artifact's {path}"
                );
            }
        } else {
            assert!(!finished, "{name}: finished without a manifest");
        }
        mid += usize::from(!finished);
        current = dump;
    }
    assert!(mid >= 1, "no cut landed mid-publish");
    // The last chain finishes on the normal disk, and pulls clean.
    let prefix = format!("pc-{chain}");
    let o = publish(
        &m,
        home,
        &current.join(&src_name),
        &format!("s3://models/{prefix}"),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let out = tmp.path().join("node");
    let o = pull(&m, home, &format!("s3://models/{prefix}"), &out, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    verify_deep(&out.join("artifact"));
    assert_eq!(manifest_sha(&out), manifest_sha(&src));
    assert_eq!(manifest_sha_of_prefix(&m, &prefix), manifest_sha(&src));
}
