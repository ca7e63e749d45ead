//! `ftpipe publish`: DIR's verified artifact to s3://BUCKET/PREFIX.

use std::path::PathBuf;

use anyhow::bail;
use clap::Args;

use ftpipe_pipeline::Pipeline;

use super::args::{S3Args, UploadArgs};
use super::summary::{S3Session, print_s3_summary};

/// `ftpipe publish`'s flags.
#[derive(Args)]
pub struct PublishArgs {
    /// The directory whose verified artifact (DIR/artifact) is published.
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// Where: s3://BUCKET/PREFIX.
    #[arg(value_name = "S3_URL")]
    pub dest: String,
    #[command(flatten)]
    pub s3: S3Args,
    #[command(flatten)]
    pub upload: UploadArgs,
}

/// Publishes DIR/artifact.
pub async fn run(args: PublishArgs) -> anyhow::Result<bool> {
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
    let config = args.s3.config(args.upload.stall).await?;
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
objects          {} ({} uploaded, {} already there, proven by the store's checksum)
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
