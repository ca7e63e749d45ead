//! Full disk: fetching onto a small, size-limited mount.
//!
//! As root, each test mounts a fresh tmpfs (`mount -t tmpfs -o size=..`),
//! falling back to a loop-mounted ext4 image; a guard unmounts it on drop,
//! panics included. When mounting is impossible (not root, no
//! CAP_SYS_ADMIN) the test prints a `SKIP` line to stderr and returns.
//!
//! * Mid-run: the preflight passes, then the disk fills while a big file is
//!   stalled by the hub (a ballast file takes every free byte; the state
//!   database lives on the same volume, so SQLite cannot grow either). The
//!   fetch must stop with exit 5, naming the volume and the bytes still
//!   needed, leave the ledger consistent with the `.part` (committed ≤
//!   length, integrity ok) and, once space is freed, resume from the
//!   committed watermark without refetching it.
//! * Preflight: a repo bigger than the volume is refused at once, with both
//!   numbers, exit 5, and no body byte requested.
//! * The state database meets the full disk itself: at its creation, while
//!   migrating an older schema, and at its first write of a run. Each exits
//!   5 naming the database, and succeeds once space is freed.

use crate::common::*;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ftpipe_fixtures::{Fault, FaultRule};

/// Where a [`SmallMount`] is mounted.
enum Target {
    Temp(tempfile::TempDir),
    Dir(PathBuf),
}

impl Target {
    fn path(&self) -> &Path {
        match self {
            Target::Temp(t) => t.path(),
            Target::Dir(d) => d,
        }
    }
}

/// A size-limited filesystem mounted on a directory; unmounted on drop.
struct SmallMount {
    dir: Target,
    kind: &'static str,
    _image_dir: Option<tempfile::TempDir>,
}

impl SmallMount {
    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Mounts `mib` MiB on a new temp dir, or returns why it could not.
    fn new(mib: u64) -> Result<SmallMount, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        Self::mount(Target::Temp(dir), mib)
    }

    /// Mounts a `mib` MiB tmpfs on the existing directory `at`.
    fn new_at(at: PathBuf, mib: u64) -> Result<SmallMount, String> {
        Self::mount(Target::Dir(at), mib)
    }

    fn mount(dir: Target, mib: u64) -> Result<SmallMount, String> {
        let tmpfs = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir.path())
            .output();
        if matches!(&tmpfs, Ok(o) if o.status.success()) {
            return Ok(SmallMount {
                dir,
                kind: "tmpfs",
                _image_dir: None,
            });
        }
        let tmpfs_err = match tmpfs {
            Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_owned(),
            Err(e) => e.to_string(),
        };
        // Fallback: an ext4 image on a loop device.
        let image_dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let image = image_dir.path().join("disk.img");
        let ok = |c: &mut Command| c.output().is_ok_and(|o| o.status.success());
        if ok(Command::new("truncate")
            .args(["-s", &format!("{mib}M")])
            .arg(&image))
            && ok(Command::new("mkfs.ext4")
                .args(["-q", "-F", "-m", "0"])
                .arg(&image))
            && ok(Command::new("mount")
                .args(["-o", "loop"])
                .arg(&image)
                .arg(dir.path()))
        {
            return Ok(SmallMount {
                dir,
                kind: "ext4 (loop)",
                _image_dir: Some(image_dir),
            });
        }
        Err(format!(
            "cannot mount a small filesystem (tmpfs: {tmpfs_err}; loop ext4 failed too)"
        ))
    }
}

impl Drop for SmallMount {
    fn drop(&mut self) {
        let umount = |lazy: bool| {
            let mut c = Command::new("umount");
            if lazy {
                c.arg("-l");
            }
            c.arg(self.dir.path())
                .output()
                .is_ok_and(|o| o.status.success())
        };
        if !umount(false) && !umount(true) {
            eprintln!("warning: could not unmount {}", self.dir.path().display());
        }
    }
}

/// Mounts or prints SKIP (returns None).
fn mount_or_skip(test: &str, mib: u64) -> Option<SmallMount> {
    match SmallMount::new(mib) {
        Ok(m) => {
            eprintln!(
                "{test}: {mib} MiB {} mounted at {}",
                m.kind,
                m.path().display()
            );
            Some(m)
        }
        Err(why) => {
            skip_unless_ci(&format!("{test}: {why} (needs root / CAP_SYS_ADMIN)"));
            None
        }
    }
}

/// Fills the volume holding `path` with a file until the kernel says no.
fn write_ballast(path: &Path) -> u64 {
    let mut f = std::fs::File::create(path).expect("create ballast");
    let mut written = 0u64;
    for chunk in [1 << 20, 64 << 10, 4 << 10, 512] {
        let buf = vec![0xA5u8; chunk];
        while f.write_all(&buf).is_ok() {
            written += chunk as u64;
        }
    }
    let _ = f.sync_all();
    written
}

fn part_len(out: &Path, path: &str) -> u64 {
    std::fs::metadata(part_path(out, path))
        .map(|m| m.len())
        .unwrap_or(0)
}

const STALL_AFTER: u64 = 3 << 20;
const ARGS: &[&str] = &[
    "--jobs",
    "1",
    "--read-timeout",
    "5",
    "--checkpoint-bytes",
    "262144",
    "--checkpoint-secs",
    "0.05",
];

/// Regression (several bugs, see the fixes in `receipts/src/store.rs` and
/// `stages/src/fetch`): when the volume filled mid-run, the ledger write that
/// followed the failed append failed too (`SQLITE_FULL`: the database is on
/// the same volume). The failed `COMMIT` left sqlx's connection "in a
/// transaction" for good, so every later write of the process failed with
/// "attempted to call begin_with at non-zero transaction depth": exit 1
/// instead of 5, no mention of space, the bytes before the failure not
/// committed, the attempt left `in_flight`. Now a space reserve beside the
/// database is freed at the first ENOSPC, the watermark and attempt are
/// written, and the run stops with exit 5 naming the volume.
#[test]
fn disk_fills_mid_run_then_resumes_from_the_watermark() {
    let _time_bounded = time_bounded();
    let Some(mount) = mount_or_skip("disk_fills_mid_run", 40) else {
        return;
    };
    let out = mount.path().join("out");
    fill_mid_run_then_resume(&out, mount.path(), mount.path());
}

/// Regression: the state database's volume fills while file bytes still fit,
/// so a *ledger* write is the first to fail (`SQLITE_FULL`), not an append.
/// That error used to poison the connection (see above) and surface as a
/// database failure (exit 1). Here `DIR/.ftpipe` is its own small tmpfs.
#[test]
fn state_volume_fills_first_then_resumes_from_the_watermark() {
    let _time_bounded = time_bounded();
    let outer = tempfile::tempdir().unwrap();
    let out = outer.path().join("out");
    std::fs::create_dir_all(out.join(".ftpipe")).unwrap();
    let Some(state) = SmallMount::new_at(out.join(".ftpipe"), 6)
        .map_err(|why| skip_unless_ci(&format!("state_volume_fills_first: {why}")))
        .ok()
    else {
        return;
    };
    fill_mid_run_then_resume(&out, state.path(), outer.path());
}

/// Fetches into `out` with a stall on the biggest file; once its bytes up to
/// the stall are committed, fills the volume at `fill` with a ballast file.
/// Expects exit 5 naming a path under `named`, a consistent ledger, and a
/// resume from the committed watermark once the ballast is gone.
fn fill_mid_run_then_resume(out: &Path, fill: &Path, named: &Path) {
    let (hub, files) = hub_with_repo(21, 24 << 20);
    let sizes: Vec<(String, u64)> = files
        .iter()
        .map(|f| (f.path.clone(), content_len(f)))
        .collect();
    let total: u64 = sizes.iter().map(|(_, s)| s).sum();
    let (big, big_size) = sizes.iter().max_by_key(|(_, s)| *s).cloned().unwrap();
    hub.inject(FaultRule::new(
        &big,
        Fault::Stall {
            after: STALL_AFTER,
            for_ms: 1500,
        },
    ));
    let child = fetch_cmd(&hub.endpoint(), out, ARGS)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ftpipe");

    // Wait until the big file sits stalled with its bytes up to the stall
    // committed (STALL_AFTER is a multiple of --checkpoint-bytes), then fill.
    let deadline = Instant::now() + Duration::from_secs(20);
    while part_len(out, &big) < STALL_AFTER || committed_bytes(out, &big) < STALL_AFTER {
        assert!(Instant::now() < deadline, "the stall was never reached");
        std::thread::sleep(Duration::from_millis(10));
    }
    let ballast = fill.join("ballast");
    let filled = write_ballast(&ballast);
    let o = child.wait_with_output().expect("wait");
    let err = stderr(&o);
    eprintln!(
        "repo {total} bytes, {big} = {big_size} bytes stalled at {STALL_AFTER}; ballast {filled} bytes; fetch said: {err}"
    );
    assert_eq!(o.status.code(), Some(5), "exit code; stderr: {err}");
    assert!(err.contains("no space"), "{err}");
    assert!(
        err.contains(&named.display().to_string()),
        "the volume is not named: {err}"
    );
    // The ledger agrees with the disk (committed ≤ on-disk length,
    // `transferred = committed + discarded`, integrity ok, ...).
    let rows = ledger_snapshot(out);
    check_ledger_rows(out, &rows, "after the disk filled");
    let still: u64 = rows
        .iter()
        .filter(|r| !r.receipt)
        .map(|r| r.expected - r.committed)
        .sum();
    assert!(
        err.lines()
            .last()
            .is_some_and(|l| l.contains(&format!("{still} bytes still needed"))),
        "bytes still needed ({still}) not reported: {err}"
    );
    let before = rows.iter().find(|r| r.path == big).unwrap().clone();
    assert!(
        before.committed >= STALL_AFTER,
        "the bytes received before the stall were not committed: {before:?}"
    );
    let in_flight = query(
        out,
        "SELECT count(*) FROM attempts WHERE outcome = 'in_flight'",
    );
    assert_eq!(in_flight, ["0"], "attempts left unrecorded");

    // Free the space and re-run the same command.
    std::fs::remove_file(&ballast).unwrap();
    hub.clear_requests();
    let o = run(&mut fetch_cmd(&hub.endpoint(), out, ARGS));
    assert!(o.status.success(), "re-run: {}", stderr(&o));
    assert_files_match(out, &files);
    assert_clean_audit(out);
    assert!(
        !out.join(".ftpipe/space-reserve").exists(),
        "space reserve left behind"
    );
    let reqs = body_requests(&hub, &big);
    assert_eq!(
        reqs.first().and_then(|r| r.range.clone()),
        Some(format!("bytes={}-", before.committed)),
        "resume did not start at the committed watermark: {reqs:?}"
    );
    let after = ledger_snapshot(out)
        .into_iter()
        .find(|r| r.path == big)
        .unwrap();
    assert_eq!(after.transferred, big_size + after.discarded, "{after:?}");
    assert!(
        after.discarded < before.committed / 4,
        "the committed prefix was (partly) refetched: {after:?}"
    );
    eprintln!(
        "{big}: committed {} before the re-run, re-run asked {:?}, discarded {} in total",
        before.committed,
        reqs.first().and_then(|r| r.range.clone()),
        after.discarded
    );
}

#[test]
fn preflight_refuses_a_repo_bigger_than_the_volume() {
    let Some(mount) = mount_or_skip("preflight", 8) else {
        return;
    };
    let (hub, files) = hub_with_repo(22, 16 << 20);
    let total: u64 = files.iter().map(content_len).sum();
    let out = mount.path().join("out");
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, ARGS));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(5), "{err}");
    assert!(
        err.contains(&format!("{total} bytes still needed")),
        "needed bytes ({total}) not named: {err}"
    );
    let available: u64 = err
        .split(" bytes available")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("available bytes not named: {err}"));
    assert!(available < total && available <= 8 << 20, "{err}");
    assert!(err.contains(&mount.path().display().to_string()), "{err}");
    for f in &files {
        assert!(
            body_requests(&hub, &f.path).is_empty(),
            "{} was requested",
            f.path
        );
        assert_eq!(part_len(&out, &f.path), 0, "{} has bytes", f.path);
    }
    eprintln!("preflight refused: {}", err.trim());
}

/// `run` counts the artifact too: sources that fit alone, but not with the
/// artifact they convert into, are refused before any weight is fetched.
#[test]
fn run_preflight_counts_sources_and_artifact() {
    use ftpipe_fixtures::qwen4::{QwenShape, generate_qwen4_repo};
    let Some(mount) = mount_or_skip("run_preflight", 100) else {
        return;
    };
    let shape = QwenShape::medium();
    let files = generate_qwen4_repo(5, shape);
    let hub = hub_serving(files.clone());
    let scratch = tempfile::tempdir().unwrap();
    let o = run_ok(
        ftpipe()
            .args([
                "plan",
                REPO,
                "--remote",
                "--json",
                "--endpoint",
                &hub.endpoint(),
                "--out",
            ])
            .arg(scratch.path().join("p")),
    );
    let plan: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let artifact = plan["total_bytes"].as_u64().unwrap();
    let sources: u64 = files.iter().map(content_len).sum();
    let volume = 100u64 << 20;
    assert!(
        sources < volume && sources + artifact > volume,
        "{sources} + {artifact}"
    );
    hub.clear_requests();
    let out = mount.path().join("out");
    let o = run(&mut run_cmd(&hub.endpoint(), &out, &[]));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(5), "{err}");
    assert!(
        err.contains(&format!("{} bytes still needed", sources + artifact)),
        "sources {sources} + artifact {artifact} not named: {err}"
    );
    assert!(err.contains("bytes available"), "{err}");
    for f in files.iter().filter(|f| f.path.ends_with(".safetensors")) {
        let bodies: u64 = body_gets(&hub, &f.path).iter().map(|r| r.body_bytes).sum();
        assert!(bodies < 1 << 20, "{}: {bodies} body bytes fetched", f.path);
    }
    eprintln!("run preflight refused: {}", err.trim());
}

/// Regression: a full disk during conversion exited 1 ("write …: No space
/// left on device") although the documented code for a full disk is 5: only
/// the fetch mapped ENOSPC. Now any cause in the error chain that is a
/// full-disk I/O error exits 5, and the conversion resumes once space is
/// freed.
#[test]
fn conversion_fills_the_disk_then_resumes_with_exit_5() {
    use ftpipe_fixtures::qwen4::{QwenShape, generate_qwen4_repo};
    let Some(mount) = mount_or_skip("conversion_disk_full", 200) else {
        return;
    };
    let files = generate_qwen4_repo(6, QwenShape::medium());
    let hub = hub_serving(files);
    let out = mount.path().join("out");
    run_ok(&mut fetch_cmd(&hub.endpoint(), &out, &[]));
    let o = run_ok(ftpipe().args(["plan", REPO, "--json", "--out"]).arg(&out));
    let plan: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let artifact = plan["total_bytes"].as_u64().unwrap();
    // Leave room for half the artifact (and the database's growth).
    let ballast = mount.path().join("ballast");
    let filled = write_ballast(&ballast);
    let keep = filled.saturating_sub(artifact / 2);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&ballast)
        .unwrap()
        .set_len(keep)
        .unwrap();
    let o = run(&mut convert_cmd(&out, &["--no-preflight"]));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(5), "{err}");
    assert!(
        err.to_lowercase().contains("space"),
        "the error does not say the disk is full: {err}"
    );
    eprintln!(
        "conversion on a full disk: {}",
        err.lines().last().unwrap_or("")
    );
    assert_eq!(query(&out, "PRAGMA integrity_check"), ["ok"]);
    // Receipts claim only components that are on disk whole.
    for row in query(&out, "SELECT path || '|' || size FROM components") {
        let (path, size) = row.rsplit_once('|').unwrap();
        let len = std::fs::metadata(out.join("artifact").join(path))
            .unwrap()
            .len();
        assert_eq!(len.to_string(), size, "{path}");
    }
    std::fs::remove_file(&ballast).unwrap();
    run_ok(&mut convert_cmd(&out, &[]));
    let v = run(ftpipe()
        .arg("verify")
        .arg(out.join("artifact"))
        .arg("--deep"));
    assert!(v.status.success(), "{}", stderr(&v));
}

/// Leaves exactly `free` bytes (whole pages) free on the volume holding
/// `dir`: a gap file of that size is written first, a ballast fills every
/// other byte, then the gap is removed. Returns the ballast's path.
fn leave_free(dir: &Path, free: usize) -> PathBuf {
    let gap = dir.join("gap");
    std::fs::write(&gap, vec![0x5Au8; free]).expect("write the gap");
    let ballast = dir.join("ballast");
    write_ballast(&ballast);
    std::fs::remove_file(&gap).unwrap();
    ballast
}

/// Asserts a fetch into `out` exited 5 (no space) because of the state
/// database, with `phase` ("cannot open", "cannot migrate", "query
/// failed") in its message; returns stderr.
fn assert_state_db_full(o: &std::process::Output, phase: &str) -> String {
    let err = stderr(o);
    assert!(err.contains("state database"), "not the database: {err}");
    assert!(err.contains(phase), "not at {phase:?}: {err}");
    assert_eq!(o.status.code(), Some(5), "exit code; stderr: {err}");
    err
}

/// The volume is full before the state database exists: creating it (its
/// header, the WAL) fails with `SQLITE_FULL`. Guards exit 5 at creation.
#[test]
fn state_database_creation_on_a_full_disk_exits_5() {
    let Some(mount) = mount_or_skip("state_db_creation", 4) else {
        return;
    };
    let (hub, files) = hub_with_repo(23, 64 << 10);
    let out = mount.path().join("out");
    std::fs::create_dir_all(out.join(".ftpipe")).unwrap();
    // One page: the lock file's PID.
    let ballast = leave_free(mount.path(), 4096);
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, ARGS));
    let err = assert_state_db_full(&o, "cannot open state database");
    eprintln!("state database creation on a full disk: {}", err.trim());
    std::fs::remove_file(&ballast).unwrap();
    run_ok(&mut fetch_cmd(&hub.endpoint(), &out, ARGS));
    assert_files_match(&out, &files);
}

/// Regression: a full disk met while migrating the state database exited
/// 1, not 5 (README): the exit code looked for `SQLITE_FULL` only in the
/// store's `Open` and `Query` errors, and a migration's is a `MigrateError`
/// around it. Here a database of schema 7 with many attempt rows sits on a
/// nearly full volume; migration 0008 rebuilds the attempts table, which
/// needs more room than is left.
#[test]
fn state_database_migration_on_a_full_disk_exits_5() {
    let Some(mount) = mount_or_skip("state_db_migration", 16) else {
        return;
    };
    let (hub, files) = hub_with_repo(24, 64 << 10);
    let out = mount.path().join("out");
    let state = out.join(".ftpipe");
    std::fs::create_dir_all(&state).unwrap();
    schema_7_database(&state.join("state.db"), 20_000);
    let ballast = leave_free(mount.path(), 64 << 10);
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, ARGS));
    let err = assert_state_db_full(&o, "cannot migrate state database");
    eprintln!("state database migration on a full disk: {}", err.trim());
    assert_eq!(query(&out, "PRAGMA integrity_check"), ["ok"]);
    std::fs::remove_file(&ballast).unwrap();
    run_ok(&mut fetch_cmd(&hub.endpoint(), &out, ARGS));
    assert_files_match(&out, &files);
    assert_eq!(
        query(&out, "SELECT count(*) FROM attempts WHERE host = 'old'"),
        ["20000"],
        "the old rows came through the migration"
    );
}

/// The database exists at the current schema, then the volume fills:
/// the run's first write (recording the run) fails with `SQLITE_FULL`.
#[test]
fn state_database_write_on_a_full_disk_exits_5() {
    let Some(mount) = mount_or_skip("state_db_write", 8) else {
        return;
    };
    let (hub, files) = hub_with_repo(25, 64 << 10);
    let out = mount.path().join("out");
    run_ok(&mut fetch_cmd(&hub.endpoint(), &out, ARGS));
    // Room for the lock and SQLite's shared-memory index, not for a write.
    let ballast = leave_free(mount.path(), 36 << 10);
    let o = run(&mut fetch_cmd(&hub.endpoint(), &out, ARGS));
    let err = assert_state_db_full(&o, "state database query failed");
    eprintln!("state database write on a full disk: {}", err.trim());
    std::fs::remove_file(&ballast).unwrap();
    run_ok(&mut fetch_cmd(&hub.endpoint(), &out, ARGS));
    assert_files_match(&out, &files);
}

/// Writes a state database at `db` migrated to schema 7 (before 0008
/// rebuilt `attempts` and `discards`), holding `attempts` attempt rows of
/// host `old`, and closes it (its WAL checkpointed into the file).
fn schema_7_database(db: &Path, attempts: usize) {
    use sqlx::Connection;
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode};
    static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let options = SqliteConnectOptions::new()
            .filename(db)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .foreign_keys(true);
        let mut conn = sqlx::SqliteConnection::connect_with(&options)
            .await
            .unwrap();
        MIGRATOR.run_to(7, &mut conn).await.unwrap();
        sqlx::query("INSERT INTO runs (command, pid, ftpipe_version) VALUES ('fetch', 1, '0.0')")
            .execute(&mut conn)
            .await
            .unwrap();
        sqlx::query(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)
             INSERT INTO attempts (run_id, path, host, outcome, body_bytes, tail_measured)
             SELECT 1, 'model-' || i || '-' || hex(zeroblob(40)) || '.safetensors', 'old',
                    'failed', i, 0 FROM n",
        )
        .bind(attempts as i64)
        .execute(&mut conn)
        .await
        .unwrap();
        conn.close().await.unwrap();
    });
}
