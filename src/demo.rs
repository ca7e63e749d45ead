//! `ftpipe demo`: the whole job on one machine, no network.
//!
//! It serves a generated checkpoint laid out like the released Qwen4-Exp
//! ModelOpt NVFP4 export (`text_config`, `model.language_model.*`, GDN and
//! full-attention layers, per-expert NVFP4 experts, an FP8 PLE table split
//! over several shards, vision and MTP partitions;
//! [`ReleaseShape::demo`])
//! from the fixture hub on loopback and runs `ftpipe run` on it as a child
//! process, crashing it twice with SIGKILL:
//!
//! 1. during the download, while the hub holds the two largest shards
//!    holding experts mid-body (injected stalls, so the kill always lands
//!    inside those transfers) and every other file is already published
//!    (and what it feeds converted: `run` converts each shard as it is
//!    verified);
//! 2. during the conversion, as soon as the child reports its first weights
//!    component written and durable (its receipt committed; the tiny global
//!    scales written before it would show little), before `manifest.json`
//!    exists: the hub holds the second of those shards again, so the
//!    first one's components are written while the artifact cannot be
//!    finished.
//!
//! `ftpipe demo --serve` only serves the same checkpoint (no fault) until
//! Ctrl-C and prints the commands to try against it.
//!
//! The second child resumes both downloads with ranged requests; this
//! process then resumes (reusing the durable components), verifies the
//! artifact deeply and prints the audit table.
//! Everything it shows was measured in this run; if the child finishes
//! before the second kill could land, it says so.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use ftpipe_artifact::manifest::MANIFEST_FILE;
use ftpipe_convert::ConvertOptions;
use ftpipe_convert::safetensors::SourceHeader;
use ftpipe_fetch::FetchOptions;
use ftpipe_fixtures::qwen4::release::{ReleaseShape, generate_release_repo};
use ftpipe_fixtures::{Fault, FaultRule, FixtureHub, HubBuilder, RepoFile, checkpoint};
use ftpipe_fs::TEMP_SUFFIX;
use ftpipe_hub::resolve::ResolveRequest;
use ftpipe_pipeline::{FetchParams, Pipeline};

const REPO: &str = "demo/qwen4-exp";
const SEED: u64 = 4;
/// How long the hub holds the largest shard mid-body (the kill ends it sooner).
const STALL_MS: u64 = 120_000;
/// Longest wait for a child to reach a crash point.
const CHILD_TIMEOUT: Duration = Duration::from_secs(120);
const RAM_BUDGET: u64 = 256 << 20;
const RESERVE: u64 = 32 << 20;
pub(crate) const CONVERT_JOBS: usize = 2;

pub async fn run(out: Option<PathBuf>) -> anyhow::Result<bool> {
    let started = Instant::now();
    let out = prepare_out(out)?;
    println!("ftpipe demo: output in {}", out.display());
    let shape = ReleaseShape::demo();
    let files = generate_release_repo(SEED, &shape);
    let sizes = describe(&shape, &files)?;
    let shards = expert_shards(&files)?;
    let [victim, held, ..] = shards.as_slice() else {
        bail!("the generated repo has fewer than two shards holding experts");
    };
    let (victim, held) = (victim.clone(), held.clone());
    let hub = HubBuilder::new().repo(REPO, files).start().await?;
    let endpoint = hub.endpoint();
    println!("serving {REPO} at {endpoint}\n");

    crash_download(&hub, &out, &sizes, &victim, &held).await?;
    let crashed = crash_conversion(&hub, &out, &held).await?;
    print_resume_requests(&hub);
    resume(&out, &endpoint, crashed).await?;

    let artifact = out.join("artifact");
    let verify =
        tokio::task::block_in_place(|| ftpipe_artifact::verify::verify_artifact(&artifact, true))?;
    println!("\nverify (deep, the artifact on its own):");
    print!("{}", crate::verify_view::render(&verify));
    let audit = ftpipe_pipeline::audit_dir(&out, false).await?;
    println!("\naudit:");
    print!("{}", crate::table::render(&audit));

    println!("\nartifact left in {}", out.display());
    println!("  ftpipe inspect {}", artifact.join("model.ftw").display());
    println!("  ftpipe verify {} --deep", artifact.display());
    println!("demo took {:.1} s", started.elapsed().as_secs_f64());
    Ok(verify.ok && audit.ok)
}

/// `demo --serve`: the generated checkpoint on loopback until SIGINT or
/// SIGTERM, with the commands that fetch, run, publish and pull it (their
/// directories under `out`, default a new temp dir's path; nothing is
/// created here).
pub async fn serve(out: Option<PathBuf>) -> anyhow::Result<bool> {
    use tokio::signal::unix::{SignalKind, signal};
    let base = out.unwrap_or_else(|| {
        std::env::temp_dir().join(format!("ftpipe-demo-{}", std::process::id()))
    });
    let mut int = signal(SignalKind::interrupt()).context("handle SIGINT")?;
    let mut term = signal(SignalKind::terminate()).context("handle SIGTERM")?;
    let shape = ReleaseShape::demo();
    let files = generate_release_repo(SEED, &shape);
    describe(&shape, &files)?;
    let hub = HubBuilder::new().repo(REPO, files).start().await?;
    let endpoint = hub.endpoint();
    print_serve_commands(&endpoint, &base);
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
    println!("stopped serving {REPO}");
    Ok(true)
}

/// What to try against the served checkpoint, each command on a line of
/// its own (`ftpipe ...`).
fn print_serve_commands(endpoint: &str, base: &Path) {
    let dir = |name: &str| base.join(name).display().to_string();
    let (fetched, ran, pulled) = (dir("fetched"), dir("run"), dir("pulled"));
    println!("\nserving {REPO} at {endpoint} until Ctrl-C; from another shell:\n");
    println!("  ftpipe fetch {REPO} --endpoint {endpoint} --out {fetched}");
    println!("  ftpipe run {REPO} --endpoint {endpoint} --out {ran}");
    println!("  ftpipe publish {ran} s3://BUCKET/demo --s3-endpoint URL");
    println!("  ftpipe pull s3://BUCKET/demo --out {pulled} --s3-endpoint URL");
    println!(
        "\npublish and pull need an S3-compatible store: BUCKET is a bucket you can write, URL \
         its endpoint (or leave --s3-endpoint out for AWS), credentials in AWS_ACCESS_KEY_ID and \
         AWS_SECRET_ACCESS_KEY (or AWS_PROFILE). A local store to try them: \
         `python3 -m moto.server -p 5000`, a bucket made with \
         `curl -X PUT http://127.0.0.1:5000/BUCKET`, then \
         --s3-endpoint http://127.0.0.1:5000 and any non-empty credentials."
    );
}

/// Resumes in this process and prints what the resume found and did.
async fn resume(out: &Path, endpoint: &str, crashed: bool) -> anyhow::Result<()> {
    let pipeline = Pipeline::open(out, "demo resume").await?;
    if crashed {
        let durable = pipeline.store().components().await?;
        let bytes: u64 = durable.iter().map(|c| c.size).sum();
        let names: Vec<&str> = durable.iter().map(|c| c.path.as_str()).collect();
        println!(
            "  durable at the kill (receipts): {} component(s), {bytes} bytes: {}",
            durable.len(),
            names.join(", ")
        );
    }

    println!("\nresuming in this process (`ftpipe run` again, same request):");
    let outcome = pipeline
        .run(
            fetch_params(endpoint),
            convert_options(),
            None,
            Arc::new(crate::report::LogLines::new()),
        )
        .await?;
    match &outcome.convert {
        Some(c) => println!(
            "  conversion: {} components, {} written now, {} reused from before the kill, {} bytes",
            c.components, c.written, c.reused, c.total_bytes
        ),
        None => println!("  conversion: {}", outcome.summary),
    }
    println!("  fingerprint      {}", outcome.fingerprint);
    println!("  manifest sha256  {}", outcome.manifest_sha256);
    Ok(())
}

/// `out`, or a new temp dir; refuses a non-empty directory (a demo must
/// start from nothing to show its crashes).
fn prepare_out(out: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let out = out.unwrap_or_else(|| {
        std::env::temp_dir().join(format!("ftpipe-demo-{}", std::process::id()))
    });
    if std::fs::read_dir(&out).is_ok_and(|mut d| d.next().is_some()) {
        bail!(
            "{} is not empty; the demo needs a new or empty directory",
            out.display()
        );
    }
    std::fs::create_dir_all(&out).with_context(|| format!("create {}", out.display()))?;
    Ok(out)
}

/// Prints what the hub will serve; returns each file's size.
fn describe(shape: &ReleaseShape, files: &[RepoFile]) -> anyhow::Result<Vec<(String, u64)>> {
    let sizes = files
        .iter()
        .map(|f| Ok((f.path.clone(), checkpoint::content_bytes(f)?.len() as u64)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    println!(
        "generated a qwen4_exp checkpoint in the released layout (ModelOpt NVFP4): {} files, \
         {} bytes; {} layers ({}), {} experts per layer, FP8 PLE table on decoder layer {} \
         in {} shards, vision and MTP partitions",
        sizes.len(),
        sizes.iter().map(|(_, s)| s).sum::<u64>(),
        shape.layers,
        (0..shape.layers)
            .map(|l| shape.layer_type(l))
            .collect::<Vec<_>>()
            .join(", "),
        shape.experts,
        shape.ple_layer,
        shape.ngram_parts
    );
    for (path, size) in &sizes {
        println!("  {size:>12}  {path}");
    }
    Ok(sizes)
}

/// `ftpipe run REPO` as a child process (this same binary).
fn spawn_run(endpoint: &str, out: &Path, stderr: Stdio) -> anyhow::Result<Child> {
    let exe = std::env::current_exe().context("locate the ftpipe binary")?;
    Command::new(exe)
        .args(["run", REPO, "--endpoint", endpoint])
        .args(["--checkpoint-secs", "0.2"])
        .args(["--ram-budget", &RAM_BUDGET.to_string()])
        .args(["--reserve", &RESERVE.to_string()])
        .arg("--out")
        .arg(out)
        .env_remove("HF_TOKEN")
        .stdout(Stdio::null())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .context("start ftpipe run")
}

fn part_len(out: &Path, path: &str) -> u64 {
    let part = out.join("source").join(format!("{path}.part"));
    std::fs::metadata(part).map(|m| m.len()).unwrap_or(0)
}

/// A shard of the text model holding experts: its path, length and the
/// length of its header (8 + N bytes).
#[derive(Clone)]
struct Shard {
    path: String,
    len: u64,
    header_len: u64,
}

/// The shards holding experts of `model.language_model` layers (each
/// feeds components of its own), largest first.
fn expert_shards(files: &[RepoFile]) -> anyhow::Result<Vec<Shard>> {
    let mut shards = Vec::new();
    for f in files.iter().filter(|f| f.path.ends_with(".safetensors")) {
        let bytes = checkpoint::content_bytes(f)?;
        let len = bytes.len() as u64;
        let n = SourceHeader::header_len(&f.path, &bytes, len)?;
        let json = bytes
            .get(8..)
            .and_then(|b| b.get(..usize::try_from(n).ok()?))
            .context("a truncated generated header")?;
        let header = SourceHeader::parse(&f.path, json, len)?;
        if header.tensors().iter().any(|t| {
            t.name().starts_with("model.language_model.") && t.name().contains(".mlp.experts.")
        }) {
            shards.push(Shard {
                path: f.path.clone(),
                len,
                header_len: n + 8,
            });
        }
    }
    shards.sort_by_key(|s| std::cmp::Reverse(s.len));
    Ok(shards)
}

/// Crash 1: SIGKILL while the largest expert shard and the next one are
/// held at half their length and every other file is published (so
/// exactly two transfers are cut; the pipelined run has converted what
/// the published shards feed).
async fn crash_download(
    hub: &FixtureHub,
    out: &Path,
    sizes: &[(String, u64)],
    victim: &Shard,
    held: &Shard,
) -> anyhow::Result<()> {
    // Several GETs: `run` first reads each shard's header over Range (too
    // short to reach the stall); the downloads themselves are held.
    for s in [victim, held] {
        let stall = Fault::Stall {
            after: s.len / 2,
            for_ms: STALL_MS,
        };
        hub.inject(FaultRule::new(&s.path, stall).times(8));
    }
    let mut child = spawn_run(&hub.endpoint(), out, Stdio::null())?;
    // Printed only (the kill goes through `child`).
    let pid = child.id().unwrap_or_default();
    let others_pending = || {
        sizes.iter().any(|(p, _)| {
            p != &victim.path && p != &held.path && !out.join("source").join(p).is_file()
        })
    };
    let halfway = |s: &Shard| part_len(out, &s.path) >= s.len / 2;
    let t0 = Instant::now();
    while !halfway(victim) || !halfway(held) || others_pending() {
        if t0.elapsed() > CHILD_TIMEOUT {
            child.kill().await?;
            bail!("the demo download did not reach the stall point in time");
        }
        if let Some(status) = child.try_wait()? {
            bail!("the demo run exited early with {status}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Let a checkpoint pass so part of the received prefix is durable.
    tokio::time::sleep(Duration::from_millis(500)).await;
    child.kill().await.context("kill the run")?;
    println!(
        "crash 1 (download): killed `ftpipe run` (pid {pid}) with SIGKILL at byte {} of \
         {} ({} bytes) and byte {} of {} ({} bytes); every other file was already \
         published",
        part_len(out, &victim.path),
        victim.path,
        victim.len,
        part_len(out, &held.path),
        held.path,
        held.len
    );
    hub.clear_faults();
    Ok(())
}

/// Crash 2: runs `ftpipe run` again (it resumes both downloads; the hub
/// holds `held` again past its header, so the artifact cannot be finished)
/// and SIGKILLs it as soon as it reports a weights component written and
/// durable (the tiny global scales come first and would show little),
/// while `manifest.json` does not exist yet. Returns whether the kill
/// landed during the conversion.
async fn crash_conversion(hub: &FixtureHub, out: &Path, held: &Shard) -> anyhow::Result<bool> {
    // The plan's header reads (8 bytes, then the header) stay under the
    // stall; the resumed body stops right after.
    let stall = Fault::Stall {
        after: held.header_len,
        for_ms: STALL_MS,
    };
    hub.inject(FaultRule::new(&held.path, stall).times(8));
    let converted = kill_during_conversion(&hub.endpoint(), out).await;
    hub.clear_faults();
    converted
}

async fn kill_during_conversion(endpoint: &str, out: &Path) -> anyhow::Result<bool> {
    let mut child = spawn_run(endpoint, out, Stdio::piped())?;
    // Printed only (the kill goes through `child`).
    let pid = child.id().unwrap_or_default();
    let stderr = child.stderr.take().context("child stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    let manifest = out.join("artifact").join(MANIFEST_FILE);
    let deadline = tokio::time::Instant::now() + CHILD_TIMEOUT;
    let mut log = Vec::new();
    let trigger = loop {
        tokio::select! {
            line = lines.next_line() => match line? {
                Some(l) if is_weights_durable(&l) && !manifest.exists() => {
                    child.start_kill().context("kill the run")?;
                    break Some(l);
                }
                Some(l) => log.push(l),
                None => break None,
            },
            _ = tokio::time::sleep_until(deadline) => {
                child.kill().await?;
                bail!("the demo conversion did not start in time");
            }
        }
    };
    let status = child.wait().await?;
    while let Some(l) = lines.next_line().await? {
        log.push(l);
    }
    let Some(trigger) = trigger else {
        if !status.success() {
            bail!("the demo run failed ({status}):\n{}", log.join("\n"));
        }
        println!(
            "crash 2 (conversion): NOT simulated: `ftpipe run` (pid {pid}) finished the \
             conversion before it could be killed"
        );
        return Ok(false);
    };
    // Printed only; `split` yields at least one item.
    let first = trigger.split(':').next().unwrap_or_default();
    println!(
        "crash 2 (conversion): killed `ftpipe run` (pid {pid}) with SIGKILL once {first} was \
         durable; manifest.json {}; {} temp file(s) of component writes in flight",
        if manifest.exists() {
            "existed"
        } else {
            "did not exist yet"
        },
        temp_files(&out.join("artifact"))
    );
    Ok(true)
}

/// A LogLines "<path>: <kind> written and durable (...)" line for anything
/// but a global scale.
fn is_weights_durable(line: &str) -> bool {
    line.contains(" written and durable (") && !line.contains(": q3_global_scale written")
}

/// Component temp files (`*.ftpipe-tmp`) under `dir`: the writes in flight.
fn temp_files(dir: &Path) -> usize {
    let entries = std::fs::read_dir(dir).into_iter().flatten().flatten();
    entries
        .map(|e| match e.path() {
            p if p.is_dir() => temp_files(&p),
            p => usize::from(p.to_string_lossy().ends_with(TEMP_SUFFIX)),
        })
        .sum()
}

/// Every open-ended ranged body request (`Range: bytes=N-`, a resume) the
/// hub answered, named by repo file.
fn print_resume_requests(hub: &FixtureHub) {
    let resumes: Vec<_> = hub
        .requests()
        .into_iter()
        .filter(|r| r.status != 302 && r.range.as_deref().is_some_and(|v| v.ends_with('-')))
        .collect();
    if resumes.is_empty() {
        println!("  no ranged resume request reached the hub");
    } else {
        println!("  before converting, it resumed the interrupted download:");
    }
    for r in &resumes {
        let file = r
            .query
            .as_deref()
            .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("path=")))
            .unwrap_or(&r.path);
        println!(
            "    resume request: {file} Range: {} If-Range: {} -> HTTP {}, {} body bytes",
            // Printed only: a request without Range shows nothing.
            r.range.as_deref().unwrap_or_default(),
            r.if_range.as_deref().unwrap_or("-"),
            r.status,
            r.body_bytes
        );
    }
}

fn fetch_params(endpoint: &str) -> FetchParams {
    FetchParams {
        endpoint: endpoint.to_owned(),
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
        hf_cache: None,
        offline: false,
        mirror: None,
        xet: true,
        reuse_from: None,
    }
}

fn convert_options() -> ConvertOptions {
    ConvertOptions {
        jobs: CONVERT_JOBS,
        retire_sources: false,
        rebuild: false,
        protect: vec![],
        recipe: None,
        ram_budget: RAM_BUDGET,
        reserve: RESERVE,
        preflight: true,
    }
}
