//! End-to-end: a clean fetch, an idempotent re-run, and the lock.

use crate::common::*;

#[test]
fn clean_fetch_then_noop_rerun() {
    let (hub, files) = hub_with_repo(1, 3 << 20);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &[]));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_files_match(&out, &files);
    assert_clean_audit(&out);
    assert_eq!(query(&out, "PRAGMA journal_mode"), ["wal"]);

    hub.clear_requests();
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &[]));
    assert!(o.status.success(), "{}", stderr(&o));
    let body_gets = hub
        .requests()
        .iter()
        .filter(|r| r.path.contains("/resolve/") || r.path.starts_with("/lfs/"))
        .count();
    assert_eq!(body_gets, 0, "a finished fetch must not download again");
}

#[test]
fn second_process_on_same_dir_is_refused_with_pid() {
    let (hub, _) = hub_with_repo(2, 1 << 20);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir_all(out.join(".ftpipe")).unwrap();
    // Hold the lock from this process, as a running ftpipe would.
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .read(true)
        .open(out.join(".ftpipe/lock"))
        .unwrap();
    lock.try_lock().unwrap();
    std::fs::write(out.join(".ftpipe/lock"), "4242").unwrap();
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, &[]));
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(stderr(&o).contains("pid 4242"), "{}", stderr(&o));
}

#[test]
fn json_mode_prints_one_event_per_line_and_a_summary() {
    let (hub, _) = hub_with_repo(3, 1 << 20);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o = run(fetch_cmd(&hub.endpoint(), &out, &["--json"])
        .arg("--jobs")
        .arg("2"));
    assert!(o.status.success(), "{}", stderr(&o));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let kinds: Vec<&str> = lines.iter().map(|v| v["event"].as_str().unwrap()).collect();
    assert_eq!(kinds.first(), Some(&"fetch_planned"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"summary"), "{kinds:?}");
    let published = kinds.iter().filter(|k| **k == "file_published").count();
    let summary = lines.last().unwrap();
    assert_eq!(
        published,
        summary["outcome"]["audit"]["files"]
            .as_array()
            .unwrap()
            .len()
    );
    assert_eq!(summary["outcome"]["audit"]["ok"], true);
}
