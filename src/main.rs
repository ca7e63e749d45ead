//! `ftpipe`: the command line. Thin on purpose: parse arguments, pick a
//! progress display, call the pipeline, print, and map errors to exit codes.

// Unit tests see every dev-dependency; the lint is for the library itself.
#![cfg_attr(test, allow(unused_crate_dependencies))]
// Unit tests build their inputs with plain `std::fs` calls (clippy.toml).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

/// Every print of the binary goes through [`output`] (the redaction
/// point): these shadow std's macros for the whole crate.
macro_rules! print {
    ($($arg:tt)*) => { $crate::output::stdout(&format!($($arg)*)) };
}
/// See [`print!`].
macro_rules! println {
    () => { $crate::output::stdout("\n") };
    ($($arg:tt)*) => { $crate::output::stdout(&format!("{}\n", format_args!($($arg)*))) };
}
/// See [`print!`].
macro_rules! eprintln {
    ($($arg:tt)*) => { $crate::output::stderr(&format!("{}\n", format_args!($($arg)*))) };
}

mod cli_docs;
mod demo;
mod output;
mod report;
mod size;
mod table;
mod verify_view;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::builder::RangedU64ValueParser;
use clap::{Args, Parser, Subcommand};

use ftpipe_artifact::ArtifactError;
use ftpipe_artifact::manifest::Partition;
use ftpipe_convert::{ConvertError, ConvertOptions};
use ftpipe_fetch::FetchError;
use ftpipe_fetch::{FetchOptions, IoMode};
use ftpipe_fs::{ErrorClass, FsError};
use ftpipe_hub::HubError;
use ftpipe_hub::hfcache::HfCache;
use ftpipe_hub::resolve::ResolveRequest;
use ftpipe_hub::token::{TokenSource, load_token};
use ftpipe_pipeline::{FetchParams, Pipeline, PipelineError};
use ftpipe_progress::Reporter;

/// Exit codes (also listed in the README).
mod exit {
    pub const FAILURE: u8 = 1;
    pub const LOCKED: u8 = 3;
    pub const AUDIT_FAILED: u8 = 4;
    pub const NO_SPACE: u8 = 5;
    pub const VERIFY_FAILED: u8 = 6;
    pub const INTERNAL: u8 = 7;
}

/// Files transferred in parallel when neither `--jobs` nor `--fetch-jobs`
/// says otherwise.
const DEFAULT_FETCH_JOBS: usize = 4;
/// Components converted in parallel when neither `--jobs` nor
/// `--convert-jobs` says otherwise: the same for `convert` and `run`.
const DEFAULT_CONVERT_JOBS: usize = 2;

/// `verify` found problems (already listed on stdout).
#[derive(Debug)]
struct VerifyFailed {
    problems: usize,
}

impl std::fmt::Display for VerifyFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "verification failed: {} problem(s)", self.problems)
    }
}

impl std::error::Error for VerifyFailed {}

#[derive(Parser)]
#[command(
    name = "ftpipe",
    version,
    about = "Resumable, verified acquisition of pinned model checkpoints"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Download a pinned repo into DIR/source with strict Range resume.
    Fetch(FetchArgs),
    /// Show the pin, stage states and byte counts of DIR.
    Status {
        #[arg(long)]
        out: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Reconcile the byte ledger against receipts and files on disk.
    Audit {
        #[arg(long)]
        out: PathBuf,
        /// Re-hash every source and component.
        #[arg(long)]
        deep: bool,
        #[arg(long)]
        json: bool,
        /// Also write a zstd-compressed evidence bundle (tar) to this file;
        /// it is refused if any entry holds the token (resolved as the
        /// fetching commands do, so `--token-file` here names the same file).
        #[arg(long, value_name = "FILE.tar.zst")]
        bundle: Option<PathBuf>,
        /// The token file the fetching commands were given, so the bundle
        /// guard knows that token too.
        #[arg(long, value_name = "FILE", requires = "bundle")]
        token_file: Option<PathBuf>,
    },
    /// Predict every output component's exact size before converting.
    Plan(PlanArgs),
    /// Convert DIR/source into the artifact in DIR/artifact (resumable).
    Convert(ConvertArgs),
    /// resolve → plan → fetch → convert → verify, each a durable stage.
    Run(RunArgs),
    /// Upload DIR's verified artifact to s3://BUCKET/PREFIX: components
    /// (resumable multipart uploads), each checked, then manifest.json,
    /// create-only.
    Publish(PublishArgs),
    /// Download the artifact published at s3://BUCKET/PREFIX into
    /// DIR/artifact with the fetch's resume and verification.
    Pull(PullArgs),
    /// Mirror DIR's pinned, fully fetched sources to s3://BUCKET/PREFIX
    /// (files, then listing.json), for `--endpoint s3://BUCKET/PREFIX`.
    Mirror(MirrorArgs),
    /// Show what an FTW v1, FTEXPERT1 or safetensors file holds (header only).
    Inspect {
        file: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Check an artifact directory on its own: no database, sources or network.
    Verify {
        /// The artifact directory (DIR/artifact, or a copy of it).
        dir: PathBuf,
        /// Also re-hash every component.
        #[arg(long)]
        deep: bool,
        #[arg(long)]
        json: bool,
    },
    /// Serve a generated checkpoint locally, run the whole pipeline with a crash
    /// during download and one during conversion, resume, verify and audit.
    Demo {
        /// Where to leave the result (default: a new temp dir).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Print the completion script of a shell.
    ///
    /// E.g. `ftpipe completions bash >
    /// ~/.local/share/bash-completion/completions/ftpipe`.
    Completions {
        /// The shell to complete for.
        shell: clap_complete::Shell,
    },
    /// Print the man page of ftpipe or of one command, or write them all.
    ///
    /// `ftpipe man fetch | man -l -` shows one page; `ftpipe man --dir DIR`
    /// writes ftpipe.1 and ftpipe-COMMAND.1 for every command.
    Man {
        /// The command whose page to print (default: ftpipe's own page).
        #[arg(value_name = "COMMAND", conflicts_with = "dir")]
        command: Option<String>,
        /// Write ftpipe.1 and ftpipe-COMMAND.1 for every command into DIR.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

/// What names a repo on a hub and where its files go.
#[derive(Args)]
struct HubArgs {
    /// Repository id, e.g. `Qwen/Qwen4-Exp`.
    #[arg(value_parser = parse_repo_id)]
    repo: String,
    #[arg(long, default_value = "main", value_parser = parse_revision)]
    revision: String,
    /// Hub endpoint (else HF_ENDPOINT, else https://huggingface.co), or a
    /// mirror in object storage, s3://BUCKET/PREFIX (`ftpipe mirror`
    /// writes one).
    #[arg(
        long,
        env = "HF_ENDPOINT",
        hide_env_values = true,
        default_value = "https://huggingface.co"
    )]
    endpoint: String,
    #[command(flatten)]
    s3: S3Args,
    #[arg(long)]
    out: PathBuf,
    /// Read the token from this file (else HF_TOKEN, else the file at
    /// HF_TOKEN_PATH, default $HF_HOME/token, as `hf auth login` leaves it).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Take pinned files from this Hugging Face hub cache (default:
    /// HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub,
    /// when it exists).
    #[arg(long, value_name = "DIR", conflicts_with = "no_hf_cache")]
    hf_cache: Option<PathBuf>,
    /// Never look in a Hugging Face cache.
    #[arg(long)]
    no_hf_cache: bool,
    /// No network: work from DIR's durable state and the cache only
    /// (also HF_HUB_OFFLINE=1).
    #[arg(long)]
    offline: bool,
    /// Per-read stall timeout in seconds (0.1 to 3600).
    #[arg(long, default_value_t = 30.0, value_parser = secs_in(0.1, 3600.0))]
    read_timeout: f64,
}

#[derive(Args)]
struct FetchArgs {
    #[command(flatten)]
    hub: HubArgs,
    /// Only files matching these globs.
    #[arg(long)]
    include: Vec<String>,
    /// Skip files matching these globs.
    #[arg(long)]
    exclude: Vec<String>,
    /// Files transferred in parallel (1 to 64, default 4; at most
    /// --connections at once). For `run`: the default of both
    /// --fetch-jobs and --convert-jobs.
    #[arg(long, value_parser = RangedU64ValueParser::<usize>::new().range(1..=64))]
    jobs: Option<usize>,
    /// HTTP requests in flight at once over all files (1 to 64): each file
    /// takes one, free ones split large files into ranges.
    #[arg(long, default_value_t = ftpipe_fetch::defaults::DEFAULT_CONNECTIONS, value_parser = RangedU64ValueParser::<usize>::new().range(1..=64))]
    connections: usize,
    /// Files at least this large may be fetched as several ranges (e.g. 256MiB).
    #[arg(long, default_value = "256MiB", value_parser = size::parse_size)]
    segment_threshold: u64,
    /// A range is never split below this size (e.g. 4MiB; at least 64KiB).
    #[arg(long, default_value = "4MiB", value_parser = size::parse_size)]
    min_range: u64,
    /// Ranges are claimed front to back in pieces of at least this size
    /// (e.g. 64MiB), so a split file's digest keeps up with its bytes.
    #[arg(long, default_value = "64MiB", value_parser = size::parse_size)]
    piece_size: u64,
    /// A file gets another connection only while its connections each
    /// deliver less than this per second (e.g. 128MiB, about 1 Gbit/s;
    /// 0: always): faster ones are limited by this machine, not the server.
    #[arg(long, default_value = "128MiB", value_parser = size::parse_size)]
    split_below_rate: u64,
    /// Write downloaded files through the page cache. By default their
    /// whole blocks bypass it (O_DIRECT) where the volume allows: each byte
    /// is written once and hashed from memory, so caching it only costs a
    /// copy and evicts other data.
    #[arg(long)]
    buffered_io: bool,
    /// Print nothing on success (errors still go to stderr).
    #[arg(long)]
    quiet: bool,
    /// Newline-delimited JSON events and a JSON summary.
    #[arg(long)]
    json: bool,
    /// Follow a moved branch instead of keeping the pin.
    #[arg(long)]
    repin: bool,
    /// Durable checkpoint interval in bytes (at least 1).
    #[arg(long, default_value_t = 64 * 1024 * 1024, value_parser = clap::value_parser!(u64).range(1..))]
    checkpoint_bytes: u64,
    /// Durable checkpoint interval in seconds (0.01 to 3600).
    #[arg(long, default_value_t = 2.0, value_parser = secs_in(0.01, 3600.0))]
    checkpoint_secs: f64,
    /// Retries per file for transient failures (0 to 100).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(0..=100))]
    retries: u32,
    /// First retry delay in milliseconds (1 to 60000).
    #[arg(long, default_value_t = 250, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    retry_base_ms: u64,
    /// Minimum body rate in bytes per second, averaged over --stall-secs;
    /// a slower transfer is a stall and retried (0: no rate rule).
    #[arg(long, default_value_t = ftpipe_fetch::defaults::DEFAULT_MIN_RATE)]
    min_rate: u64,
    /// Window of the --min-rate rule in seconds (0.1 to 3600).
    #[arg(
        long,
        default_value_t = ftpipe_fetch::defaults::DEFAULT_STALL_WINDOW.as_secs_f64(),
        value_parser = secs_in(0.1, 3600.0)
    )]
    stall_secs: f64,
    /// Skip the free-space check before starting.
    #[arg(long)]
    no_preflight: bool,
    /// Fetch again the sources `convert --retire-sources` deleted.
    #[arg(long)]
    reacquire: bool,
}

/// Conversion choices shared by `convert` and `run`.
#[derive(Args)]
struct ConvertTuning {
    /// Delete each source shard once every component reading it is durable.
    #[arg(long)]
    retire_sources: bool,
    /// Set a stale artifact aside (kept as evidence) and rebuild it.
    #[arg(long)]
    rebuild: bool,
    /// Also keep tensors matching this glob BF16 and mark them protected
    /// (repeatable; part of the converter identity).
    #[arg(long, value_name = "GLOB")]
    protect: Vec<String>,
    /// Convert with this declarative TOML recipe (glob → component, dtype
    /// policy) instead of a built-in profile.
    #[arg(long, value_name = "FILE.toml")]
    recipe: Option<PathBuf>,
    /// RAM budget for placing expert layers (e.g. 64GiB; default 0: all file tier).
    #[arg(long, default_value = "0", value_parser = size::parse_size)]
    ram_budget: u64,
    /// Part of the RAM budget kept free (e.g. 2GiB).
    #[arg(long, default_value = "0", value_parser = size::parse_size)]
    reserve: u64,
}

#[derive(Args)]
struct ConvertArgs {
    #[arg(long)]
    out: PathBuf,
    /// Components converted in parallel (1 to 64).
    #[arg(long, default_value_t = DEFAULT_CONVERT_JOBS, value_parser = RangedU64ValueParser::<usize>::new().range(1..=64))]
    jobs: usize,
    #[command(flatten)]
    tuning: ConvertTuning,
    /// Skip the free-space check before starting.
    #[arg(long)]
    no_preflight: bool,
    /// Print nothing on success (errors still go to stderr).
    #[arg(long)]
    quiet: bool,
    /// Newline-delimited JSON events and a JSON summary.
    #[arg(long)]
    json: bool,
}

/// Where the object store is and how to reach it.
#[derive(Args)]
struct S3Args {
    /// S3-compatible endpoint URL (else AWS_ENDPOINT_URL_S3, else
    /// AWS_ENDPOINT_URL, else the profile's endpoint_url, else AWS). Plain
    /// http only for a loopback host. Credentials come from
    /// AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, else
    /// AWS_PROFILE in ~/.aws/credentials and ~/.aws/config; the region from
    /// AWS_REGION, else the profile, else us-east-1.
    #[arg(long, value_name = "URL")]
    s3_endpoint: Option<String>,
}

#[derive(Args)]
struct PublishArgs {
    /// The directory whose verified artifact (DIR/artifact) is published.
    #[arg(value_name = "DIR")]
    dir: PathBuf,
    /// Where: s3://BUCKET/PREFIX.
    #[arg(value_name = "S3_URL")]
    dest: String,
    #[command(flatten)]
    s3: S3Args,
    #[command(flatten)]
    upload: UploadArgs,
}

/// How `publish` and `mirror` upload and report.
#[derive(Args)]
struct UploadArgs {
    /// Part size of multipart uploads; smaller files go in one put (at
    /// least 64KiB; S3 itself needs 5MiB).
    #[arg(long, default_value = "8MiB", value_parser = size::parse_size)]
    part_size: u64,
    /// Parts in flight at once (1 to 64).
    #[arg(long, default_value_t = ftpipe_pipeline::DEFAULT_UPLOAD_CONCURRENCY, value_parser = RangedU64ValueParser::<usize>::new().range(1..=64))]
    concurrency: usize,
    /// Print nothing on success (errors still go to stderr).
    #[arg(long)]
    quiet: bool,
    /// A JSON summary.
    #[arg(long)]
    json: bool,
}

impl UploadArgs {
    /// Refuses a part size below what any store accepts.
    fn check(&self) -> anyhow::Result<()> {
        if self.part_size < 64 * 1024 {
            bail!("--part-size {}: at least 64KiB", self.part_size);
        }
        Ok(())
    }
}

#[derive(Args)]
struct MirrorArgs {
    /// What is mirrored: a DIR whose pinned sources (DIR/source) were
    /// fetched, or a hub REPO (with --out), fetched first as `ftpipe fetch`
    /// does and then mirrored from there.
    #[arg(value_name = "DIR|REPO")]
    source: String,
    /// Where: s3://BUCKET/PREFIX.
    #[arg(value_name = "S3_URL")]
    dest: String,
    /// With a REPO: the directory its sources are fetched into first.
    #[arg(long)]
    out: Option<PathBuf>,
    /// With a REPO: the revision to pin.
    #[arg(long, default_value = "main", value_parser = parse_revision)]
    revision: String,
    /// With a REPO: the hub endpoint (else HF_ENDPOINT, else
    /// https://huggingface.co).
    #[arg(
        long,
        env = "HF_ENDPOINT",
        hide_env_values = true,
        default_value = "https://huggingface.co"
    )]
    endpoint: String,
    /// With a REPO: read the hub token from this file (else HF_TOKEN, else
    /// the file at HF_TOKEN_PATH or $HF_HOME/token).
    #[arg(long)]
    token_file: Option<PathBuf>,
    #[command(flatten)]
    s3: S3Args,
    #[command(flatten)]
    upload: UploadArgs,
}

#[derive(Args)]
struct PullArgs {
    /// Where the artifact is published: s3://BUCKET/PREFIX.
    #[arg(value_name = "S3_URL")]
    source: String,
    #[arg(long)]
    out: PathBuf,
    #[command(flatten)]
    s3: S3Args,
    /// Files transferred in parallel (1 to 64).
    #[arg(long, default_value_t = DEFAULT_FETCH_JOBS, value_parser = RangedU64ValueParser::<usize>::new().range(1..=64))]
    jobs: usize,
    /// Requests in flight at once over all files (1 to 64): free ones split
    /// large objects into ranges.
    #[arg(long, default_value_t = ftpipe_fetch::defaults::DEFAULT_CONNECTIONS, value_parser = RangedU64ValueParser::<usize>::new().range(1..=64))]
    connections: usize,
    /// Objects at least this large may be fetched as several ranges.
    #[arg(long, default_value = "256MiB", value_parser = size::parse_size)]
    segment_threshold: u64,
    /// A range is never split below this size (at least 64KiB).
    #[arg(long, default_value = "4MiB", value_parser = size::parse_size)]
    min_range: u64,
    /// Ranges are claimed front to back in pieces of at least this size.
    #[arg(long, default_value = "64MiB", value_parser = size::parse_size)]
    piece_size: u64,
    /// An object gets another connection only while its connections each
    /// deliver less than this per second (default 0: always, as every S3
    /// client reads a large object: a store serves each connection at a
    /// limited rate, and one that is near the limit made the split a coin
    /// toss that doubled the pull's time).
    #[arg(long, default_value = "0", value_parser = size::parse_size)]
    split_below_rate: u64,
    /// Durable checkpoint interval in bytes (at least 1).
    #[arg(long, default_value_t = 64 * 1024 * 1024, value_parser = clap::value_parser!(u64).range(1..))]
    checkpoint_bytes: u64,
    /// Retries per file for transient failures (0 to 100).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(0..=100))]
    retries: u32,
    /// First retry delay in milliseconds (1 to 60000).
    #[arg(long, default_value_t = 250, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    retry_base_ms: u64,
    /// Write through the page cache instead of O_DIRECT.
    #[arg(long)]
    buffered_io: bool,
    /// Skip the free-space check before starting.
    #[arg(long)]
    no_preflight: bool,
    /// Print nothing on success (errors still go to stderr).
    #[arg(long)]
    quiet: bool,
    /// Newline-delimited JSON events and a JSON summary.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    fetch: FetchArgs,
    /// Files the fetch stage transfers in parallel (1 to 64; default
    /// --jobs, else 4, as `fetch`).
    #[arg(long, value_parser = RangedU64ValueParser::<usize>::new().range(1..=64))]
    fetch_jobs: Option<usize>,
    /// Components the convert stage converts in parallel (1 to 64; default
    /// --jobs, else 2, as `convert`).
    #[arg(long, value_parser = RangedU64ValueParser::<usize>::new().range(1..=64))]
    convert_jobs: Option<usize>,
    #[command(flatten)]
    tuning: ConvertTuning,
    /// Build while downloading so that the source bytes on disk (config,
    /// index, every shard admitted and not yet deleted, a `.part` counted
    /// whole) never exceed SIZE (e.g. 120GB = 120·10^9 bytes, 100GiB =
    /// 100·2^30): each shard is converted as soon as it is verified and
    /// deleted once nothing unfinished needs it. A SIZE below the minimum
    /// `plan --remote --disk-budget` reports is refused before any shard
    /// is fetched.
    #[arg(long, value_name = "SIZE", value_parser = size::parse_size, conflicts_with = "reacquire")]
    disk_budget: Option<u64>,
}

impl RunArgs {
    /// `--fetch-jobs`, else `--jobs`, else the default of `fetch`.
    fn fetch_jobs(&self) -> usize {
        self.fetch_jobs
            .or(self.fetch.jobs)
            .unwrap_or(DEFAULT_FETCH_JOBS)
    }

    /// `--convert-jobs`, else `--jobs`, else the default of `convert`.
    fn convert_jobs(&self) -> usize {
        self.convert_jobs
            .or(self.fetch.jobs)
            .unwrap_or(DEFAULT_CONVERT_JOBS)
    }
}

/// How many files and components a command works on at once, reported in
/// the JSON summary.
#[derive(Debug, Clone, Copy, serde::Serialize)]
struct Jobs {
    #[serde(skip_serializing_if = "Option::is_none")]
    fetch: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    convert: Option<usize>,
}

#[derive(Args)]
struct PlanArgs {
    #[command(flatten)]
    hub: HubArgs,
    /// Read only the safetensors headers from the hub (HTTP Range), no weights.
    /// Without it, plan from the sources in DIR/source/.
    #[arg(long)]
    remote: bool,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// Plan with this declarative TOML recipe instead of a built-in profile.
    #[arg(long, value_name = "FILE.toml")]
    recipe: Option<PathBuf>,
    /// Plan for a fetch of only the files matching these globs (default:
    /// the selection DIR was pinned with).
    #[arg(long)]
    include: Vec<String>,
    /// Plan for a fetch that skips the files matching these globs.
    #[arg(long)]
    exclude: Vec<String>,
    /// Also schedule fetch, conversion and retirement so that the source
    /// bytes on disk never exceed SIZE (e.g. 380GB = 380·10^9 bytes,
    /// 100GiB = 100·2^30): prints the predicted peak disk against an
    /// unbudgeted run, and the minimum feasible budget (a smaller SIZE is
    /// refused, naming it).
    #[arg(long, value_name = "SIZE", value_parser = size::parse_size)]
    disk_budget: Option<u64>,
}

/// A clap parser of seconds within `lo..=hi`; the error gives the range.
fn secs_in(lo: f64, hi: f64) -> impl Fn(&str) -> Result<f64, String> + Clone {
    move |s: &str| {
        let v: f64 = s
            .trim()
            .parse()
            .map_err(|_| format!("{s:?} is not a number of seconds"))?;
        if (lo..=hi).contains(&v) {
            Ok(v)
        } else {
            Err(format!("must be between {lo} and {hi} seconds"))
        }
    }
}

/// A repository id with the hub's rules, checked at parse time.
fn parse_repo_id(s: &str) -> Result<String, String> {
    ftpipe_hub::paths::validate_repo_id(s).map(|()| s.to_owned())
}

/// A revision with git's ref-name rules, checked at parse time.
fn parse_revision(s: &str) -> Result<String, String> {
    ftpipe_hub::paths::validate_revision(s).map(|()| s.to_owned())
}

fn secs(what: &str, v: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(v).with_context(|| format!("invalid {what}: {v}"))
}

/// Non-empty environment variable.
fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// `HF_HUB_OFFLINE` as huggingface_hub reads it (1, on, yes, true).
fn offline_env() -> bool {
    env_var("HF_HUB_OFFLINE").is_some_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "on" | "yes" | "true"
        )
    })
}

/// The cache to take files from: `--hf-cache` (must exist), none with
/// `--no-hf-cache`, else huggingface_hub's default when it exists.
fn hf_cache(args: &HubArgs) -> anyhow::Result<Option<HfCache>> {
    if args.no_hf_cache {
        return Ok(None);
    }
    if let Some(dir) = &args.hf_cache {
        let c = HfCache::at(dir.clone());
        if !c.exists() {
            bail!("--hf-cache {}: not a directory", dir.display());
        }
        return Ok(Some(c));
    }
    Ok(HfCache::from_env().filter(HfCache::exists))
}

/// What a fetching command reports beside its outcome (never a token).
#[derive(Debug, Clone, serde::Serialize)]
struct Session {
    token_source: TokenSource,
    hf_cache: Option<PathBuf>,
    hf_cache_from: Option<&'static str>,
    offline: bool,
}

fn reporter(json: bool, quiet: bool) -> Arc<dyn Reporter> {
    use std::io::IsTerminal;
    if json {
        Arc::new(report::JsonLines)
    } else if quiet {
        Arc::new(report::Silent)
    } else if !std::io::stderr().is_terminal() {
        Arc::new(report::LogLines::new())
    } else {
        Arc::new(report::Bars::new())
    }
}

fn fetch_params(args: &FetchArgs, jobs: usize) -> anyhow::Result<(FetchParams, Session)> {
    if !args.hub.endpoint.starts_with("s3://") {
        ftpipe_hub::client::parse_endpoint(&args.hub.endpoint)?;
    }
    let (token, token_source) = load_token(args.hub.token_file.as_deref())?;
    let cache = hf_cache(&args.hub)?;
    let offline = args.hub.offline || offline_env();
    let session = Session {
        token_source,
        hf_cache: cache.as_ref().map(|c| c.root.clone()),
        hf_cache_from: cache.as_ref().map(|c| c.from),
        offline,
    };
    let params = FetchParams {
        endpoint: args.hub.endpoint.clone(),
        token,
        read_timeout: secs("--read-timeout", args.hub.read_timeout)?,
        resolve: ResolveRequest {
            repo: args.hub.repo.clone(),
            revision: args.hub.revision.clone(),
            repin: args.repin,
            include: args.include.clone(),
            exclude: args.exclude.clone(),
        },
        options: FetchOptions {
            jobs,
            connections: args.connections,
            segment_threshold: args.segment_threshold,
            min_range: args.min_range.max(ftpipe_fetch::WRITE_ALIGN),
            piece_size: args.piece_size.max(ftpipe_fetch::WRITE_ALIGN),
            split_below_rate: args.split_below_rate,
            checkpoint_bytes: args.checkpoint_bytes.max(1),
            checkpoint_interval: secs("--checkpoint-secs", args.checkpoint_secs)?,
            retries: args.retries,
            retry_base: Duration::from_millis(args.retry_base_ms),
            preflight: !args.no_preflight,
            min_rate: args.min_rate,
            stall_window: secs("--stall-secs", args.stall_secs)?,
            io_mode: if args.buffered_io {
                IoMode::Buffered
            } else {
                IoMode::Direct
            },
        },
        reacquire: args.reacquire,
        hf_cache: cache,
        offline,
        mirror: mirror_params(&args.hub)?,
    };
    Ok((params, session))
}

fn convert_options(
    t: &ConvertTuning,
    jobs: usize,
    preflight: bool,
) -> anyhow::Result<ConvertOptions> {
    let recipe = match &t.recipe {
        Some(p) => Some(ftpipe_convert::load_recipe(p)?),
        None => None,
    };
    Ok(ConvertOptions {
        recipe,
        jobs: jobs.max(1),
        retire_sources: t.retire_sources,
        rebuild: t.rebuild,
        protect: t.protect.clone(),
        ram_budget: t.ram_budget,
        reserve: t.reserve,
        preflight,
    })
}

/// Prints `outcome` as the final JSON summary line (with the session:
/// token source, cache, offline; and the jobs used), or as `text()`;
/// nothing when `quiet`.
fn print_summary<T: serde::Serialize>(
    json: bool,
    quiet: bool,
    session: Option<&Session>,
    jobs: Jobs,
    outcome: &T,
    text: impl FnOnce() -> String,
) {
    if quiet && !json {
        return;
    }
    if json {
        let mut v = serde_json::json!({ "event": "summary", "outcome": outcome, "jobs": jobs });
        if let (Some(s), Some(obj)) = (session, v.as_object_mut()) {
            obj.insert("session".into(), serde_json::json!(s));
        }
        println!("{v}");
    } else {
        print!("{}", text());
    }
}

/// Runs a fetch and returns whether everything verified.
async fn run_fetch(args: FetchArgs) -> anyhow::Result<bool> {
    let jobs = args.jobs.unwrap_or(DEFAULT_FETCH_JOBS);
    let (params, session) = fetch_params(&args, jobs)?;
    let pipeline = Pipeline::open(&args.hub.out, "fetch").await?;
    let rep = reporter(args.json, args.quiet);
    let outcome = pipeline.fetch(params, rep.clone()).await;
    rep.finish();
    let outcome = outcome?;
    let jobs = Jobs {
        fetch: Some(jobs),
        convert: None,
    };
    print_summary(
        args.json,
        args.quiet,
        Some(&session),
        jobs,
        &outcome,
        || table::render(&outcome.audit),
    );
    // fetch answers for the sources; a pending conversion is not its failure.
    Ok(outcome.audit.sources_ok)
}

/// The mirror `--endpoint s3://BUCKET/PREFIX` names, if it names one.
fn mirror_params(hub: &HubArgs) -> anyhow::Result<Option<ftpipe_pipeline::MirrorParams>> {
    if !hub.endpoint.starts_with("s3://") {
        if hub.s3.s3_endpoint.is_some() {
            bail!(
                "--s3-endpoint applies only to a mirror (--endpoint s3://BUCKET/PREFIX); the endpoint is {}",
                ftpipe_hub::client::mask_userinfo(&hub.endpoint)
            );
        }
        return Ok(None);
    }
    Ok(Some(ftpipe_pipeline::MirrorParams {
        location: ftpipe_objstore::S3Location::parse(&hub.endpoint)?,
        config: s3_config(&hub.s3)?,
    }))
}

/// Credentials, region and endpoint the AWS way (every secret registered
/// with the redaction point as it is read).
fn s3_config(args: &S3Args) -> anyhow::Result<ftpipe_objstore::S3Config> {
    Ok(ftpipe_objstore::S3Config::resolve(
        &ftpipe_objstore::Env::from_process(),
        args.s3_endpoint.as_deref(),
    )?)
}

/// What an object-store command reports beside its outcome (never a key).
#[derive(Debug, Clone, serde::Serialize)]
struct S3Session {
    endpoint: Option<String>,
    region: String,
    credentials_from: String,
}

impl S3Session {
    fn of(c: &ftpipe_objstore::S3Config) -> S3Session {
        S3Session {
            endpoint: c.endpoint.clone(),
            region: c.region.clone(),
            credentials_from: c.credentials_from.clone(),
        }
    }
}

/// Prints an object-store command's JSON summary, or `text()`.
fn print_s3_summary<T: serde::Serialize>(
    json: bool,
    quiet: bool,
    session: &S3Session,
    outcome: &T,
    text: impl FnOnce() -> String,
) {
    if json {
        let v = serde_json::json!({ "event": "summary", "outcome": outcome, "session": session });
        println!("{v}");
    } else if !quiet {
        print!("{}", text());
    }
}

/// Publishes DIR/artifact.
async fn run_publish(args: PublishArgs) -> anyhow::Result<bool> {
    let location = ftpipe_objstore::S3Location::parse(&args.dest)?;
    args.upload.check()?;
    // Nothing to publish is no reason to create DIR's state.
    let artifact = ftpipe_pipeline::Layout::new(&args.dir)
        .artifact()
        .to_owned();
    if !artifact.is_dir() {
        bail!(
            "{} does not exist: nothing to publish (`ftpipe run` or `ftpipe convert` makes it)",
            artifact.display()
        );
    }
    let config = s3_config(&args.s3)?;
    let session = S3Session::of(&config);
    let pipeline = Pipeline::open(&args.dir, "publish").await?;
    let outcome = pipeline
        .publish(&ftpipe_pipeline::PublishParams {
            location,
            config,
            part_size: args.upload.part_size,
            concurrency: args.upload.concurrency,
        })
        .await?;
    print_s3_summary(
        args.upload.json,
        args.upload.quiet,
        &session,
        &outcome,
        || {
            format!(
                "{}
fingerprint      {}
manifest sha256  {}
objects          {} ({} uploaded, {} already there)
bytes sent       {}
",
                if outcome.already_published {
                    format!("already published at {}", outcome.dest)
                } else {
                    format!("published at {}", outcome.dest)
                },
                outcome.fingerprint,
                outcome.manifest_sha256,
                outcome.objects,
                outcome.uploaded,
                outcome.reused,
                outcome.bytes_sent
            )
        },
    );
    Ok(true)
}

/// Mirrors DIR/source.
async fn run_mirror(args: MirrorArgs) -> anyhow::Result<bool> {
    let location = ftpipe_objstore::S3Location::parse(&args.dest)?;
    args.upload.check()?;
    let config = s3_config(&args.s3)?;
    let dir = mirror_source_dir(&args).await?;
    if !ftpipe_pipeline::Layout::new(&dir).db().is_file() {
        bail!(
            "{} holds no fetched sources: nothing to mirror (`ftpipe fetch` makes them)",
            dir.display()
        );
    }
    let session = S3Session::of(&config);
    let pipeline = Pipeline::open(&dir, "mirror").await?;
    let outcome = pipeline
        .mirror(
            &ftpipe_pipeline::MirrorParams { location, config },
            args.upload.part_size,
            args.upload.concurrency,
        )
        .await?;
    print_s3_summary(
        args.upload.json,
        args.upload.quiet,
        &session,
        &outcome,
        || {
            format!(
                "{} {}@{} at {}
files            {} ({} uploaded, {} already there)
bytes sent       {}
",
                if outcome.already_mirrored {
                    "already mirrored"
                } else {
                    "mirrored"
                },
                outcome.repo,
                outcome.commit,
                outcome.dest,
                outcome.files,
                outcome.uploaded,
                outcome.reused,
                outcome.bytes_sent
            )
        },
    );
    Ok(true)
}

/// The directory `mirror` reads: SOURCE itself when it is a directory,
/// else SOURCE is a hub repo, fetched into `--out` first exactly as
/// `ftpipe fetch REPO --out DIR` would (same pin, checks and state).
async fn mirror_source_dir(args: &MirrorArgs) -> anyhow::Result<PathBuf> {
    let is_dir = Path::new(&args.source).is_dir();
    let out = match (&args.out, is_dir) {
        (None, true) => return Ok(PathBuf::from(&args.source)),
        (Some(_), true) => bail!(
            "{}: a directory, mirrored from its DIR/source; --out applies only to a hub REPO",
            args.source
        ),
        (None, false) => bail!(
            "{}: not a directory; to mirror a hub repo give its id and --out DIR (its sources \
             are fetched there first)",
            args.source
        ),
        (Some(out), false) => out,
    };
    let mut argv: Vec<std::ffi::OsString> = ["ftpipe", "fetch", &args.source, "--revision"]
        .iter()
        .map(Into::into)
        .collect();
    argv.extend([
        args.revision.clone().into(),
        "--endpoint".into(),
        args.endpoint.clone().into(),
        "--out".into(),
        out.clone().into(),
    ]);
    if let Some(file) = &args.token_file {
        argv.extend(["--token-file".into(), file.clone().into()]);
    }
    if args.upload.quiet || args.upload.json {
        argv.push("--quiet".into());
    }
    let Command::Fetch(fetch) = Cli::try_parse_from(argv)?.command else {
        bail!("internal: the fetch before a mirror did not parse as `fetch`");
    };
    if !run_fetch(fetch).await? {
        bail!(
            "fetching {} into {} did not end clean (see above): nothing mirrored",
            args.source,
            out.display()
        );
    }
    Ok(out.clone())
}

/// Pulls a published artifact into DIR/artifact.
async fn run_pull(args: PullArgs) -> anyhow::Result<bool> {
    let location = ftpipe_objstore::S3Location::parse(&args.source)?;
    let config = s3_config(&args.s3)?;
    let session = S3Session::of(&config);
    let defaults = FetchOptions::default();
    let options = FetchOptions {
        jobs: args.jobs.min(args.connections),
        connections: args.connections,
        segment_threshold: args.segment_threshold,
        min_range: args.min_range.max(ftpipe_fetch::WRITE_ALIGN),
        piece_size: args.piece_size.max(ftpipe_fetch::WRITE_ALIGN),
        split_below_rate: args.split_below_rate,
        checkpoint_bytes: args.checkpoint_bytes.max(1),
        retries: args.retries,
        retry_base: Duration::from_millis(args.retry_base_ms),
        preflight: !args.no_preflight,
        io_mode: if args.buffered_io {
            IoMode::Buffered
        } else {
            IoMode::Direct
        },
        ..defaults
    };
    let pipeline = Pipeline::open(&args.out, "pull").await?;
    let rep = reporter(args.json, args.quiet);
    let outcome = pipeline
        .pull(
            &ftpipe_pipeline::PullParams {
                location,
                config,
                options,
            },
            rep.clone(),
        )
        .await;
    rep.finish();
    let outcome = outcome?;
    print_s3_summary(args.json, args.quiet, &session, &outcome, || {
        format!(
            "{} {}
fingerprint      {}
manifest sha256  {}
components       {} ({} bytes), verified in {}
",
            if outcome.already_pulled {
                "already pulled from"
            } else {
                "pulled from"
            },
            outcome.source,
            outcome.fingerprint,
            outcome.manifest_sha256,
            outcome.components,
            outcome.bytes,
            ftpipe_pipeline::Layout::new(&args.out).artifact().display()
        )
    });
    Ok(true)
}

/// Converts DIR/source into DIR/artifact.
async fn run_convert(args: ConvertArgs) -> anyhow::Result<bool> {
    let opts = convert_options(&args.tuning, args.jobs, !args.no_preflight)?;
    let pipeline = Pipeline::open(&args.out, "convert").await?;
    let rep = reporter(args.json, args.quiet);
    let outcome = pipeline.convert(&opts, rep.clone()).await;
    rep.finish();
    let outcome = outcome?;
    let jobs = Jobs {
        fetch: None,
        convert: Some(opts.jobs),
    };
    print_summary(args.json, args.quiet, None, jobs, &outcome, || {
        render_convert(&outcome)
    });
    Ok(true)
}

/// The whole chain; a finished run is a no-op that says so.
async fn run_all(args: RunArgs) -> anyhow::Result<bool> {
    let (params, session) = fetch_params(&args.fetch, args.fetch_jobs())?;
    let opts = convert_options(&args.tuning, args.convert_jobs(), !args.fetch.no_preflight)?;
    let jobs = Jobs {
        fetch: Some(params.options.jobs),
        convert: Some(opts.jobs),
    };
    let pipeline = Pipeline::open(&args.fetch.hub.out, "run").await?;
    let rep = reporter(args.fetch.json, args.fetch.quiet);
    let outcome = pipeline
        .run(params, opts, args.disk_budget, rep.clone())
        .await;
    rep.finish();
    let outcome = outcome?;
    print_summary(
        args.fetch.json,
        args.fetch.quiet,
        Some(&session),
        jobs,
        &outcome,
        || match &outcome.convert {
            Some(c) => render_convert(c),
            None => format!(
                "{}\nmanifest sha256  {}\n",
                outcome.summary, outcome.manifest_sha256
            ),
        },
    );
    Ok(true)
}

fn render_convert(o: &ftpipe_convert::ConvertOutcome) -> String {
    let mut out = String::new();
    if let Some(p) = &o.set_aside {
        out.push_str(&format!("stale artifact set aside as {}\n", p.display()));
    }
    out.push_str(&format!(
        "components       {} ({} written, {} reused)\n\
         bytes            {} (= predicted)\n\
         fingerprint      {}\n\
         manifest sha256  {}\n\
         placement        {} resident / {} file-tier expert layers, read queue depth {}\n",
        o.components,
        o.written,
        o.reused,
        o.total_bytes,
        o.fingerprint,
        o.manifest_sha256,
        o.placement.resident_layers.len(),
        o.placement.file_tier_layers.len(),
        o.placement.read_queue_depth
    ));
    if !o.retired.is_empty() {
        out.push_str(&format!("retired sources  {}\n", o.retired.join(", ")));
    }
    if o.omitted.0 > 0 {
        out.push_str(&format!(
            "omitted          {} source tensors, {} bytes (vision, mtp; listed in manifest.json)\n",
            o.omitted.0, o.omitted.1
        ));
    }
    if o.not_fetched.0 > 0 {
        out.push_str(&format!(
            "not fetched      {} omitted source tensors in files of {} bytes left out by --exclude (listed in manifest.json, \"fetched\": false)\n",
            o.not_fetched.0, o.not_fetched.1
        ));
    }
    out
}

/// Plans the conversion (remote: headers over HTTP Range at the pinned or
/// freshly resolved commit; local: DIR/source) and prints it.
async fn run_plan(args: PlanArgs) -> anyhow::Result<bool> {
    let source = if let (true, Some(m)) = (args.remote, mirror_params(&args.hub)?) {
        ftpipe_pipeline::PlanSource::Mirror(m)
    } else if args.remote {
        ftpipe_hub::client::parse_endpoint(&args.hub.endpoint)?;
        ftpipe_pipeline::PlanSource::Remote {
            endpoint: args.hub.endpoint.clone(),
            token: load_token(args.hub.token_file.as_deref())?.0,
            read_timeout: secs("--read-timeout", args.hub.read_timeout)?,
            offline: args.hub.offline || offline_env(),
        }
    } else {
        ftpipe_pipeline::PlanSource::Local
    };
    let opts = ftpipe_convert::PlanOptions {
        protect: Vec::new(),
        recipe: match &args.recipe {
            Some(p) => Some(ftpipe_convert::load_recipe(p)?),
            None => None,
        },
        selection: ftpipe_hub::resolve::FetchSelection::default(),
    };
    let globs = ftpipe_pipeline::SelectionGlobs {
        include: args.include.clone(),
        exclude: args.exclude.clone(),
    };
    let report = ftpipe_pipeline::plan(
        &args.hub.out,
        &args.hub.repo,
        &args.hub.revision,
        source,
        &globs,
        &opts,
        args.disk_budget,
    )
    .await?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", render_plan(&report.plan));
        if let Some(b) = &report.disk_budget {
            print!("{}", render_budget(b));
        }
    }
    Ok(true)
}

async fn run(cli: Cli) -> anyhow::Result<bool> {
    // Every subcommand registers the ambient token (`HF_TOKEN`,
    // `HF_TOKEN_PATH`, `$HF_HOME/token`) with the redaction point, so a
    // config, header or error echoing it is caught even by commands that
    // never send it (convert, status, verify, inspect). A source that cannot
    // be read is reported by the commands that do send the token.
    let _ambient = load_token(None);
    match cli.command {
        Command::Fetch(args) => run_fetch(args).await,
        Command::Status { out, json } => {
            let s = ftpipe_pipeline::status(&out).await?;
            if json {
                println!("{}", serde_json::to_string(&s)?);
            } else {
                print_status(&out, &s);
            }
            Ok(true)
        }
        Command::Audit {
            out,
            deep,
            json,
            bundle,
            token_file,
        } => {
            if bundle.is_some() {
                // Resolving registers the token with the redaction point,
                // which the bundle guard scans for.
                load_token(token_file.as_deref())?;
                // The object-store credentials too (publish and pull hold them).
                ftpipe_objstore::register_credentials_from_env();
            }
            let (a, b) = ftpipe_pipeline::audit_with_bundle(&out, deep, bundle.as_deref()).await?;
            if json {
                println!("{}", serde_json::to_string(&a)?);
            } else {
                print!("{}", table::render(&a));
            }
            if let Some(b) = b {
                eprintln!(
                    "evidence bundle: {} ({} entries, {} bytes)",
                    b.path.display(),
                    b.entries,
                    b.bytes
                );
            }
            Ok(a.ok)
        }
        Command::Plan(args) => run_plan(args).await,
        Command::Convert(args) => run_convert(args).await,
        Command::Run(args) => run_all(args).await,
        Command::Publish(args) => run_publish(args).await,
        Command::Pull(args) => run_pull(args).await,
        Command::Mirror(args) => run_mirror(args).await,
        Command::Inspect { file, json } => {
            let i = ftpipe_convert::inspect::inspect(&file)?;
            if json {
                println!("{}", serde_json::to_string(&i)?);
            } else {
                print!("{}", table::render_inspection(&i));
            }
            Ok(true)
        }
        Command::Verify { dir, deep, json } => {
            let r = tokio::task::block_in_place(|| {
                ftpipe_artifact::verify::verify_artifact(&dir, deep)
            })?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                print!("{}", verify_view::render(&r));
            }
            if !r.ok {
                return Err(VerifyFailed {
                    problems: r.failures.len(),
                }
                .into());
            }
            Ok(true)
        }
        Command::Demo { out } => demo::run(out).await,
        Command::Completions { shell } => cli_docs::print_completions(shell),
        Command::Man { command, dir } => cli_docs::man(command.as_deref(), dir.as_deref()),
    }
}

/// The plan as a fixed-width table: one line per component, then the total.
fn render_plan(plan: &ftpipe_convert::Plan) -> String {
    let mut out = format!(
        "profile {} (model_type {}), {} source files, {} bytes\n",
        plan.profile,
        plan.model_type,
        plan.sources.len(),
        plan.source_bytes
    );
    out.push_str(&format!(
        "{:<40} {:<16} {:>10} {:>16}\n",
        "component", "kind", "items", "bytes"
    ));
    for c in &plan.components {
        out.push_str(&format!(
            "{:<40} {:<16} {:>10} {:>16}\n",
            c.name,
            c.kind.as_str(),
            c.items,
            c.predicted_bytes
        ));
    }
    out.push_str(&format!(
        "{:<40} {:<16} {:>10} {:>16}\n",
        "total",
        "",
        plan.components.len(),
        plan.total_bytes
    ));
    let count = |p: Partition, fetched: bool| {
        plan.omitted
            .iter()
            .filter(|o| o.reason == p && o.fetched == fetched)
            .count()
    };
    let (n, bytes) = plan.omitted_totals();
    if n > 0 {
        out.push_str(&format!(
            "omitted: {n} source tensors, {bytes} bytes, not part of the text artifact (vision {}, mtp {}); still fetched and verified\n",
            count(Partition::Vision, true),
            count(Partition::Mtp, true)
        ));
    }
    let (n, bytes) = plan.not_fetched_totals();
    if n > 0 {
        out.push_str(&format!(
            "not fetched: {n} omitted source tensors (vision {}, mtp {}) in {} files of {bytes} bytes left out of the fetch:\n",
            count(Partition::Vision, false),
            count(Partition::Mtp, false),
            plan.excluded_sources.len()
        ));
        for s in &plan.excluded_sources {
            out.push_str(&format!(
                "  {} ({} tensors, {} bytes; {})\n",
                s.file, s.tensors, s.bytes, s.by
            ));
        }
    }
    out
}

/// The schedule under `--disk-budget`: predicted peak against today's,
/// and the minimum feasible budget.
fn render_budget(b: &ftpipe_convert::schedule::BudgetReport) -> String {
    use ftpipe_convert::schedule::shown;
    format!(
        "disk budget      {} ({} bytes); minimum feasible {} ({} bytes)\n\
         predicted peak   {} ({} bytes) of sources held + artifact written, {} of it sources\n\
         unbudgeted peak  {} ({} bytes): every source and the whole artifact\n\
         peak ratio       {:.3} (budgeted / unbudgeted)\n\
         schedule         {} PLE file(s) of {} first, held until the Q3 table is written; \
         every other file retired once converted (largest {})\n",
        shown(b.budget),
        b.budget,
        shown(b.minimum_budget),
        b.minimum_budget,
        shown(b.predicted_peak),
        b.predicted_peak,
        shown(b.predicted_peak_sources),
        shown(b.unbudgeted_peak),
        b.unbudgeted_peak,
        b.peak_ratio,
        b.ple_files,
        shown(b.ple_bytes),
        shown(b.largest_other_bytes),
    )
}

fn print_status(out: &Path, s: &ftpipe_pipeline::StatusReport) {
    println!("{}", out.display());
    match &s.pin {
        Some(p) => println!("pin          {} {} -> {}", p.repo, p.revision, p.commit),
        None => println!("pin          none"),
    }
    for (stage, state) in &s.stages {
        println!("stage        {stage:<10} {state:?}");
    }
    println!(
        "files        {} selected, {} published, {} partial",
        s.files, s.published, s.partial
    );
    println!(
        "bytes        {} durable of {} expected",
        s.durable_bytes, s.expected_bytes
    );
}

/// The error and its causes, `: `-separated, skipping a cause whose text
/// the message already ends with. The rule for the library errors: a
/// message ends with its cause's text (`{source}`), which stays the
/// `#[source]` for exit codes; so the line names the file/URL and the cause
/// once, and an anyhow context here gets its cause appended.
fn describe(err: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if out.ends_with(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// The class of one error of the chain when it is one of ftpipe's own
/// (the libraries' and the binary's [`VerifyFailed`]). A transparent
/// variant forwards its source, so a wrapped error never appears in the
/// chain by itself: the outer type's `class` answers for it.
fn class_of(cause: &(dyn std::error::Error + 'static)) -> Option<ErrorClass> {
    if let Some(e) = cause.downcast_ref::<PipelineError>() {
        return Some(e.class());
    }
    if let Some(e) = cause.downcast_ref::<FetchError>() {
        return Some(e.class());
    }
    if let Some(e) = cause.downcast_ref::<ConvertError>() {
        return Some(e.class());
    }
    if let Some(e) = cause.downcast_ref::<HubError>() {
        return Some(e.class());
    }
    if let Some(e) = cause.downcast_ref::<ArtifactError>() {
        return Some(e.class());
    }
    if let Some(e) = cause.downcast_ref::<FsError>() {
        return Some(e.class());
    }
    if let Some(e) = cause.downcast_ref::<ftpipe_objstore::ObjStoreError>() {
        return Some(e.class());
    }
    if cause.downcast_ref::<VerifyFailed>().is_some() {
        return Some(ErrorClass::Verification);
    }
    None
}

/// The class of a failure: the most severe that any error of its chain
/// says it is (a full disk anywhere, an io error with `ENOSPC` included,
/// is [`ErrorClass::NoSpace`]).
fn error_class(err: &anyhow::Error) -> ErrorClass {
    let root: &(dyn std::error::Error + 'static) = err.as_ref();
    ErrorClass::worst(
        err.chain()
            .filter_map(class_of)
            .chain([ErrorClass::of_chain(root)]),
    )
}

/// The exit code of each class: the one place they meet (README, Exit
/// codes). Code 4, an audit that is not clean, is no error and is not here.
fn class_exit_code(class: ErrorClass) -> u8 {
    match class {
        ErrorClass::Failure => exit::FAILURE,
        ErrorClass::Verification => exit::VERIFY_FAILED,
        ErrorClass::Locked => exit::LOCKED,
        ErrorClass::NoSpace => exit::NO_SPACE,
        ErrorClass::Internal => exit::INTERNAL,
    }
}

fn exit_code(err: &anyhow::Error) -> u8 {
    class_exit_code(error_class(err))
}

/// Threads the runtime may start beyond its workers when no conversion
/// runs: a worker entering `block_in_place` (file writes, fsync, hashing)
/// hands its core to one of these.
const SPARE_BLOCKING_THREADS: usize = 2;

/// The runtime's bound on blocking threads for `command`: the spare ones
/// plus one per parallel conversion (each a `spawn_blocking` task).
///
/// Each thread gets its own glibc malloc arena, so tokio's default of 512
/// let a fetch grow to ~86 threads and ~65 MB resident. A full pool cannot
/// deadlock: every blocking closure is finite file or CPU work that waits on
/// no async task, and a core whose hand-off thread has not started yet is
/// taken back by its own thread when the closure returns.
fn blocking_threads(command: &Command) -> usize {
    let conversions = match command {
        Command::Convert(args) => args.jobs,
        Command::Run(args) => args.convert_jobs(),
        Command::Demo { .. } => demo::CONVERT_JOBS,
        _ => 0,
    };
    SPARE_BLOCKING_THREADS + conversions
}

/// jemalloc keeps freed memory for reuse for a while (10 s) instead of
/// handing it back to the kernel at once. A fetch frees and reallocates
/// read buffers of hundreds of KiB all the time; with glibc's malloc every
/// new buffer cost fresh zeroed pages (69,000–445,000 page faults per
/// 4.3 GB loopback fetch; see docs/performance.md).
#[cfg(all(target_os = "linux", not(target_env = "musl")))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    output::install_panic_hook();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FTPIPE_LOG")
                .unwrap_or_else(|_| "error".into()),
        )
        .with_writer(output::LogWriter::default)
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(blocking_threads(&cli.command))
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ftpipe: cannot start the async runtime: {e}");
            return ExitCode::from(exit::FAILURE);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!(
                "ftpipe: the audit is not clean: a selected file is not published and verified, \
                 a component or the manifest does not match its receipts, or the ledger does not \
                 reconcile (see the problems above)"
            );
            ExitCode::from(exit::AUDIT_FAILED)
        }
        Err(e) => {
            eprintln!("ftpipe: {}", describe(&e));
            ExitCode::from(exit_code(&e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_parallel_conversion_keeps_a_blocking_thread() {
        let threads = |args: &[&str]| {
            let cli = Cli::try_parse_from(args).expect("valid command line");
            blocking_threads(&cli.command)
        };
        let fetch = threads(&["ftpipe", "fetch", "a/b", "--out", "d", "--jobs", "64"]);
        assert_eq!(fetch, SPARE_BLOCKING_THREADS);
        let convert = threads(&["ftpipe", "convert", "--out", "d", "--jobs", "64"]);
        assert_eq!(convert, SPARE_BLOCKING_THREADS + 64);
        let run = threads(&["ftpipe", "run", "a/b", "--out", "d", "--jobs", "3"]);
        assert_eq!(run, SPARE_BLOCKING_THREADS + 3);
        let run = threads(&["ftpipe", "run", "a/b", "--out", "d", "--convert-jobs", "5"]);
        assert_eq!(run, SPARE_BLOCKING_THREADS + 5);
    }

    #[test]
    fn exit_codes_follow_the_cause_not_the_command() {
        let verify = anyhow::Error::from(PipelineError::VerifyFailed {
            artifact: "a".into(),
            problems: vec!["model.ftw: sha256: differs".into()],
        });
        assert_eq!(exit_code(&verify), exit::VERIFY_FAILED);
        let full = std::io::Error::from(std::io::ErrorKind::StorageFull);
        let in_conversion =
            anyhow::Error::from(PipelineError::Convert(ConvertError::io("write", "x", full)));
        assert_eq!(exit_code(&in_conversion), exit::NO_SPACE);
        let other = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let denied = anyhow::Error::from(PipelineError::Fetch(FetchError::io("write", "x", other)));
        assert_eq!(exit_code(&denied), exit::FAILURE);
        let join = std::io::Error::other("task panicked");
        let task = FetchError::internal_from("conversion task", join);
        assert!(
            task.to_string().ends_with("conversion task: task panicked"),
            "{task}"
        );
        let in_pipeline = anyhow::Error::from(PipelineError::Fetch(task));
        assert_eq!(exit_code(&in_pipeline), exit::INTERNAL);
        assert_eq!(
            describe(&in_pipeline),
            "internal error (a bug, please report it): conversion task: task panicked",
            "the cause is printed once"
        );
        let invariant = ConvertError::internal("MoE layer 3 has no experts");
        let direct = anyhow::Error::from(invariant).context("convert");
        assert_eq!(exit_code(&direct), exit::INTERNAL);
        let input = anyhow::Error::from(HubError::InvalidInput {
            what: "glob",
            message: "x".into(),
        });
        assert_eq!(exit_code(&input), exit::FAILURE);
    }

    #[test]
    fn each_class_has_its_documented_exit_code() {
        assert_eq!(class_exit_code(ErrorClass::Failure), 1);
        assert_eq!(class_exit_code(ErrorClass::Locked), 3);
        assert_eq!(class_exit_code(ErrorClass::NoSpace), 5);
        assert_eq!(class_exit_code(ErrorClass::Verification), 6);
        assert_eq!(class_exit_code(ErrorClass::Internal), 7);
        let locked = anyhow::Error::from(PipelineError::Locked {
            lock: "d/.ftpipe/lock".into(),
            pid: "1".into(),
        });
        assert_eq!(exit_code(&locked), exit::LOCKED);
        let verify = anyhow::Error::from(VerifyFailed { problems: 2 }).context("verify");
        assert_eq!(exit_code(&verify), exit::VERIFY_FAILED);
        // A full disk in an error the libraries do not know.
        let full = std::io::Error::from(std::io::ErrorKind::StorageFull);
        let bare = anyhow::Error::from(full).context("write x");
        assert_eq!(exit_code(&bare), exit::NO_SPACE);
    }

    /// Regression: `Several` did not keep its inner error as `#[source]`,
    /// and the exit code looked at its first error only through a match
    /// that did not reach it, so two panicked fetch tasks exited 1 where one
    /// exited 7.
    #[test]
    fn two_panicked_fetch_tasks_exit_7_like_one() {
        let panicked = || FetchError::internal_from("fetch task", std::io::Error::other("panic"));
        let one = anyhow::Error::from(PipelineError::Fetch(panicked()));
        assert_eq!(exit_code(&one), exit::INTERNAL);
        let two = FetchError::several(2, vec![panicked(), panicked()]).expect("two errors");
        let two = anyhow::Error::from(PipelineError::Fetch(two));
        assert_eq!(exit_code(&two), exit::INTERNAL);
        assert_eq!(
            describe(&two),
            "2 of 2 files failed; the most severe: internal error (a bug, please report it): \
             fetch task: panic",
            "the cause is printed once"
        );
        // A full disk beside a network failure: the full disk decides.
        let stalled = FetchError::Stalled {
            path: "a".into(),
            received: 0,
            window_secs: 1.0,
            min_rate: 1,
        };
        let full = FetchError::io("write", "b.part", std::io::ErrorKind::StorageFull.into());
        let retried = FetchError::RetriesExhausted {
            path: "b".into(),
            attempts: 3,
            last: Box::new(full),
        };
        let mixed = FetchError::several(3, vec![stalled, retried]).expect("two errors");
        assert_eq!(exit_code(&anyhow::Error::from(mixed)), exit::NO_SPACE);
    }
}
