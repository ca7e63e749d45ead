//! `ftpipe fetch`, and the one place a fetch's [`FetchParams`] are built
//! (for `fetch`, `run` and the fetch `mirror` does first): the hub or the
//! mirror `--endpoint` names, the token, the Hugging Face cache, offline.

use std::path::{Path, PathBuf};

use anyhow::bail;
use clap::Args;
use clap::builder::RangedU64ValueParser;

use ftpipe_fetch::FetchOptions;
use ftpipe_hub::hfcache::HfCache;
use ftpipe_hub::resolve::ResolveRequest;
use ftpipe_hub::token::load_token;
use ftpipe_pipeline::{FetchParams, MirrorParams, Pipeline};

use super::args::{
    DEFAULT_FETCH_JOBS, HubArgs, ProgressArgs, ResumeArgs, TimingArgs, TransferArgs, fetch_options,
    heading,
};
use super::summary::{Jobs, Session, print_summary};
use crate::table;

/// `ftpipe fetch`'s flags; `run` takes them too.
#[derive(Args)]
pub struct FetchArgs {
    #[command(flatten)]
    pub hub: HubArgs,
    /// Only files matching these globs.
    #[arg(long, value_name = "GLOB", help_heading = heading::SELECTION)]
    pub include: Vec<String>,
    /// Skip files matching these globs.
    #[arg(long, value_name = "GLOB", help_heading = heading::SELECTION)]
    pub exclude: Vec<String>,
    /// Files transferred in parallel (1 to 64, default 4; at most
    /// --connections at once). For `run`: the default of both
    /// --fetch-jobs and --convert-jobs.
    #[arg(long, value_parser = RangedU64ValueParser::<usize>::new().range(1..=64), help_heading = heading::TRANSFER)]
    pub jobs: Option<usize>,
    #[command(flatten)]
    pub transfer: TransferArgs,
    #[command(flatten)]
    pub progress: ProgressArgs,
    /// Follow a moved branch instead of keeping the pin.
    #[arg(long, help_heading = heading::SELECTION)]
    pub repin: bool,
    #[command(flatten)]
    pub resume: ResumeArgs,
    #[command(flatten)]
    pub timing: TimingArgs,
    /// Skip the free-space check before starting.
    #[arg(long, help_heading = heading::TRANSFER)]
    pub no_preflight: bool,
    /// Fetch again the sources `convert --retire-sources` deleted.
    #[arg(long, help_heading = heading::SELECTION)]
    pub reacquire: bool,
    /// Another output directory of an earlier fetch (of this or another
    /// revision): Xet terms whose chunks its files hold are read from
    /// them, each chunk checked against its recorded hash, instead of
    /// fetched (its state database is only read, never locked).
    #[arg(long, value_name = "OTHER_DIR", help_heading = heading::TRANSFER)]
    pub reuse_from: Option<PathBuf>,
}

impl FetchArgs {
    /// The fetch these flags ask for, `jobs` files at once.
    pub async fn params(&self, jobs: usize) -> anyhow::Result<(FetchParams, Session)> {
        let options = fetch_options(
            jobs,
            &self.transfer,
            &self.resume,
            Some(&self.timing),
            !self.no_preflight,
        )?;
        let resolve =
            self.hub
                .resolve_request(self.repin, self.include.clone(), self.exclude.clone());
        let (mut params, session) =
            fetch_params(&self.hub, resolve, options, self.reacquire).await?;
        if let Some(other) = &self.reuse_from {
            // Only Xet terms are reused: without them the flag would do
            // nothing, silently.
            if params.mirror.is_some() {
                bail!(
                    "--reuse-from {} reuses Xet chunks of a hub's files; the endpoint is a mirror",
                    other.display()
                );
            }
            if !params.xet {
                bail!(
                    "--reuse-from {} reuses Xet chunks; Xet is off (--no-xet or HF_HUB_DISABLE_XET)",
                    other.display()
                );
            }
        }
        params.reuse_from.clone_from(&self.reuse_from);
        Ok((params, session))
    }
}

/// Runs a fetch and returns whether everything verified.
pub async fn run(args: FetchArgs) -> anyhow::Result<bool> {
    let jobs = args.jobs.unwrap_or(DEFAULT_FETCH_JOBS);
    let (params, session) = args.params(jobs).await?;
    fetch_into(&args.hub.out, params, &session, args.progress).await
}

/// Fetches into `out` and prints the audit table (or the JSON summary);
/// returns whether every source verified (a pending conversion is not a
/// fetch's failure).
pub async fn fetch_into(
    out: &Path,
    params: FetchParams,
    session: &Session,
    progress: ProgressArgs,
) -> anyhow::Result<bool> {
    let jobs = Jobs {
        fetch: Some(params.options.jobs),
        convert: None,
    };
    let pipeline = Pipeline::open(out, "fetch").await?;
    let rep = progress.reporter();
    let outcome = pipeline.fetch(params, rep.clone()).await;
    rep.finish();
    let outcome = outcome?;
    print_summary(progress, Some(session), jobs, &outcome, || {
        table::render(&outcome.audit)
    });
    Ok(outcome.audit.sources_ok)
}

/// The one builder of [`FetchParams`]: `resolve` from the hub or the
/// mirror `hub` names, with its token, cache and offline choice, and
/// `options`.
pub async fn fetch_params(
    hub: &HubArgs,
    resolve: ResolveRequest,
    options: FetchOptions,
    reacquire: bool,
) -> anyhow::Result<(FetchParams, Session)> {
    let mirror = mirror_of_endpoint(hub).await?;
    let (token, token_source) = load_token(hub.token_file.as_deref())?;
    let cache = hf_cache(hub)?;
    let offline = hub.offline || offline_env();
    let session = Session {
        token_source,
        hf_cache: cache.as_ref().map(|c| c.root.clone()),
        hf_cache_from: cache.as_ref().map(|c| c.from),
        offline,
    };
    let params = FetchParams {
        endpoint: hub.origin.endpoint.clone(),
        token,
        read_timeout: hub.stall.duration()?,
        resolve,
        options,
        reacquire,
        hf_cache: cache,
        offline,
        mirror,
        xet: !hub.no_xet && !xet_disabled_env(),
        reuse_from: None,
    };
    Ok((params, session))
}

/// The mirror in object storage `--endpoint` names when it is
/// `s3://BUCKET/PREFIX` (with the store's configuration), else `None`: a
/// hub URL (checked by [`ftpipe_pipeline::Endpoint::parse`], the one
/// reading of `--endpoint`), which `--s3-endpoint` does not apply to.
pub async fn mirror_of_endpoint(hub: &HubArgs) -> anyhow::Result<Option<MirrorParams>> {
    let endpoint = &hub.origin.endpoint;
    match ftpipe_pipeline::Endpoint::parse(endpoint)? {
        ftpipe_pipeline::Endpoint::Hub(_) if hub.s3.s3_endpoint.is_some() => bail!(
            "--s3-endpoint applies only to a mirror (--endpoint s3://BUCKET/PREFIX); the endpoint is {}",
            ftpipe_hub::client::mask_userinfo(endpoint)
        ),
        ftpipe_pipeline::Endpoint::Hub(_) => Ok(None),
        ftpipe_pipeline::Endpoint::Mirror(location) => Ok(Some(MirrorParams {
            location,
            config: hub.s3.config(hub.stall).await?,
        })),
    }
}

/// Non-empty environment variable.
fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// `HF_HUB_OFFLINE` as huggingface_hub reads it (1, on, yes, true).
pub fn offline_env() -> bool {
    env_var("HF_HUB_OFFLINE").is_some_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "on" | "yes" | "true"
        )
    })
}

/// `HF_HUB_DISABLE_XET` as huggingface_hub reads it (1, on, yes, true).
pub fn xet_disabled_env() -> bool {
    env_var("HF_HUB_DISABLE_XET").is_some_and(|v| {
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
