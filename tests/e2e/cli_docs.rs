//! `ftpipe completions SHELL`, `ftpipe man` and `ftpipe --version` of the
//! built binary: what they print is what the wheel installs
//! (`docs/wheel/data/share/`, byte for byte), and it names every command
//! and long option the binary's own `--help` lists. (The unit tests in
//! `src/cli_docs.rs` check the same against clap's command tree, per shell
//! and per command.)

use std::path::{Path, PathBuf};

use crate::common::*;

/// The shells `ftpipe completions` knows.
const SHELLS: [&str; 5] = ["bash", "elvish", "fish", "powershell", "zsh"];

/// `share/` of the wheel's data, as committed.
fn shipped_share() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/wheel/data/share")
}

/// The completion script the wheel ships for `shell`, if it ships one.
fn shipped_completion(shell: &str) -> Option<PathBuf> {
    let path = match shell {
        "bash" => "bash-completion/completions/ftpipe",
        "zsh" => "zsh/site-functions/_ftpipe",
        "fish" => "fish/vendor_completions.d/ftpipe.fish",
        _ => return None,
    };
    Some(shipped_share().join(path))
}

/// stdout of `ftpipe ARGS`, which must succeed.
fn stdout_of(args: &[&str]) -> String {
    String::from_utf8(run_ok(ftpipe().args(args)).stdout).expect("UTF-8 output")
}

/// The commands `ftpipe --help` lists (not `help`).
fn commands_in_help() -> Vec<String> {
    let help = stdout_of(&["--help"]);
    let list = help
        .split("Commands:\n")
        .nth(1)
        .expect("a Commands section")
        .split("\n\n")
        .next()
        .unwrap_or_default();
    let commands: Vec<String> = list
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_owned)
        .collect();
    assert!(commands.len() > 10, "{help}");
    commands
}

/// The long options `ftpipe COMMAND --help` lists: those starting an
/// option line (indented by at most six spaces), not ones named in a
/// description.
fn long_options_in_help(command: &str) -> Vec<String> {
    let help = stdout_of(&[command, "--help"]);
    let longs: Vec<String> = help
        .lines()
        .filter(|l| {
            let indent = l.len() - l.trim_start().len();
            indent <= 6 && l.trim_start().starts_with('-')
        })
        .filter_map(|l| l.split_whitespace().find(|w| w.starts_with("--")))
        .map(|w| w.trim_end_matches(',').to_owned())
        .collect();
    assert!(longs.contains(&"--help".to_owned()), "{help}");
    longs
}

#[test]
fn version_is_the_package_version() {
    let printed = stdout_of(&["--version"]);
    assert_eq!(printed, format!("ftpipe {}\n", env!("CARGO_PKG_VERSION")));
}

#[test]
fn completions_are_the_shipped_scripts_and_name_every_command_and_option() {
    let commands = commands_in_help();
    let options: Vec<(String, Vec<String>)> = commands
        .iter()
        .map(|c| (c.clone(), long_options_in_help(c)))
        .collect();
    for shell in SHELLS {
        let script = stdout_of(&["completions", shell]);
        if let Some(path) = shipped_completion(shell) {
            let shipped = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                shipped == script,
                "{} differs from `ftpipe completions {shell}`: regenerate with \
                 `UPDATE_CLI_DOCS=1 cargo test --bin ftpipe cli_docs::`",
                path.display()
            );
        }
        for (command, longs) in &options {
            assert!(script.contains(command.as_str()), "{shell}: no {command}");
            for long in longs {
                // fish writes `-l jobs`, the others `--jobs`.
                let fish = format!("-l {} ", &long[2..]);
                assert!(
                    script.contains(long.as_str()) || script.contains(&fish),
                    "{shell}: no {long} (of {command})"
                );
            }
        }
    }
    let bad = run(ftpipe().args(["completions", "tcsh"]));
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
}

/// The files in `dir`, by name.
fn file_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read the man dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn man_pages_are_the_shipped_pages_and_document_every_option() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("man1");
    let listed = stdout_of(&["man", "--dir", out.to_str().expect("UTF-8 path")]);
    let shipped = shipped_share().join("man/man1");
    let names = file_names(&out);
    assert_eq!(
        names,
        file_names(&shipped),
        "regenerate docs/wheel (see src/cli_docs.rs)"
    );
    assert_eq!(listed.lines().count(), names.len(), "{listed}");
    for name in &names {
        let written = std::fs::read(out.join(name)).unwrap();
        assert!(
            written == std::fs::read(shipped.join(name)).unwrap(),
            "{name} differs"
        );
    }
    for command in commands_in_help() {
        let page = stdout_of(&["man", &command]);
        let file = std::fs::read_to_string(out.join(format!("ftpipe-{command}.1"))).unwrap();
        assert_eq!(page, file, "`ftpipe man {command}` is its page");
        let text = page.replace("\\-", "-");
        for long in long_options_in_help(&command) {
            assert!(text.contains(&long), "ftpipe-{command}.1 lacks {long}");
        }
    }
    let root = stdout_of(&["man"]);
    assert_eq!(root, std::fs::read_to_string(out.join("ftpipe.1")).unwrap());
    assert!(root.contains("EXIT STATUS"), "{root}");

    let unknown = run(ftpipe().args(["man", "nope"]));
    assert_eq!(unknown.status.code(), Some(1));
    assert_names(&stderr(&unknown), &["\"nope\"", "one of: fetch, "]);
}

/// Regression (issue 36, item 8): `--out` and `--revision` had empty help,
/// and no `--help` or man page had examples or the environment it reads.
/// Every option line of every command's `--help` is followed by its
/// description; each help ends with Examples and Environment, and so does
/// each man page (EXAMPLES, ENVIRONMENT); `ftpipe.1` has the exit-code
/// table the README has.
#[test]
fn every_help_describes_every_option_and_ends_with_examples_and_environment() {
    for command in commands_in_help() {
        let help = stdout_of(&[&command, "--help"]);
        let lines: Vec<&str> = help.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            let indent = l.len() - l.trim_start().len();
            let starts_option = indent <= 6 && l.trim_start().starts_with('-');
            let starts_argument = indent == 2 && l.trim_start().starts_with('<');
            if !(starts_option || starts_argument) {
                continue;
            }
            let next = lines.get(i + 1).copied().unwrap_or_default();
            let described =
                next.len() - next.trim_start().len() > indent + 2 && !next.trim().is_empty();
            assert!(
                described,
                "`ftpipe {command} --help`: {l:?} has no description:\n{help}"
            );
        }
        let examples = help
            .find("\nExamples:\n  $ ftpipe ")
            .unwrap_or_else(|| panic!("{help}"));
        let environment = help
            .find("\nEnvironment:\n")
            .unwrap_or_else(|| panic!("{help}"));
        assert!(
            examples < environment && help[environment..].contains("FTPIPE_LOG"),
            "{help}"
        );
        let page = stdout_of(&["man", &command]);
        assert!(
            page.contains(".SH EXAMPLES\n") && page.contains(".SH ENVIRONMENT\n"),
            "{page}"
        );
    }
    let root = stdout_of(&["man"]);
    for code in 0..=7 {
        assert!(
            root.contains(&format!(".TP\n{code}\n")),
            "exit code {code} missing:\n{root}"
        );
    }
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    assert!(
        readme.contains("| 5 | not enough space on the target volume"),
        "README lost its table"
    );
}
