//! Everything the binary writes to stdout and stderr, through the one
//! redaction point (`ftpipe_secrets`): a credential this process holds
//! (the hub token, whatever its source) is replaced wherever it appears,
//! even when a server echoed it into a header or error that ends up in a
//! line printed here.
//!
//! The crate root shadows `print!`, `println!` and `eprintln!` with macros
//! calling [`stdout`] and [`stderr`], so no print of the binary can bypass
//! this module; progress bars print through [`redacted`], logs through
//! [`LogWriter`], and a panic's message through [`install_panic_hook`].

use std::borrow::Cow;
use std::io::Write;

use ftpipe_secrets::redact;

/// `text` with every registered credential replaced.
pub fn redacted(text: &str) -> Cow<'_, str> {
    redact(text)
}

/// Writes `text` to stdout, redacted (errors writing are ignored, as
/// `print!` would panic on them: a closed pipe is the reader's choice).
pub fn stdout(text: &str) {
    let _ = std::io::stdout().lock().write_all(redact(text).as_bytes());
}

/// Writes `text` to stderr, redacted.
pub fn stderr(text: &str) {
    let _ = std::io::stderr().lock().write_all(redact(text).as_bytes());
}

/// Replaces the default panic message (which writes to stderr directly)
/// with the same text, redacted: a panic's payload may hold a string from
/// outside. Location and thread are kept; a backtrace, when asked for with
/// `RUST_BACKTRACE`, is redacted as well.
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("<unnamed>");
        let mut text = format!("thread '{name}' {info}\n");
        if std::env::var_os("RUST_BACKTRACE").is_some_and(|v| v != "0") {
            text.push_str(&std::backtrace::Backtrace::force_capture().to_string());
        }
        stderr(&text);
    }));
}

/// `value` as one JSON line on stdout, redacted.
pub fn json_line<T: serde::Serialize + ?Sized>(value: &T) -> serde_json::Result<()> {
    let mut line = serde_json::to_string(value)?;
    line.push('\n');
    stdout(&line);
    Ok(())
}

/// The log writer: `tracing` formats one event into it, and the event is
/// written to stderr, redacted, when the writer is dropped (so a
/// credential split across two `write` calls is still found).
#[derive(Default)]
pub struct LogWriter {
    buf: Vec<u8>,
}

impl Write for LogWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LogWriter {
    fn drop(&mut self) {
        stderr(&String::from_utf8_lossy(&self.buf));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_are_redacted_whole() {
        ftpipe_secrets::register("hf_output_test_secret");
        let mut w = LogWriter::default();
        w.write_all(b"etag hf_output_").unwrap();
        w.write_all(b"test_secret seen").unwrap();
        assert_eq!(
            redacted(&String::from_utf8_lossy(&w.buf)),
            "etag <redacted> seen"
        );
        w.buf.clear();
    }
}
