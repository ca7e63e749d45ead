//! `ftpipe demo`: filled in once the fixture hub lands.

use std::path::PathBuf;

pub async fn run(_out: Option<PathBuf>) -> anyhow::Result<bool> {
    anyhow::bail!("demo not wired yet")
}
