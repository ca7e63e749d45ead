//! The argument groups several commands share, each declared once and
//! flattened (`#[command(flatten)]`) where it applies: the repo and its
//! origin (`--revision`, `--endpoint`), the hub's access, object storage
//! (`--s3-endpoint`), the transfer tunables and the output mode; with the
//! one function that turns transfer flags into [`FetchOptions`] and the
//! parsers of their values.
//!
//! A command whose flag means the same thing in other words (`pull`'s
//! objects where `fetch` has files) keeps its own help text by overriding
//! it (`mut_arg`) on its own struct; the flag itself is declared here.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use clap::builder::RangedU64ValueParser;

use ftpipe_fetch::{CheckpointBytes, FetchOptions, IoMode};
use ftpipe_hub::resolve::ResolveRequest;
use ftpipe_progress::Reporter;

use crate::{report, size};

/// The headings `--help` groups options under (`run` has ~45).
pub mod heading {
    /// Where the repo comes from and how to reach it.
    pub const HUB: &str = "Hub and mirror";
    /// Which files.
    pub const SELECTION: &str = "Selection";
    /// How bytes are moved.
    pub const TRANSFER: &str = "Transfer";
    /// Retries, stalls and durable checkpoints.
    pub const RESUME: &str = "Retries, timeouts and checkpoints";
    /// The conversion.
    pub const CONVERSION: &str = "Conversion";
    /// Object storage.
    pub const S3: &str = "Object storage";
    /// OCI registries.
    pub const REGISTRY: &str = "OCI registry";
    /// What is printed.
    pub const OUTPUT: &str = "Output";
}

/// Files transferred in parallel when neither `--jobs` nor `--fetch-jobs`
/// says otherwise.
pub const DEFAULT_FETCH_JOBS: usize = 4;
/// Components converted in parallel when neither `--jobs` nor
/// `--convert-jobs` says otherwise: the same for `convert` and `run`.
pub const DEFAULT_CONVERT_JOBS: usize = 2;
/// Per-read stall timeout of a hub request, in seconds, unless
/// `--read-timeout` says otherwise.
pub const DEFAULT_READ_TIMEOUT_SECS: f64 = 30.0;

/// Which revision of a repo, read from which hub or mirror.
#[derive(Args, Clone)]
#[command(next_help_heading = heading::HUB)]
pub struct OriginArgs {
    /// The branch, tag or commit to pin.
    #[arg(long, default_value = "main", value_parser = parse_revision)]
    pub revision: String,
    /// Hub endpoint (else HF_ENDPOINT, else https://huggingface.co), or a
    /// mirror in object storage, s3://BUCKET/PREFIX (`ftpipe mirror`
    /// writes one).
    #[arg(
        long,
        env = "HF_ENDPOINT",
        hide_env_values = true,
        default_value = "https://huggingface.co"
    )]
    pub endpoint: String,
}

/// What names a repo on a hub and where its files go.
#[derive(Args)]
pub struct HubArgs {
    /// Repository id, e.g. `Qwen/Qwen4-Exp`.
    #[arg(value_parser = parse_repo_id)]
    pub repo: String,
    /// DIR: where the pin, the state, the sources and the artifact live.
    #[arg(long)]
    pub out: PathBuf,
    // Each field below a flattened group names its heading: a group's
    // heading carries over to the fields after it.
    #[command(flatten)]
    pub origin: OriginArgs,
    #[command(flatten)]
    pub s3: S3Args,
    /// Read the token from this file (else HF_TOKEN, else the file at
    /// HF_TOKEN_PATH, default $HF_HOME/token, as `hf auth login` leaves it).
    #[arg(long, help_heading = heading::HUB)]
    pub token_file: Option<PathBuf>,
    /// Take pinned files from this Hugging Face hub cache (default:
    /// HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub,
    /// when it exists).
    #[arg(long, value_name = "DIR", conflicts_with = "no_hf_cache", help_heading = heading::HUB)]
    pub hf_cache: Option<PathBuf>,
    /// Never look in a Hugging Face cache.
    #[arg(long, help_heading = heading::HUB)]
    pub no_hf_cache: bool,
    /// No network: work from DIR's durable state and the cache only
    /// (also HF_HUB_OFFLINE=1).
    #[arg(long, help_heading = heading::HUB)]
    pub offline: bool,
    /// Fetch files the hub keeps in Xet storage through `resolve` like any
    /// other, not by reconstruction from its CAS (also HF_HUB_DISABLE_XET=1).
    #[arg(long, help_heading = heading::HUB)]
    pub no_xet: bool,
    #[command(flatten)]
    pub stall: StallArgs,
}

/// The stall rule every source keeps (the hub, a mirror, object storage).
#[derive(Args, Clone, Copy)]
#[command(next_help_heading = heading::RESUME)]
pub struct StallArgs {
    /// No byte for this many seconds (waiting for an answer or inside its
    /// body) ends the attempt, which is then retried (0.1 to 3600).
    #[arg(long, default_value_t = DEFAULT_READ_TIMEOUT_SECS, value_parser = secs_in(0.1, 3600.0))]
    pub read_timeout: f64,
}

impl Default for StallArgs {
    fn default() -> Self {
        StallArgs {
            read_timeout: DEFAULT_READ_TIMEOUT_SECS,
        }
    }
}

impl StallArgs {
    /// `--read-timeout` as a duration.
    pub fn duration(self) -> anyhow::Result<Duration> {
        secs("--read-timeout", self.read_timeout)
    }
}

impl HubArgs {
    /// `repo` from `origin` into `out`, every other hub flag at its
    /// default: what `ftpipe fetch REPO --out DIR` with only those flags
    /// parses to.
    pub fn for_repo(
        repo: String,
        origin: OriginArgs,
        out: PathBuf,
        token_file: Option<PathBuf>,
    ) -> HubArgs {
        HubArgs {
            repo,
            origin,
            s3: S3Args { s3_endpoint: None },
            out,
            token_file,
            hf_cache: None,
            no_hf_cache: false,
            offline: false,
            no_xet: false,
            stall: StallArgs::default(),
        }
    }

    /// The pin to resolve: this repo at `--revision`, the files `include`
    /// and `exclude` select, a moved branch followed only with `repin`.
    pub fn resolve_request(
        &self,
        repin: bool,
        include: Vec<String>,
        exclude: Vec<String>,
    ) -> ResolveRequest {
        ResolveRequest {
            repo: self.repo.clone(),
            revision: self.origin.revision.clone(),
            repin,
            include,
            exclude,
        }
    }
}

/// Where the object store is and how to reach it.
#[derive(Args)]
#[command(next_help_heading = heading::S3)]
pub struct S3Args {
    /// S3-compatible endpoint URL (else AWS_ENDPOINT_URL_S3, else
    /// AWS_ENDPOINT_URL, else the profile's endpoint_url, else AWS). Plain
    /// http is accepted, with a warning unless the host is loopback.
    /// Credentials and region come from the AWS default chain: the
    /// environment, AWS_PROFILE in ~/.aws/credentials and ~/.aws/config
    /// (keys, credential_process, sso, role_arn), web identity
    /// (AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN), container credentials,
    /// the instance profile; the region else us-east-1.
    #[arg(long, value_name = "URL")]
    pub s3_endpoint: Option<String>,
}

impl S3Args {
    /// Credentials, region and endpoint the AWS way (every secret
    /// registered with the redaction point as it is read), with `stall`'s
    /// read timeout.
    pub async fn config(&self, stall: StallArgs) -> anyhow::Result<ftpipe_objstore::S3Config> {
        let config =
            ftpipe_objstore::S3Config::resolve(self.s3_endpoint.as_deref(), stall.duration()?)
                .await?;
        if let Some(w) = config.unencrypted_warning() {
            eprintln!("warning: {w}");
        }
        Ok(config)
    }
}

/// How files are split over connections and written (`fetch`, `run`,
/// `pull`).
#[derive(Args)]
#[command(next_help_heading = heading::TRANSFER)]
pub struct TransferArgs {
    /// HTTP requests in flight at once over all files (1 to 64): each file
    /// takes one, free ones split large files into ranges.
    #[arg(long, default_value_t = ftpipe_fetch::defaults::DEFAULT_CONNECTIONS, value_parser = RangedU64ValueParser::<usize>::new().range(1..=64))]
    pub connections: usize,
    /// Files at least this large may be fetched as several ranges (e.g. 256MiB).
    #[arg(long, default_value = "256MiB", value_parser = size::parse_size)]
    pub segment_threshold: u64,
    /// A range is never split below this size (e.g. 4MiB; at least 64KiB).
    #[arg(long, default_value = "4MiB", value_parser = size::parse_size)]
    pub min_range: u64,
    /// Ranges are claimed front to back in pieces of at least this size
    /// (e.g. 64MiB), so a split file's digest keeps up with its bytes.
    #[arg(long, default_value = "64MiB", value_parser = size::parse_size)]
    pub piece_size: u64,
    /// A file gets another connection only while its connections each
    /// deliver less than this per second (e.g. 128MiB, about 1 Gbit/s;
    /// 0: always): faster ones are limited by this machine, not the server.
    /// Once a file's connections were found slower, the later files from
    /// the same host are split from their start.
    #[arg(long, default_value = "128MiB", value_parser = size::parse_size)]
    pub split_below_rate: u64,
    /// Write downloaded files through the page cache. By default their
    /// whole blocks bypass it (O_DIRECT) where the volume allows and does
    /// not keep its files in memory (tmpfs): each byte is written once and
    /// hashed from memory, so caching it only costs a copy and evicts other
    /// data. `run --disk-budget` always writes through it: each shard it
    /// admits is read back at once, and the budget bounds what it holds.
    #[arg(long)]
    pub buffered_io: bool,
}

/// How often a transfer makes its progress durable, and how it retries a
/// transient failure (`fetch`, `run`, `pull`).
#[derive(Args)]
#[command(next_help_heading = heading::RESUME)]
pub struct ResumeArgs {
    /// Durable checkpoint interval in bytes of a file (at least 1;
    /// default: 1/256 of the file's size, between 4 MiB and 64 MiB, so a
    /// kill costs a large file at most about 0.4 % of its bytes).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub checkpoint_bytes: Option<u64>,
    /// Retries per file for transient failures (0 to 100).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub retries: u32,
    /// First retry delay in milliseconds (1 to 60000).
    #[arg(long, default_value_t = 250, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub retry_base_ms: u64,
}

/// The time rules of a transfer from a hub (`fetch`, `run`): the
/// checkpoint interval and when a slow body is a stall.
#[derive(Args)]
#[command(next_help_heading = heading::RESUME)]
pub struct TimingArgs {
    /// Durable checkpoint interval in seconds (0.01 to 3600).
    #[arg(long, default_value_t = 2.0, value_parser = secs_in(0.01, 3600.0))]
    pub checkpoint_secs: f64,
    /// Minimum body rate in bytes per second, averaged over --stall-secs;
    /// a slower transfer is a stall and retried (0: no rate rule).
    #[arg(long, default_value_t = ftpipe_fetch::defaults::DEFAULT_MIN_RATE)]
    pub min_rate: u64,
    /// Window of the --min-rate rule in seconds (0.1 to 3600).
    #[arg(
        long,
        default_value_t = ftpipe_fetch::defaults::DEFAULT_STALL_WINDOW.as_secs_f64(),
        value_parser = secs_in(0.1, 3600.0)
    )]
    pub stall_secs: f64,
}

/// The one place transfer flags become [`FetchOptions`]: `jobs` files at
/// once, the flags of `transfer`, `resume` and (a hub's) `timing`, every
/// other option at the library's default.
pub fn fetch_options(
    jobs: usize,
    transfer: &TransferArgs,
    resume: &ResumeArgs,
    timing: Option<&TimingArgs>,
    preflight: bool,
) -> anyhow::Result<FetchOptions> {
    let defaults = FetchOptions::default();
    let (checkpoint_interval, min_rate, stall_window) = match timing {
        Some(t) => (
            secs("--checkpoint-secs", t.checkpoint_secs)?,
            t.min_rate,
            secs("--stall-secs", t.stall_secs)?,
        ),
        None => (
            defaults.checkpoint_interval,
            defaults.min_rate,
            defaults.stall_window,
        ),
    };
    Ok(FetchOptions {
        jobs,
        connections: transfer.connections,
        segment_threshold: transfer.segment_threshold,
        min_range: transfer.min_range.max(ftpipe_fetch::WRITE_ALIGN),
        piece_size: transfer.piece_size.max(ftpipe_fetch::WRITE_ALIGN),
        split_below_rate: transfer.split_below_rate,
        checkpoint_bytes: resume
            .checkpoint_bytes
            .map_or(CheckpointBytes::ShareOfFile, CheckpointBytes::Fixed),
        checkpoint_interval,
        retries: resume.retries,
        retry_base: Duration::from_millis(resume.retry_base_ms),
        preflight,
        min_rate,
        stall_window,
        io_mode: if transfer.buffered_io {
            IoMode::Buffered
        } else {
            IoMode::Direct
        },
    })
}

/// What a long-running command prints while it works and when it is done.
#[derive(Args, Clone, Copy)]
#[command(next_help_heading = heading::OUTPUT)]
pub struct ProgressArgs {
    /// Print nothing on success (errors still go to stderr).
    #[arg(long)]
    pub quiet: bool,
    /// Newline-delimited JSON events and a JSON summary.
    #[arg(long)]
    pub json: bool,
}

impl ProgressArgs {
    /// The progress display these flags ask for: JSON lines, nothing,
    /// log lines when stderr is no terminal, else bars.
    pub fn reporter(self) -> Arc<dyn Reporter> {
        use std::io::IsTerminal;
        if self.json {
            Arc::new(report::JsonLines)
        } else if self.quiet {
            Arc::new(report::Silent)
        } else if !std::io::stderr().is_terminal() {
            Arc::new(report::LogLines::new())
        } else {
            report::Bars::live()
        }
    }
}

/// How `publish` and `mirror` upload and report.
#[derive(Args)]
pub struct UploadArgs {
    /// Part size of multipart uploads; smaller files go in one put (at
    /// least 64KiB; S3 itself needs 5MiB). Default: chosen per file, 8MiB
    /// up to a 32nd of the file (a power of two, at most 64MiB, more only
    /// past 10,000 parts), for S3 parts and a registry's chunks alike.
    #[arg(long, value_parser = size::parse_size, help_heading = heading::S3)]
    pub part_size: Option<u64>,
    /// Parts in flight at once (1 to 64). Default: chosen per file, 2 to 8
    /// within 256MiB of parts in memory. `publish` also sends at most this
    /// many files of one put at once (default: up to 8 within 256MiB).
    #[arg(long, value_parser = RangedU64ValueParser::<usize>::new().range(1..=64), help_heading = heading::S3)]
    pub concurrency: Option<usize>,
    /// Print nothing on success (errors still go to stderr).
    #[arg(long, help_heading = heading::OUTPUT)]
    pub quiet: bool,
    /// A JSON summary.
    #[arg(long, help_heading = heading::OUTPUT)]
    pub json: bool,
    #[command(flatten)]
    pub stall: StallArgs,
}

impl UploadArgs {
    /// Refuses a part size below what any store accepts.
    pub fn check(&self) -> anyhow::Result<()> {
        if let Some(p) = self.part_size
            && p < 64 * 1024
        {
            anyhow::bail!("--part-size {p}: at least 64KiB");
        }
        Ok(())
    }
}

/// A clap parser of seconds within `lo..=hi`; the error gives the range.
pub fn secs_in(lo: f64, hi: f64) -> impl Fn(&str) -> Result<f64, String> + Clone {
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
pub fn parse_repo_id(s: &str) -> Result<String, String> {
    ftpipe_hub::paths::validate_repo_id(s).map(|()| s.to_owned())
}

/// A revision with git's ref-name rules, checked at parse time.
pub fn parse_revision(s: &str) -> Result<String, String> {
    ftpipe_hub::paths::validate_revision(s).map(|()| s.to_owned())
}

/// `v` seconds as a duration; the error names the flag `what`.
pub fn secs(what: &str, v: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(v).with_context(|| format!("invalid {what}: {v}"))
}
