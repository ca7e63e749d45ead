//! `ftpipe mirror`: DIR's pinned, fully fetched sources to
//! s3://BUCKET/PREFIX; given a hub REPO instead of a DIR, it fetches the
//! repo first exactly as `ftpipe fetch REPO --out DIR` would.

use std::path::{Path, PathBuf};

use anyhow::bail;
use clap::{Arg, Args};

use ftpipe_fetch::FetchOptions;
use ftpipe_pipeline::Pipeline;

use super::args::{
    DEFAULT_FETCH_JOBS, HubArgs, OriginArgs, ProgressArgs, S3Args, UploadArgs, parse_repo_id,
};
use super::fetch::{fetch_into, fetch_params};
use super::summary::{S3Session, print_s3_summary, upload_counts};
use ftpipe_progress::human;

/// `ftpipe mirror`'s flags; `--revision`, `--endpoint` and `--token-file`
/// apply to a hub REPO only, and their help says so ([`for_a_repo`]).
#[derive(Args)]
#[command(mut_args(for_a_repo))]
pub struct MirrorArgs {
    /// What is mirrored: a DIR whose pinned sources (DIR/source) were
    /// fetched, or a hub REPO (with --out), fetched first as `ftpipe fetch`
    /// does and then mirrored from there.
    #[arg(value_name = "DIR|REPO")]
    pub source: String,
    /// Where: s3://BUCKET/PREFIX.
    #[arg(value_name = "S3_URL")]
    pub dest: String,
    /// With a REPO: the directory its sources are fetched into first.
    #[arg(long)]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub origin: OriginArgs,
    /// With a REPO: read the hub token from this file (else HF_TOKEN, else
    /// the file at HF_TOKEN_PATH or $HF_HOME/token).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    #[command(flatten)]
    pub s3: S3Args,
    #[command(flatten)]
    pub upload: UploadArgs,
}

/// The help of a shared hub flag as `mirror` has it: for a REPO only.
fn for_a_repo(arg: Arg) -> Arg {
    match arg.get_id().as_str() {
        "revision" => arg.help("With a REPO: the revision to pin"),
        "endpoint" => arg
            .help("With a REPO: the hub endpoint (else HF_ENDPOINT, else https://huggingface.co)"),
        _ => arg,
    }
}

/// Mirrors DIR/source.
pub async fn run(args: MirrorArgs) -> anyhow::Result<bool> {
    let location = ftpipe_objstore::S3Location::parse(&args.dest)?;
    args.upload.check()?;
    let config = args.s3.config(args.upload.stall).await?;
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
files            {}
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
                upload_counts(outcome.files, outcome.uploaded),
                human::bytes(outcome.bytes_sent)
            )
        },
    );
    Ok(true)
}

/// The directory `mirror` reads: SOURCE itself when it is a directory,
/// else SOURCE is a hub repo, fetched into `--out` first.
async fn mirror_source_dir(args: &MirrorArgs) -> anyhow::Result<PathBuf> {
    let is_dir = Path::new(&args.source).is_dir();
    match (&args.out, is_dir) {
        (None, true) => Ok(PathBuf::from(&args.source)),
        (Some(_), true) => bail!(
            "{}: a directory, mirrored from its DIR/source; --out applies only to a hub REPO",
            args.source
        ),
        (None, false) => bail!(
            "{}: not a directory; to mirror a hub repo give its id and --out DIR (its sources \
             are fetched there first)",
            args.source
        ),
        (Some(out), false) => {
            fetch_repo(args, out).await?;
            Ok(out.clone())
        }
    }
}

/// Fetches the hub repo SOURCE into `out` with `fetch`'s defaults, as
/// `ftpipe fetch REPO --out DIR` with mirror's `--revision`, `--endpoint`
/// and `--token-file` would (same pin, checks and state), quietly unless
/// mirror prints progress; refuses a fetch that did not end clean.
async fn fetch_repo(args: &MirrorArgs, out: &Path) -> anyhow::Result<()> {
    let repo = parse_repo_id(&args.source)
        .map_err(|e| anyhow::anyhow!("{}: not a directory, nor a repo id: {e}", args.source))?;
    let hub = HubArgs::for_repo(
        repo,
        args.origin.clone(),
        out.to_owned(),
        args.token_file.clone(),
    );
    let resolve = hub.resolve_request(false, Vec::new(), Vec::new());
    let options = FetchOptions {
        jobs: DEFAULT_FETCH_JOBS,
        ..FetchOptions::default()
    };
    let (params, session) = fetch_params(&hub, resolve, options, false).await?;
    let progress = ProgressArgs {
        quiet: args.upload.quiet || args.upload.json,
        json: false,
    };
    if !fetch_into(out, params, &session, progress).await? {
        bail!(
            "fetching {} into {} did not end clean (see above): nothing mirrored",
            args.source,
            out.display()
        );
    }
    Ok(())
}
