//! Exit codes: the one table of what each code means, which the error
//! mapping (`class_code`), `ftpipe.1`'s EXIT STATUS section and the
//! README's "Exit codes" table all take their words from. A unit test
//! compares the README's table with [`markdown_table`]
//! (`UPDATE_CLI_DOCS=1 cargo test --bin ftpipe exit::` rewrites it).

use ftpipe_fs::ErrorClass;

/// Success: done, and everything verified and reconciles.
pub const SUCCESS: u8 = 0;
/// Any error not given a code of its own.
pub const FAILURE: u8 = 1;
/// The command line did not parse (clap's own code).
pub const USAGE: u8 = 2;
/// Another ftpipe holds DIR's lock.
pub const LOCKED: u8 = 3;
/// Finished, but the audit is not clean (no error: the command's answer).
pub const AUDIT_FAILED: u8 = 4;
/// Not enough space.
pub const NO_SPACE: u8 = 5;
/// The artifact failed verification.
pub const VERIFY_FAILED: u8 = 6;
/// A bug: a broken invariant or a task that panicked.
pub const INTERNAL: u8 = 7;
/// Stopped by SIGINT (Ctrl-C): 128 + 2, as a shell reports it.
pub const INTERRUPTED: u8 = 130;
/// Stopped by SIGTERM: 128 + 15.
pub const TERMINATED: u8 = 143;

/// Every exit code with what it means, in order.
pub const TABLE: [(u8, &str); 10] = [
    (SUCCESS, "done, and everything verified / reconciles"),
    (
        FAILURE,
        "an error (network, bad source, stale artifact, conflict on disk, ...); the message names \
         the file, tensor or header and what was expected, and for the common ones (hub access, \
         a missing repo or revision, an endpoint that does not answer) says what to do",
    ),
    (USAGE, "bad command line"),
    (
        LOCKED,
        "another ftpipe holds the lock on `DIR` (its PID is printed); for `audit`, a run in \
         progress in `DIR`",
    ),
    (
        AUDIT_FAILED,
        "finished, but the audit is not clean (unverified files, mismatching components, \
         reconciliation error)",
    ),
    (
        NO_SPACE,
        "not enough space on the target volume, found by a preflight (bytes available and still \
         needed are printed) or by a write that met a full disk anywhere: fetch, conversion or \
         the state database; free space and re-run to resume",
    ),
    (
        VERIFY_FAILED,
        "the artifact failed verification: `ftpipe verify`, or the verify stage at the end of \
         `run` (each problem is listed)",
    ),
    (
        INTERNAL,
        "an internal error: a broken invariant or a conversion/fetch task that panicked (a bug; \
         durable state is kept, so a re-run resumes)",
    ),
    (
        INTERRUPTED,
        "stopped by Ctrl-C (SIGINT): the progress bars are cleared, one line says what is \
         durable, and the same command resumes",
    ),
    (TERMINATED, "stopped by SIGTERM, as for Ctrl-C"),
];

/// The exit code of each class of error. Code 4, an audit that is not
/// clean, is no error and is not here; code 2 is clap's.
pub fn class_code(class: ErrorClass) -> u8 {
    match class {
        ErrorClass::Failure => FAILURE,
        ErrorClass::Verification => VERIFY_FAILED,
        ErrorClass::Locked => LOCKED,
        ErrorClass::NoSpace => NO_SPACE,
        ErrorClass::Internal => INTERNAL,
    }
}

/// The EXIT STATUS section of `ftpipe.1` in roff.
pub fn roff_section() -> String {
    let mut roff = String::from(".SH \"EXIT STATUS\"\n");
    for (code, meaning) in TABLE {
        let text = meaning.replace('`', "").replace('-', "\\-");
        roff.push_str(&format!(".TP\n{code}\n{text}\n"));
    }
    roff
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The README's table: `| code | meaning |` rows.
    fn markdown_table() -> String {
        let mut out = String::from("| code | meaning |\n|---|---|\n");
        for (code, meaning) in TABLE {
            out.push_str(&format!("| {code} | {meaning} |\n"));
        }
        out
    }

    /// Where the README's table starts and ends.
    const BEGIN: &str = "<!-- exit-codes: generated from src/exit.rs -->\n";
    const END: &str = "<!-- /exit-codes -->\n";

    #[test]
    fn every_code_is_in_the_table_once_in_order() {
        let codes: Vec<u8> = TABLE.iter().map(|(c, _)| *c).collect();
        let mut expected: Vec<u8> = (0..=7).collect();
        expected.extend([INTERRUPTED, TERMINATED]);
        assert_eq!(codes, expected);
        for class in [
            ErrorClass::Failure,
            ErrorClass::Verification,
            ErrorClass::Locked,
            ErrorClass::NoSpace,
            ErrorClass::Internal,
        ] {
            let code = class_code(class);
            assert!(codes.contains(&code), "{class:?} -> {code}");
        }
        assert_eq!(
            USAGE,
            u8::try_from(
                clap::error::Error::<clap::error::DefaultFormatter>::new(
                    clap::error::ErrorKind::UnknownArgument
                )
                .exit_code()
            )
            .expect("a small code"),
            "clap's usage code"
        );
    }

    #[test]
    fn readme_exit_code_table_is_the_generated_one() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
        let readme = std::fs::read_to_string(&path).expect("README.md");
        let start = readme
            .find(BEGIN)
            .expect("the README marks its exit-code table")
            + BEGIN.len();
        let end = start + readme[start..].find(END).expect("the table's end marker");
        let fresh = markdown_table();
        if std::env::var_os("UPDATE_CLI_DOCS").is_some() && readme[start..end] != fresh {
            let updated = format!("{}{fresh}{}", &readme[..start], &readme[end..]);
            std::fs::write(&path, updated).expect("rewrite README.md");
            return;
        }
        assert_eq!(
            readme[start..end],
            fresh,
            "README.md's exit-code table is not src/exit.rs's: regenerate with \
             `UPDATE_CLI_DOCS=1 cargo test --bin ftpipe exit::`"
        );
    }
}
