//! The EXAMPLES and ENVIRONMENT of `--help` (after the options) and of the
//! man pages, written once here as data: [`decorate`] puts them on the
//! clap tree as each command's `after_long_help`, and `cli_docs` renders
//! the same rows as roff sections.

use clap::Command;

/// One example: the command line (without the prompt) and what it does.
pub type Example = (&'static str, &'static str);

/// One environment variable the binary reads, and what for.
pub struct EnvVar {
    /// The variable.
    pub name: &'static str,
    /// What it sets.
    pub means: &'static str,
    /// Which commands read it.
    pub read_by: Readers,
}

/// Which commands read a variable.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Readers {
    /// Every command.
    All,
    /// The commands that talk to a hub (`fetch`, `run`, `plan`, `mirror`)
    /// and, for the redaction of output, every command.
    Hub,
    /// The commands that talk to object storage (`publish`, `pull`,
    /// `mirror`, and a hub command whose `--endpoint` is s3://).
    ObjectStorage,
    /// The commands that talk to an OCI registry (`publish`, `pull` with
    /// oci://).
    Registry,
}

const HUB_COMMANDS: [&str; 4] = ["fetch", "run", "plan", "mirror"];
const S3_COMMANDS: [&str; 6] = ["publish", "pull", "mirror", "fetch", "run", "plan"];
const REGISTRY_COMMANDS: [&str; 2] = ["publish", "pull"];

impl Readers {
    fn include(self, command: Option<&str>) -> bool {
        let Some(c) = command else { return true };
        match self {
            Readers::All => true,
            Readers::Hub => HUB_COMMANDS.contains(&c),
            Readers::ObjectStorage => S3_COMMANDS.contains(&c),
            Readers::Registry => REGISTRY_COMMANDS.contains(&c),
        }
    }
}

/// Every variable the binary reads.
pub const ENVIRONMENT: &[EnvVar] = &[
    EnvVar {
        name: "HF_ENDPOINT",
        means: "the hub (default https://huggingface.co); --endpoint wins",
        read_by: Readers::Hub,
    },
    EnvVar {
        name: "HF_TOKEN",
        means: "the hub token (also HUGGING_FACE_HUB_TOKEN); --token-file wins",
        read_by: Readers::Hub,
    },
    EnvVar {
        name: "HF_TOKEN_PATH",
        means: "the file holding the token when HF_TOKEN is unset (default $HF_HOME/token, \
                where `hf auth login` writes it)",
        read_by: Readers::Hub,
    },
    EnvVar {
        name: "HF_HOME",
        means: "huggingface_hub's home (default $XDG_CACHE_HOME/huggingface, else \
                ~/.cache/huggingface): its token and, as hub/, its cache",
        read_by: Readers::Hub,
    },
    EnvVar {
        name: "HF_HUB_CACHE",
        means: "the Hugging Face cache pinned files are taken from (default $HF_HOME/hub); \
                --hf-cache and --no-hf-cache win",
        read_by: Readers::Hub,
    },
    EnvVar {
        name: "HF_HUB_OFFLINE",
        means: "1, on, yes or true: no network, as --offline",
        read_by: Readers::Hub,
    },
    EnvVar {
        name: "REGISTRY_AUTH_FILE",
        means: "registry credentials for oci:// (an auth.json with `auths`), asked first; \
                then $XDG_RUNTIME_DIR/containers/auth.json, then $DOCKER_CONFIG/config.json \
                (default ~/.docker/config.json)",
        read_by: Readers::Registry,
    },
    EnvVar {
        name: "AWS_ACCESS_KEY_ID",
        means: "object-storage credentials, with AWS_SECRET_ACCESS_KEY and \
                AWS_SESSION_TOKEN (else the profile's)",
        read_by: Readers::ObjectStorage,
    },
    EnvVar {
        name: "AWS_PROFILE",
        means: "the profile (also AWS_DEFAULT_PROFILE) in AWS_SHARED_CREDENTIALS_FILE \
                (default ~/.aws/credentials) and AWS_CONFIG_FILE (default ~/.aws/config)",
        read_by: Readers::ObjectStorage,
    },
    EnvVar {
        name: "AWS_REGION",
        means: "the region (also AWS_DEFAULT_REGION; else the profile's, else us-east-1)",
        read_by: Readers::ObjectStorage,
    },
    EnvVar {
        name: "AWS_ENDPOINT_URL_S3",
        means: "the S3-compatible endpoint (also AWS_ENDPOINT_URL; else the profile's \
                endpoint_url, else AWS); --s3-endpoint wins",
        read_by: Readers::ObjectStorage,
    },
    EnvVar {
        name: "FTPIPE_LOG",
        means: "log filter on stderr (default error), e.g. info, debug, ftpipe_fetch=debug",
        read_by: Readers::All,
    },
    EnvVar {
        name: "FTPIPE_CRASH_AT",
        means: "for crash tests only: abort at the named crash point (NAME or NAME#N; \
                docs/design.md lists them)",
        read_by: Readers::All,
    },
    EnvVar {
        name: "FTPIPE_HOLD_AT",
        means: "for crash tests only: hold the thread reaching the named crash point there \
                until the process is killed (NAME or NAME#N)",
        read_by: Readers::All,
    },
];

/// The examples of each command (`""`: ftpipe's own page).
const EXAMPLES: &[(&str, &[Example])] = &[
    (
        "",
        &[
            (
                "ftpipe run Qwen/Qwen4-Exp --out /data/qwen4",
                "resolve, plan, fetch, convert and verify; re-run the same line to resume",
            ),
            ("ftpipe status --out /data/qwen4", "where DIR stands"),
            ("ftpipe verify /data/qwen4", "check the artifact on its own"),
            (
                "ftpipe man run | man -l -",
                "the manual page of one command",
            ),
        ],
    ),
    (
        "fetch",
        &[
            (
                "ftpipe fetch Qwen/Qwen4-Exp --out /data/qwen4",
                "download main's files into /data/qwen4/source (resumes where it stopped)",
            ),
            (
                "ftpipe fetch Qwen/Qwen4-Exp --revision v1.0 --include '*.json' --out /data/q",
                "only the JSON files of tag v1.0",
            ),
        ],
    ),
    (
        "status",
        &[("ftpipe status --out /data/qwen4", "pin, stages and bytes")],
    ),
    (
        "audit",
        &[
            (
                "ftpipe audit --out /data/qwen4",
                "reconcile the ledger with the files",
            ),
            (
                "ftpipe audit --out /data/qwen4 --deep --bundle evidence.tar.zst",
                "re-hash everything and keep the evidence",
            ),
        ],
    ),
    (
        "plan",
        &[
            (
                "ftpipe plan Qwen/Qwen4-Exp --out /data/qwen4 --remote",
                "exact output sizes from the shards' headers, before fetching",
            ),
            (
                "ftpipe plan Qwen/Qwen4-Exp --out /data/qwen4 --remote --disk-budget 120GB",
                "the peak disk of a budgeted run, and the smallest budget that works",
            ),
        ],
    ),
    (
        "convert",
        &[(
            "ftpipe convert --out /data/qwen4 --retire-sources",
            "build DIR/artifact from DIR/source, deleting sources once converted",
        )],
    ),
    (
        "run",
        &[
            (
                "ftpipe run Qwen/Qwen4-Exp --out /data/qwen4",
                "the whole chain; re-run the same line to resume after any crash",
            ),
            (
                "ftpipe run Qwen/Qwen4-Exp --out /data/qwen4 --disk-budget 120GB",
                "convert while downloading, never holding more than 120 GB of sources",
            ),
        ],
    ),
    (
        "publish",
        &[
            (
                "ftpipe publish /data/qwen4 s3://models/qwen4-exp",
                "upload /data/qwen4/artifact (resumable), manifest.json last",
            ),
            (
                "ftpipe publish /data/qwen4 oci://registry.example/models/qwen4:v1",
                "push it to an OCI registry as a CNCF ModelPack artifact, the tag last",
            ),
        ],
    ),
    (
        "pull",
        &[
            (
                "ftpipe pull s3://models/qwen4-exp --out /data/qwen4",
                "download a published artifact into /data/qwen4/artifact and verify it",
            ),
            (
                "ftpipe pull oci://registry.example/models/qwen4:v1 --out /data/qwen4",
                "the same from a registry, the tag pinned to its manifest digest",
            ),
        ],
    ),
    (
        "mirror",
        &[
            (
                "ftpipe mirror /data/qwen4 s3://models/mirrors/qwen4-exp",
                "copy DIR's fetched sources to object storage",
            ),
            (
                "ftpipe run Qwen/Qwen4-Exp --endpoint s3://models/mirrors/qwen4-exp --out /d",
                "then build from the mirror instead of the hub",
            ),
        ],
    ),
    (
        "inspect",
        &[(
            "ftpipe inspect /data/qwen4/artifact/model.ftw",
            "what an FTW, FTEXPERT1 or safetensors file holds (header only)",
        )],
    ),
    (
        "verify",
        &[
            (
                "ftpipe verify /data/qwen4",
                "DIR, or DIR/artifact, or a copy of it",
            ),
            (
                "ftpipe verify /data/qwen4/artifact --deep",
                "also re-hash every component",
            ),
        ],
    ),
    (
        "demo",
        &[("ftpipe demo", "the whole pipeline on a local fixture hub")],
    ),
    (
        "completions",
        &[(
            "ftpipe completions bash > ~/.local/share/bash-completion/completions/ftpipe",
            "install bash completion",
        )],
    ),
    (
        "man",
        &[
            ("ftpipe man fetch | man -l -", "read one page"),
            (
                "ftpipe man --dir ~/.local/share/man/man1",
                "install every page",
            ),
        ],
    ),
];

/// The examples of `command` (`None`: ftpipe's own page).
pub fn examples(command: Option<&str>) -> &'static [Example] {
    let name = command.unwrap_or_default();
    EXAMPLES
        .iter()
        .find(|(c, _)| *c == name)
        .map_or(&[], |(_, e)| e)
}

/// The variables `command` reads (`None`: every one).
pub fn environment(command: Option<&str>) -> impl Iterator<Item = &'static EnvVar> {
    ENVIRONMENT
        .iter()
        .filter(move |v| v.read_by.include(command))
}

/// The `--help` text after the options of `command`.
pub fn after_long_help(command: Option<&str>) -> String {
    let mut text = String::from("Examples:\n");
    for e in examples(command) {
        text.push_str(&format!("  $ {}\n      {}\n", e.0, e.1));
    }
    text.push_str("\nEnvironment:\n");
    for v in environment(command) {
        text.push_str(&format!("  {}\n      {}\n", v.name, v.means));
    }
    text.push_str("\nExit codes: see `ftpipe man` (EXIT STATUS) or the README.");
    text
}

/// `cmd` (ftpipe's tree) with the EXAMPLES and ENVIRONMENT of each
/// command as its `after_long_help`.
pub fn decorate(cmd: Command) -> Command {
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_owned())
        .filter(|n| n != "help")
        .collect();
    let mut cmd = cmd.after_long_help(after_long_help(None));
    for name in names {
        let text = after_long_help(Some(&name));
        cmd = cmd.mut_subcommand(&name, |s| s.after_long_help(text));
    }
    cmd
}

/// The EXAMPLES and ENVIRONMENT sections of a man page in roff.
pub fn roff_sections(command: Option<&str>) -> String {
    let esc = |s: &str| s.replace('\\', "\\\\").replace('-', "\\-");
    let mut roff = String::from(".SH EXAMPLES\n");
    for e in examples(command) {
        roff.push_str(&format!(".TP\n.B {}\n{}\n", esc(e.0), esc(e.1)));
    }
    roff.push_str(".SH ENVIRONMENT\n");
    for v in environment(command) {
        roff.push_str(&format!(".TP\n.B {}\n{}\n", v.name, esc(v.means)));
    }
    roff
}
