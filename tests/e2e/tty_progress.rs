//! The progress display in a real terminal: `ftpipe fetch` and `ftpipe run`
//! inside a tmux pane (its own server socket), the pane captured every
//! 100 ms.
//!
//! Checks: a total bar and per-file bars for files in flight; bytes
//! already durable count as done from the first frame (a resumed download
//! starts where it is) while the rate counts only bytes received by this
//! process; no bar above 100 %; once the command ends the bars are gone and
//! the final lines are readable. Skipped locally without tmux; a failure
//! under `CI`.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;
use ftpipe_fixtures::{Fault, FaultRule, RepoFile, RunningHub};

/// Trickle: 16 KiB every 50 ms per file (320 KiB/s).
pub(crate) const TRICKLE: Fault = Fault::Trickle {
    bytes: 16 << 10,
    every_ms: 50,
};

pub(crate) fn tmux_available() -> bool {
    Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A tmux server of our own (`-L`), killed on drop.
pub(crate) struct Tmux {
    socket: String,
}

impl Tmux {
    /// Sends `keys` to the pane as typed (`C-c`: Ctrl-C).
    pub(crate) fn send_keys(&self, keys: &str) {
        let st = Command::new("tmux")
            .args(["-L", &self.socket, "send-keys", "-t", "t", keys])
            .status()
            .unwrap();
        assert!(st.success(), "tmux send-keys failed");
    }

    pub(crate) fn start(name: &str, shell_cmd: &str) -> Tmux {
        let socket = format!("ftpipe-tty-{}-{name}", std::process::id());
        let st = Command::new("tmux")
            .args([
                "-L",
                &socket,
                "new-session",
                "-d",
                "-x",
                "160",
                "-y",
                "50",
                "-s",
                "t",
            ])
            .arg(format!("{shell_cmd}; echo FTPIPE_EXIT=$?; sleep 600"))
            .status()
            .unwrap();
        assert!(st.success(), "tmux new-session failed");
        Tmux { socket }
    }

    pub(crate) fn capture(&self) -> String {
        let o = Command::new("tmux")
            .args(["-L", &self.socket, "capture-pane", "-p", "-t", "t"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Frames until the command printed its exit status (at most `limit`).
    pub(crate) fn frames_until_exit(&self, limit: Duration) -> Vec<String> {
        let deadline = Instant::now() + limit;
        let mut frames = Vec::new();
        loop {
            let f = self.capture();
            let done = f.contains("FTPIPE_EXIT=");
            frames.push(f);
            if done {
                return frames;
            }
            assert!(
                Instant::now() < deadline,
                "no exit within {limit:?}: {:?}",
                frames.last()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .status();
    }
}

/// The shell command running ftpipe with the hermetic environment of
/// `common::ftpipe` (the pane's shell does not inherit `Command` settings).
pub(crate) fn shell(args: &[&str]) -> String {
    let mut s = format!(
        "env -u HF_TOKEN -u HF_ENDPOINT -u HF_HUB_CACHE -u HF_TOKEN_PATH -u HF_HUB_OFFLINE HF_HOME={NO_HF_HOME} {}",
        env!("CARGO_BIN_EXE_ftpipe")
    );
    for a in args {
        s.push(' ');
        s.push_str(a);
    }
    s
}

/// One bar line: the percentage and, for the total, the rate in bytes/s.
pub(crate) struct Bar {
    pub(crate) total: bool,
    pub(crate) percent: u32,
    pub(crate) rate: Option<f64>,
}

fn parse_bytes(num: &str, unit: &str) -> f64 {
    let v: f64 = num.parse().unwrap_or_else(|_| panic!("rate {num:?}"));
    let mul = match unit {
        "B" => 1.0,
        // The rate is written by the one formatter of sizes (decimal).
        "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        other => panic!("unit {other:?}"),
    };
    v * mul
}

pub(crate) fn bars(frame: &str) -> Vec<Bar> {
    let mut out = Vec::new();
    for line in frame.lines() {
        let Some(close) = line.find("] ") else {
            continue;
        };
        if !line.contains(" [") {
            continue;
        }
        let rest = &line[close + 2..];
        let Some(pct) = rest
            .split_whitespace()
            .next()
            .and_then(|t| t.strip_suffix('%'))
        else {
            continue;
        };
        let Ok(percent) = pct.parse::<u32>() else {
            continue;
        };
        let total = line.trim_start().starts_with("total [");
        let words: Vec<&str> = rest.split_whitespace().collect();
        let rate = words
            .iter()
            .position(|w| w.ends_with("/s"))
            .filter(|&i| i > 0)
            .map(|i| parse_bytes(words[i - 1], words[i].trim_end_matches("/s")));
        out.push(Bar {
            total,
            percent,
            rate,
        });
    }
    out
}

fn slow_hub(seed: u64, bytes: u64) -> (RunningHub, Vec<RepoFile>) {
    let (hub, files) = hub_with_repo(seed, bytes);
    for f in files.iter().filter(|f| f.path.ends_with(".safetensors")) {
        hub.inject(FaultRule::new(f.path.clone(), TRICKLE).times(1000));
    }
    (hub, files)
}

pub(crate) fn durable_bytes(out: &Path) -> u64 {
    try_ledger_snapshot(out)
        .unwrap_or_default()
        .iter()
        .map(|r| r.committed)
        .sum()
}

#[test]
fn fetch_bars_resume_where_they_are_and_clear_for_the_final_lines() {
    if !tmux_available() {
        skip_unless_ci("tmux not installed");
        return;
    }
    let (hub, files) = slow_hub(51, 12 << 20);
    let total: u64 = files.iter().map(content_len).sum();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let args = [
        "fetch",
        REPO,
        "--endpoint",
        &hub.endpoint(),
        "--out",
        out.to_str().unwrap(),
        "--min-rate",
        "0",
        "--checkpoint-bytes",
        "262144",
        "--checkpoint-secs",
        "0.2",
    ];
    // A first run, killed once 3 MiB are durable.
    let mut first = ftpipe()
        .args(args)
        .arg("--quiet")
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while durable_bytes(&out) < 3 << 20 {
        assert!(Instant::now() < deadline, "first run made no progress");
        std::thread::sleep(Duration::from_millis(50));
    }
    first.kill().unwrap();
    first.wait().unwrap();
    let durable = durable_bytes(&out);
    let floor = u32::try_from(durable * 100 / total).unwrap();
    let tmux = Tmux::start("fetch", &shell(&args));
    let frames = tmux.frames_until_exit(Duration::from_secs(120));
    let last = frames.last().unwrap();
    assert!(last.contains("FTPIPE_EXIT=0"), "{last}");
    let mut saw_total = false;
    let mut saw_file = false;
    for f in &frames[..frames.len() - 1] {
        for b in bars(f) {
            assert!(b.percent <= 100, "bar above 100 %:\n{f}");
            if b.total {
                // Durable bytes are done from the start.
                assert!(
                    b.percent >= floor,
                    "total at {} % < durable {floor} %:\n{f}",
                    b.percent
                );
                // The rate is this process's network bytes only: three
                // trickled files are under 1 MiB/s; counting the 3 MiB
                // already durable would show several MiB/s at first.
                if let Some(rate) = b.rate {
                    assert!(
                        rate < 1.5 * 1024.0 * 1024.0,
                        "rate {rate} B/s counts durable bytes:\n{f}"
                    );
                }
                saw_total = true;
            } else {
                saw_file = true;
            }
        }
    }
    assert!(
        saw_total && saw_file,
        "no total or file bar seen in {} frames",
        frames.len()
    );
    // Bars cleared; the audit table is readable.
    assert!(bars(last).is_empty(), "bars left:\n{last}");
    assert!(last.contains("files (verified/selected)"), "{last}");
    assert_files_match(&out, &files);
}

#[test]
fn run_shows_bars_then_its_summary() {
    if !tmux_available() {
        skip_unless_ci("tmux not installed");
        return;
    }
    let hub = qwen4_hub(52, ftpipe_fixtures::qwen4::QwenShape::small_test());
    for f in hub.handle().listing(REPO, "main").unwrap() {
        if f.path.ends_with(".safetensors") {
            hub.inject(FaultRule::new(f.path.clone(), TRICKLE).times(1000));
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let args = [
        "run",
        REPO,
        "--endpoint",
        &hub.endpoint(),
        "--out",
        out.to_str().unwrap(),
        "--min-rate",
        "0",
    ];
    let tmux = Tmux::start("run", &shell(&args));
    let frames = tmux.frames_until_exit(Duration::from_secs(180));
    let last = frames.last().unwrap();
    assert!(last.contains("FTPIPE_EXIT=0"), "{last}");
    let mut saw = false;
    for f in &frames[..frames.len() - 1] {
        for b in bars(f) {
            assert!(b.percent <= 100, "bar above 100 %:\n{f}");
            saw = true;
        }
    }
    assert!(saw, "no bar seen in {} frames", frames.len());
    assert!(bars(last).is_empty(), "bars left:\n{last}");
    assert!(last.contains("manifest sha256"), "{last}");
}
