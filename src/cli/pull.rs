//! `ftpipe pull`: the artifact published at s3://BUCKET/PREFIX into
//! DIR/artifact, with the fetch's transfer flags (in the words of objects)
//! and its resume and verification.

use std::path::PathBuf;

use clap::builder::RangedU64ValueParser;
use clap::{Arg, Args};

use ftpipe_pipeline::Pipeline;

use super::args::{
    DEFAULT_FETCH_JOBS, ProgressArgs, ResumeArgs, S3Args, StallArgs, TransferArgs, fetch_options,
    heading,
};
use super::registry::{RegistryArgs, RegistrySession, print_registry_summary};
use super::summary::{S3Session, print_s3_summary};

/// `ftpipe pull`'s flags. The transfer flags are `fetch`'s; their help
/// speaks of objects ([`in_pull_words`]).
#[derive(Args)]
#[command(mut_args(in_pull_words))]
pub struct PullArgs {
    /// Where the artifact is published: s3://BUCKET/PREFIX, or
    /// oci://REGISTRY/REPOSITORY:TAG or @sha256:HEX (a ModelPack artifact;
    /// a tag is pinned to the manifest digest it names).
    #[arg(value_name = "SOURCE")]
    pub source: String,
    /// DIR: the artifact is pulled into DIR/artifact.
    #[arg(long)]
    pub out: PathBuf,
    #[command(flatten)]
    pub s3: S3Args,
    #[command(flatten)]
    pub registry: RegistryArgs,
    /// When the oci:// tag names another manifest than the one DIR pinned,
    /// start over from the new one (refused otherwise).
    #[arg(long, help_heading = heading::REGISTRY)]
    pub repin: bool,
    #[command(flatten)]
    pub stall: StallArgs,
    /// Files transferred in parallel (1 to 64).
    #[arg(long, default_value_t = DEFAULT_FETCH_JOBS, value_parser = RangedU64ValueParser::<usize>::new().range(1..=64), help_heading = heading::TRANSFER)]
    pub jobs: usize,
    #[command(flatten)]
    pub transfer: TransferArgs,
    #[command(flatten)]
    pub resume: ResumeArgs,
    /// Skip the free-space check before starting.
    #[arg(long, help_heading = heading::TRANSFER)]
    pub no_preflight: bool,
    #[command(flatten)]
    pub progress: ProgressArgs,
}

/// A transfer flag as `pull` describes it: the help of `fetch`'s flags in
/// the words of objects, and no rate that holds a split back (default 0:
/// every S3 client reads a large object over several connections).
/// Every other flag as it is.
fn in_pull_words(arg: Arg) -> Arg {
    match arg.get_id().as_str() {
        "connections" => arg.help(
            "Requests in flight at once over all files (1 to 64): free ones split large objects \
             into ranges",
        ),
        "segment_threshold" => {
            arg.help("Objects at least this large may be fetched as several ranges")
        }
        "min_range" => arg.help("A range is never split below this size (at least 64KiB)"),
        "piece_size" => {
            arg.help("Ranges are claimed front to back in pieces of at least this size")
        }
        "split_below_rate" => arg.default_value("0").help(
            "An object gets another connection only while its connections each deliver less \
             than this per second (default 0: always, as every S3 client reads a large object: \
             a store serves each connection at a limited rate, and one that is near the limit \
             made the split a coin toss that doubled the pull's time)",
        ),
        "buffered_io" => arg.help("Write through the page cache instead of O_DIRECT"),
        _ => arg,
    }
}

/// Pulls a published artifact into DIR/artifact.
pub async fn run(args: PullArgs) -> anyhow::Result<bool> {
    if args.source.starts_with(ftpipe_objstore::OCI_SCHEME) {
        return run_oci(args).await;
    }
    let location = ftpipe_objstore::S3Location::parse(&args.source)?;
    let config = args.s3.config(args.stall).await?;
    let session = S3Session::of(&config);
    let options = fetch_options(
        args.jobs.min(args.transfer.connections),
        &args.transfer,
        &args.resume,
        None,
        !args.no_preflight,
    )?;
    let pipeline = Pipeline::open(&args.out, "pull").await?;
    let rep = args.progress.reporter();
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
    let ProgressArgs { quiet, json } = args.progress;
    print_s3_summary(json, quiet, &session, &outcome, || {
        pulled_text(&outcome, &args.out)
    });
    Ok(true)
}

/// The text summary of a pull.
fn pulled_text(outcome: &ftpipe_pipeline::PullOutcome, out: &std::path::Path) -> String {
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
        ftpipe_pipeline::Layout::new(out).artifact().display()
    )
}

/// Pulls a ModelPack artifact from a registry into DIR/artifact.
async fn run_oci(args: PullArgs) -> anyhow::Result<bool> {
    let reference = ftpipe_objstore::OciReference::parse(&args.source)?;
    let config = args.registry.config(&reference, args.stall).await?;
    let session = RegistrySession::of(&reference, &config);
    let options = fetch_options(
        args.jobs.min(args.transfer.connections),
        &args.transfer,
        &args.resume,
        None,
        !args.no_preflight,
    )?;
    let pipeline = Pipeline::open(&args.out, "pull").await?;
    let rep = args.progress.reporter();
    let params = ftpipe_pipeline::OciPullParams {
        reference,
        config,
        options,
        repin: args.repin,
    };
    let outcome = pipeline.pull_oci(&params, rep.clone()).await;
    rep.finish();
    let outcome = outcome?;
    let ProgressArgs { quiet, json } = args.progress;
    print_registry_summary(json, quiet, &session, &outcome, || {
        pulled_text(&outcome, &args.out)
    });
    Ok(true)
}
