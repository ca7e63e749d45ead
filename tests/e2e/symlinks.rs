//! A link planted in `DIR` must never be written through. The landed binary
//! truncated and filled a `source/<file>.part` symlink pointing outside
//! `DIR`, then published the final name as a link to the victim; it wrote
//! its PID through a `.ftpipe/lock` link, 2 MiB of zeros through
//! `.ftpipe/space-reserve` and the skeleton through
//! `.ftpipe/convert.json.ftpipe-tmp`. Each case here plants a link (or a
//! hard link, or a FIFO) at one kind of path ftpipe writes, runs the real
//! binary and checks: non-zero exit, the error names the path, the victim's
//! bytes are unchanged and nothing was published.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::common::*;
use ftpipe_fixtures::qwen4::QwenShape;

const VICTIM_BYTES: &[u8] = b"precious bytes outside DIR\n";

/// A victim file outside `DIR`, and `DIR` itself (not yet created).
fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, VICTIM_BYTES).unwrap();
    let out = dir.path().join("out");
    (dir, victim, out)
}

fn plant_link(victim: &Path, at: &Path) {
    std::fs::create_dir_all(at.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(victim, at).unwrap();
}

fn assert_refused(o: &Output, path: &Path, victim: &Path) {
    let err = stderr(o);
    assert!(!o.status.success(), "ftpipe succeeded:\n{err}");
    assert!(
        err.contains(&path.display().to_string()),
        "the error does not name {}:\n{err}",
        path.display()
    );
    assert!(
        err.contains("symlink") || err.contains("hard link") || err.contains("regular file"),
        "the error does not say what is wrong:\n{err}"
    );
    assert_eq!(
        std::fs::read(victim).unwrap(),
        VICTIM_BYTES,
        "the victim was written"
    );
    assert_eq!(
        std::fs::symlink_metadata(victim).unwrap().len(),
        VICTIM_BYTES.len() as u64
    );
}

/// No entry under `out` is a symlink except `allowed`.
fn assert_no_other_links(out: &Path, allowed: &Path) {
    let mut stack = vec![out.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let ft = e.file_type().unwrap();
            if ft.is_symlink() {
                assert_eq!(e.path(), allowed, "ftpipe published a symlink");
            } else if ft.is_dir() {
                stack.push(e.path());
            }
        }
    }
}

#[test]
fn part_file_link_is_refused_before_any_byte_and_nothing_is_published() {
    let (hub, files) = hub_with_repo(1101, 1 << 20);
    let lfs = lfs_file(&files).path.clone();
    let (_d, victim, out) = setup();
    let part = part_path(&out, &lfs);
    plant_link(&victim, &part);
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &[]));
    assert_refused(&o, &part, &victim);
    assert!(
        std::fs::symlink_metadata(out.join("source").join(&lfs)).is_err(),
        "the final name was published"
    );
    assert!(!has_receipt(&out, &lfs), "a receipt was written");
    assert!(body_gets(&hub, &lfs).is_empty(), "the body was requested");
    assert_no_other_links(&out, &part);
}

#[test]
fn hard_linked_part_file_is_refused() {
    let (hub, files) = hub_with_repo(1102, 1 << 20);
    let lfs = lfs_file(&files).path.clone();
    let (_d, victim, out) = setup();
    let part = part_path(&out, &lfs);
    std::fs::create_dir_all(part.parent().unwrap()).unwrap();
    std::fs::hard_link(&victim, &part).unwrap();
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &[]));
    assert_refused(&o, &part, &victim);
    assert!(!has_receipt(&out, &lfs));
}

#[test]
fn fifo_part_file_is_refused_without_blocking() {
    let (hub, files) = hub_with_repo(1103, 1 << 20);
    let lfs = lfs_file(&files).path.clone();
    let (_d, victim, out) = setup();
    let part = part_path(&out, &lfs);
    std::fs::create_dir_all(part.parent().unwrap()).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(&part)
        .status()
        .unwrap();
    assert!(made.success());
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &[]));
    assert_refused(&o, &part, &victim);
}

#[test]
fn state_files_that_are_links_are_refused_before_anything_is_written() {
    let (hub, _files) = hub_with_repo(1104, 1 << 20);
    for name in [
        "lock",
        "space-reserve",
        "state.db",
        "state.db-wal",
        "convert.json",
        "convert.json.ftpipe-tmp",
        "plan.json.ftpipe-tmp",
    ] {
        let (_d, victim, out) = setup();
        let at = out.join(".ftpipe").join(name);
        plant_link(&victim, &at);
        let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &[]));
        assert_refused(&o, &at, &victim);
        assert!(!out.join("source").exists(), "{name}: the fetch went ahead");
        assert_no_other_links(&out, &at);
    }
}

#[test]
fn linked_top_level_directories_are_refused() {
    let (hub, _files) = hub_with_repo(1105, 1 << 20);
    for name in [".ftpipe", "source", "artifact"] {
        let (d, victim, out) = setup();
        let elsewhere = d.path().join("elsewhere");
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::fs::create_dir_all(&out).unwrap();
        let at = out.join(name);
        std::os::unix::fs::symlink(&elsewhere, &at).unwrap();
        let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &[]));
        assert_refused(&o, &at, &victim);
        assert_eq!(
            std::fs::read_dir(&elsewhere).unwrap().count(),
            0,
            "{name}: something was written through the link"
        );
    }
}

/// Fetches a small qwen4 checkpoint into `out` (no conversion yet).
fn fetched_qwen(seed: u64, out: &Path) {
    let hub = qwen4_hub(seed, QwenShape::default());
    run_ok(&mut fetch_cmd(&hub.endpoint(), out, &[]));
}

#[test]
fn convert_refuses_links_at_its_temp_and_final_names() {
    let (_d, _victim, base) = setup();
    fetched_qwen(1106, &base);
    for rel in [
        ".ftpipe/convert.json.ftpipe-tmp",
        ".ftpipe/plan.json",
        "artifact/manifest.json",
        "artifact/manifest.json.ftpipe-tmp",
        "artifact/model.ftw.ftpipe-tmp",
        "artifact/model.ftw",
    ] {
        let (d, victim, _) = setup();
        let out = d.path().join("copy");
        copy_tree(&base, &out);
        let at = out.join(rel);
        plant_link(&victim, &at);
        eprintln!("planted at {rel}");
        let o = run(&mut convert_cmd(&out, &[]));
        assert_refused(&o, &at, &victim);
        assert!(
            !out.join("artifact/manifest.json").is_file()
                || std::fs::symlink_metadata(out.join("artifact/manifest.json"))
                    .unwrap()
                    .file_type()
                    .is_symlink(),
            "{rel}: an artifact was published"
        );
        assert_no_other_links(&out, &at);
    }
}
