//! `ftpipe completions SHELL` and `ftpipe man`: shell completion scripts
//! (clap_complete) and man pages (clap_mangen) rendered from the clap
//! definition that parses the command line, so they name exactly the
//! commands and options the binary has.
//!
//! The wheel (`pyproject.toml`) installs them too, without running the
//! binary: maturin copies `docs/wheel/data/` into the environment's prefix,
//! so the man pages land in `share/man/man1/` (found by `man` through
//! `PATH`) and the bash, zsh and fish scripts where those shells look for
//! vendor completions. Those files are committed; a unit test here compares
//! them byte for byte with fresh output (`UPDATE_CLI_DOCS=1 cargo test
//! --bin ftpipe cli_docs::` rewrites them), and another checks that every
//! command and every long option of the clap tree is in each script and
//! page.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap_complete::Shell;

/// The name the scripts complete and the pages document.
const BIN: &str = "ftpipe";

/// The completion script of `shell` for the whole command line.
pub fn completions(shell: Shell) -> Vec<u8> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut crate::cli::command(), BIN, &mut script);
    script
}

/// A rendered man page: its file name (`ftpipe.1`, `ftpipe-fetch.1`) and
/// its roff source.
pub struct ManPage {
    /// The file name, as `man` looks it up.
    pub file_name: String,
    /// The page in roff.
    pub roff: Vec<u8>,
}

/// The man page of `ftpipe` (its commands listed as `ftpipe-<command>(1)`,
/// then its examples, environment and exit status) followed by one page
/// per command, each with all of its options, its examples and the
/// environment it reads.
pub fn man_pages() -> Vec<ManPage> {
    // As clap_mangen::generate_to: no page for the `help` pseudo-command.
    let mut root = crate::cli::command().disable_help_subcommand(true);
    root.build();
    let source = format!("{BIN} {}", root.get_version().unwrap_or_default());
    let mut pages = vec![ManPage {
        file_name: format!("{BIN}.1"),
        roff: page(&root, None, &source),
    }];
    for sub in root.get_subcommands().filter(|s| !s.is_hide_set()) {
        let man = clap_mangen::Man::new(sub.clone()).source(source.as_str());
        pages.push(ManPage {
            file_name: man.get_filename(),
            roff: page(sub, Some(sub.get_name()), &source),
        });
    }
    pages
}

/// A clap_mangen renderer of one section of a page.
type RenderSection = fn(&clap_mangen::Man, &mut dyn Write) -> std::io::Result<()>;

/// One page: the sections clap_mangen renders (`Man::render`'s, in its
/// order) with EXAMPLES and ENVIRONMENT (`cli::help`) in place of its
/// EXTRA section (the same text as `--help`'s end, unformatted), and on
/// ftpipe's own page EXIT STATUS (`crate::exit`) before VERSION.
fn page(cmd: &clap::Command, name: Option<&str>, source: &str) -> Vec<u8> {
    let man = clap_mangen::Man::new(cmd.clone()).source(source.to_owned());
    let mut roff = Vec::new();
    let mut sections: Vec<RenderSection> = vec![
        clap_mangen::Man::render_title,
        clap_mangen::Man::render_name_section,
        clap_mangen::Man::render_synopsis_section,
        clap_mangen::Man::render_description_section,
    ];
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        sections.push(clap_mangen::Man::render_options_section);
    }
    if cmd.has_subcommands() {
        sections.push(clap_mangen::Man::render_subcommands_section);
    }
    for render in sections {
        render(&man, &mut roff).expect("rendering into memory cannot fail");
    }
    roff.extend_from_slice(crate::cli::help::roff_sections(name).as_bytes());
    if name.is_none() {
        roff.extend_from_slice(crate::exit::roff_section().as_bytes());
    }
    if cmd.get_version().is_some() {
        man.render_version_section(&mut roff)
            .expect("rendering into memory cannot fail");
    }
    roff
}

/// `ftpipe completions SHELL`: the script on stdout.
pub fn print_completions(shell: Shell) -> anyhow::Result<bool> {
    write_stdout(&completions(shell))?;
    Ok(true)
}

/// `ftpipe man [COMMAND] [--dir DIR]`: the page of `ftpipe` or of one
/// command on stdout, or every page written into `dir` (created if
/// missing), each path printed.
pub fn man(command: Option<&str>, dir: Option<&Path>) -> anyhow::Result<bool> {
    let pages = man_pages();
    if let Some(dir) = dir {
        for path in write_pages(&pages, dir)? {
            println!("{}", path.display());
        }
        return Ok(true);
    }
    let wanted = match command {
        Some(c) => format!("{BIN}-{c}.1"),
        None => format!("{BIN}.1"),
    };
    let Some(page) = pages.iter().find(|p| p.file_name == wanted) else {
        bail!(
            "no command {:?} (one of: {})",
            command.unwrap_or_default(),
            command_names(&pages).join(", ")
        );
    };
    write_stdout(&page.roff)?;
    Ok(true)
}

/// The commands that have a page, as `ftpipe man COMMAND` names them.
fn command_names(pages: &[ManPage]) -> Vec<&str> {
    let prefix = format!("{BIN}-");
    pages
        .iter()
        .filter_map(|p| p.file_name.strip_prefix(&prefix)?.strip_suffix(".1"))
        .collect()
}

/// Writes every page into `dir` and returns the paths written.
fn write_pages(pages: &[ManPage], dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut written = Vec::with_capacity(pages.len());
    for page in pages {
        let path = dir.join(&page.file_name);
        #[expect(
            clippy::disallowed_methods,
            reason = "man pages go where the user asks, outside DIR: no state a crash must keep"
        )]
        let wrote = std::fs::write(&path, &page.roff);
        wrote.with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

/// Writes `bytes` to stdout and flushes (a closed pipe is an error).
fn write_stdout(bytes: &[u8]) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(bytes)
        .and_then(|()| out.flush())
        .context("writing to stdout")
}

#[cfg(test)]
mod tests {
    use super::*;

    use clap::ValueEnum;

    /// Where the wheel's completion scripts go under `share/` of the
    /// installing prefix (where bash-completion, zsh and fish look).
    const SHIPPED_COMPLETIONS: [(Shell, &str); 3] = [
        (Shell::Bash, "bash-completion/completions/ftpipe"),
        (Shell::Zsh, "zsh/site-functions/_ftpipe"),
        (Shell::Fish, "fish/vendor_completions.d/ftpipe.fish"),
    ];

    /// Where the wheel's man pages go under `share/`.
    const SHIPPED_MAN_DIR: &str = "man/man1";

    /// How to bring the committed files up to date.
    const REGENERATE: &str = "regenerate with `UPDATE_CLI_DOCS=1 cargo test --bin ftpipe cli_docs::` and commit docs/wheel/";

    /// Every command of the clap tree (`None`: `ftpipe` itself; not `help`)
    /// with its visible long options.
    fn commands_and_long_options() -> Vec<(Option<String>, Vec<String>)> {
        let mut root = crate::cli::command().disable_help_subcommand(true);
        root.build();
        let longs = |cmd: &clap::Command| -> Vec<String> {
            cmd.get_arguments()
                .filter(|a| !a.is_hide_set())
                .filter_map(|a| a.get_long().map(str::to_owned))
                .collect()
        };
        let mut all = vec![(None, longs(&root))];
        for sub in root.get_subcommands().filter(|s| !s.is_hide_set()) {
            assert!(
                !sub.has_subcommands(),
                "{}: extend this walk",
                sub.get_name()
            );
            all.push((Some(sub.get_name().to_owned()), longs(sub)));
        }
        assert!(all.len() > 10, "too few commands: {all:?}");
        all
    }

    /// The text between `start` and the next `end` in `script`.
    fn between(script: &str, start: &str, end: &str) -> String {
        let from = script
            .find(start)
            .unwrap_or_else(|| panic!("no {start:?} in the script"))
            + start.len();
        let rest = &script[from..];
        rest[..rest.find(end).unwrap_or(rest.len())].to_owned()
    }

    /// The part of `shell`'s script that completes `command` (`None`:
    /// `ftpipe` itself), cut at the markers its generator writes.
    fn section(shell: Shell, script: &str, command: Option<&str>) -> String {
        let c = command.unwrap_or_default();
        match (shell, command) {
            (Shell::Bash, None) => between(script, "        ftpipe)\n            opts=\"", "\""),
            (Shell::Bash, Some(_)) => between(
                script,
                &format!("        ftpipe__subcmd__{c})\n            opts=\""),
                "\"",
            ),
            (Shell::Zsh, None) => between(script, "_ftpipe() {", "case $state in"),
            (Shell::Zsh, Some(_)) => between(script, &format!("({c})\n_arguments"), "\n;;"),
            (Shell::Fish, _) => {
                let condition = match command {
                    None => "-n \"__fish_ftpipe_needs_command\"".to_owned(),
                    Some(c) => format!("-n \"__fish_ftpipe_using_subcommand {c}\""),
                };
                let lines: Vec<&str> = script.lines().filter(|l| l.contains(&condition)).collect();
                assert!(!lines.is_empty(), "no {condition} in the script");
                lines.join("\n")
            }
            (Shell::PowerShell, None) => between(script, "'ftpipe' {", "break"),
            (Shell::PowerShell, Some(_)) => between(script, &format!("'ftpipe;{c}' {{"), "break"),
            (Shell::Elvish, None) => between(script, "&'ftpipe'= {", "}"),
            (Shell::Elvish, Some(_)) => between(script, &format!("&'ftpipe;{c}'= {{"), "}"),
            (other, _) => panic!("no section markers for {other}"),
        }
    }

    /// Whether a line of `text` has the words `first second` in a row.
    fn has_words(text: &str, first: &str, second: &str) -> bool {
        text.lines().any(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            words.windows(2).any(|w| w == [first, second])
        })
    }

    /// Whether `section` (of `shell`'s script) offers the option `--long`.
    fn offers_option(shell: Shell, section: &str, long: &str) -> bool {
        let flag = format!("--{long}");
        match shell {
            Shell::Bash => section.split_whitespace().any(|w| w == flag),
            Shell::Zsh => ["'", ")", "*"].iter().any(|before| {
                ["=", "["]
                    .iter()
                    .any(|after| section.contains(&format!("{before}{flag}{after}")))
            }),
            Shell::Fish => has_words(section, "-l", long),
            Shell::PowerShell => section.contains(&format!("::new('{flag}',")),
            Shell::Elvish => has_words(section, "cand", &flag),
            other => panic!("no option syntax for {other}"),
        }
    }

    /// Whether `shell`'s script offers the command `name` after `ftpipe`
    /// (`root`: the section of `ftpipe` itself).
    fn offers_command(shell: Shell, script: &str, root: &str, name: &str) -> bool {
        match shell {
            Shell::Bash => root.split_whitespace().any(|w| w == name),
            Shell::Zsh => {
                between(script, "_ftpipe_commands() {", "\n}").contains(&format!("'{name}:"))
            }
            Shell::Fish => root.contains(&format!(" -a \"{name}\" ")),
            Shell::PowerShell => root.contains(&format!("::new('{name}',")),
            Shell::Elvish => has_words(root, "cand", name),
            other => panic!("no command syntax for {other}"),
        }
    }

    #[test]
    fn every_completion_script_offers_every_command_and_long_option() {
        let tree = commands_and_long_options();
        for shell in Shell::value_variants().iter().copied() {
            let script = String::from_utf8(completions(shell)).expect("a UTF-8 script");
            let root = section(shell, &script, None);
            for (command, longs) in &tree {
                if let Some(name) = command {
                    assert!(
                        offers_command(shell, &script, &root, name),
                        "{shell}: no command {name}"
                    );
                }
                let section = section(shell, &script, command.as_deref());
                for long in longs {
                    assert!(
                        offers_option(shell, &section, long),
                        "{shell}: `ftpipe {}` does not offer --{long}:\n{section}",
                        command.as_deref().unwrap_or_default()
                    );
                }
            }
        }
    }

    #[test]
    fn man_pages_cover_every_command_and_long_option() {
        let pages = man_pages();
        let text = |file_name: &str| -> String {
            let page = pages
                .iter()
                .find(|p| p.file_name == file_name)
                .unwrap_or_else(|| panic!("no page {file_name}"));
            String::from_utf8_lossy(&page.roff).replace("\\-", "-")
        };
        let root = text("ftpipe.1");
        for (command, longs) in commands_and_long_options() {
            let file_name = match &command {
                None => "ftpipe.1".to_owned(),
                Some(c) => format!("ftpipe-{c}.1"),
            };
            if let Some(c) = &command {
                assert!(
                    root.contains(&format!("ftpipe-{c}(1)")),
                    "ftpipe.1 does not list {c}"
                );
            }
            let page = text(&file_name);
            assert!(page.contains(".TH "), "{file_name} has no title");
            for long in longs {
                assert!(
                    page.contains(&format!("--{long}")),
                    "{file_name} lacks --{long}"
                );
            }
        }
        assert_eq!(
            pages.len(),
            commands_and_long_options().len(),
            "one page per command"
        );
        assert!(root.contains(".SH \"EXIT STATUS\"\n.TP\n0\n"), "{root}");
    }

    /// Every file the wheel ships, as fresh output: its path under
    /// `share/` and its bytes.
    fn fresh_shipped_files() -> Vec<(PathBuf, Vec<u8>)> {
        let mut files: Vec<(PathBuf, Vec<u8>)> = SHIPPED_COMPLETIONS
            .iter()
            .map(|&(shell, path)| (PathBuf::from(path), completions(shell)))
            .collect();
        let man_dir = Path::new(SHIPPED_MAN_DIR);
        files.extend(
            man_pages()
                .into_iter()
                .map(|p| (man_dir.join(p.file_name), p.roff)),
        );
        files
    }

    /// Every file under `dir`, relative to `base`.
    fn files_under(dir: &Path, base: &Path, found: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("read a shipped dir") {
            let path = entry.expect("a dir entry").path();
            if path.is_dir() {
                files_under(&path, base, found);
            } else {
                found.push(path.strip_prefix(base).expect("under base").to_owned());
            }
        }
    }

    /// Replaces the tree under `share` with `fresh` (so stale pages go).
    fn rewrite_shipped(share: &Path, fresh: &[(PathBuf, Vec<u8>)]) {
        if share.exists() {
            std::fs::remove_dir_all(share).expect("remove the old tree");
        }
        for (path, bytes) in fresh {
            let path = share.join(path);
            std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
            std::fs::write(&path, bytes).expect("write a shipped file");
        }
    }

    #[test]
    fn shipped_completions_and_man_pages_are_fresh_output() {
        let share = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/wheel/data/share");
        let fresh = fresh_shipped_files();
        if std::env::var_os("UPDATE_CLI_DOCS").is_some() {
            rewrite_shipped(&share, &fresh);
        }
        for (path, bytes) in &fresh {
            let committed = std::fs::read(share.join(path)).unwrap_or_default();
            assert!(
                committed == *bytes,
                "docs/wheel/data/share/{} is not what the CLI generates: {REGENERATE}",
                path.display()
            );
        }
        let mut found = Vec::new();
        files_under(&share, &share, &mut found);
        for path in found {
            assert!(
                fresh.iter().any(|(p, _)| *p == path),
                "docs/wheel/data/share/{} is not generated any more: {REGENERATE}",
                path.display()
            );
        }
    }

    #[test]
    fn man_knows_every_command_and_refuses_others() {
        let pages = man_pages();
        let names = command_names(&pages);
        assert!(
            names.contains(&"fetch") && names.contains(&"man"),
            "{names:?}"
        );
        let err = man(Some("nope"), None).expect_err("an unknown command");
        assert!(err.to_string().contains("one of: fetch, "), "{err}");
    }
}
