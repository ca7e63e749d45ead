//! `ftpipe demo`: the whole acquisition story on one machine, no network.
//!
//! It serves a generated checkpoint from the fixture hub on loopback, starts
//! `ftpipe fetch` as a child process, kills it with SIGKILL in the middle of
//! a large file (held mid-body by a stall the hub injects, so the kill always
//! lands mid-transfer), then resumes in this process and prints the audit
//! table. Everything it shows was measured in this run.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use ftpipe_fixtures::{Fault, FaultRule, HubBuilder, checkpoint};
use ftpipe_pipeline::{FetchParams, Pipeline};
use ftpipe_stages::fetch::FetchOptions;
use ftpipe_stages::resolve::ResolveRequest;

const REPO: &str = "demo/tiny-moe";
const DEMO_BYTES: u64 = 192 << 20;
const STALL_MS: u64 = 30_000;

fn part_len(out: &Path, path: &str) -> u64 {
    let part = out.join("source").join(format!("{path}.part"));
    std::fs::metadata(part).map(|m| m.len()).unwrap_or(0)
}

pub async fn run(out: Option<PathBuf>) -> anyhow::Result<bool> {
    let out = match out {
        Some(o) => o,
        None => {
            let dir = std::env::temp_dir().join(format!("ftpipe-demo-{}", std::process::id()));
            std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
            dir
        }
    };
    println!("ftpipe demo: output in {}", out.display());
    let files = checkpoint::generate_small_repo(7, DEMO_BYTES);
    let largest = files
        .iter()
        .map(|f| {
            (
                checkpoint::content_bytes(f).map(|b| b.len()).unwrap_or(0),
                f.path.clone(),
            )
        })
        .max()
        .context("generated repo is empty")?;
    let (victim_len, victim) = (largest.0 as u64, largest.1);
    let hub = HubBuilder::new().repo(REPO, files).start().await?;
    let endpoint = hub.endpoint();
    println!(
        "serving {REPO} ({} MiB generated) at {endpoint}",
        DEMO_BYTES >> 20
    );

    // Hold the largest file mid-body so the crash lands inside a transfer.
    let stall_at = victim_len / 2;
    hub.inject(FaultRule::new(
        &victim,
        Fault::Stall {
            after: stall_at,
            for_ms: STALL_MS,
        },
    ));
    let exe = std::env::current_exe().context("locate the ftpipe binary")?;
    let mut child = Command::new(exe)
        .args([
            "fetch",
            REPO,
            "--endpoint",
            &endpoint,
            "--quiet",
            "--checkpoint-secs",
            "0.2",
            "--out",
        ])
        .arg(&out)
        .env_remove("HF_TOKEN")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("start ftpipe fetch")?;
    let started = Instant::now();
    while part_len(&out, &victim) < stall_at {
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            bail!("the demo fetch did not reach the stall point within 60 s");
        }
        if let Some(status) = child.try_wait()? {
            bail!("the demo fetch exited early with {status}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Let a checkpoint pass so part of the received prefix is durable.
    tokio::time::sleep(Duration::from_millis(500)).await;
    child.kill().context("kill the fetch")?;
    let _ = child.wait();
    println!(
        "killed `ftpipe fetch` (pid {}) with SIGKILL at byte {} of {victim} ({} bytes)",
        child.id(),
        part_len(&out, &victim),
        victim_len
    );
    hub.clear_faults();

    println!("resuming:");
    let pipeline = Pipeline::open(&out, "demo resume").await?;
    let params = FetchParams {
        endpoint: endpoint.clone(),
        token: None,
        read_timeout: Duration::from_secs(30),
        resolve: ResolveRequest {
            repo: REPO.into(),
            revision: "main".into(),
            repin: false,
            include: vec![],
            exclude: vec![],
        },
        options: FetchOptions::default(),
        reacquire: false,
    };
    let outcome = pipeline
        .fetch(params, Arc::new(crate::report::LogLines::new()))
        .await?;
    for r in hub
        .requests()
        .iter()
        .filter(|r| r.range.is_some() && r.status != 302)
    {
        println!(
            "resume request: {} Range: {} If-Range: {} -> HTTP {}, {} body bytes",
            r.path,
            r.range.as_deref().unwrap_or_default(),
            r.if_range.as_deref().unwrap_or("-"),
            r.status,
            r.body_bytes
        );
    }
    println!();
    print!("{}", crate::table::render(&outcome.audit));
    println!("\nartifact left in {}", out.display());
    Ok(outcome.audit.ok)
}
