//! End-to-end tests of the `ftpipe` binary: one test binary (`cargo test
//! --test e2e`), one module per area; filter by module path, e.g.
//! `cargo test --test e2e faults::` or `cargo test --test e2e
//! chain_crash::kill_storm`. Each module's own doc says what it checks.
//!
//! * `common`: shared support (fixture hub, the binary as a subprocess,
//!   readers of its JSON output and SQLite state, ledger invariants).
//! * `fetch_basic`: a clean fetch, an idempotent re-run, the directory lock.
//! * `faults`: every fault the fixture hub injects ends in a verified file
//!   or a clear error.
//! * `no_progress`: every no-progress loop of fetch ends in bounded time.
//! * `segmented`: a large file fetched as several HTTP ranges into one
//!   `.part`, including a kill storm while ranges are in flight.
//! * `attempts`: attempt byte counts add up to the ledger, also after SIGKILL.
//! * `crash`: `ftpipe fetch` killed with SIGKILL at seeded moments, then
//!   resumed and compared with a reference model.
//! * `checkpoint_cadence`: a file checkpoints every 1/256 of its bytes
//!   (4 to 64 MiB), so a kill costs a large file a bounded share.
//! * `digest_read_back`: a file's ranges become durable while its digest
//!   reads back what it could not hash from memory.
//! * `chain_crash`: every named crash point of resolve → plan → fetch →
//!   convert → verify, and a kill storm over whole chains.
//! * `powercut`: power cuts during `ftpipe run` on a FUSE filesystem that
//!   keeps only what was fsynced.
//! * `disk_full`: fetch and conversion on small mounts that fill up.
//! * `nginx`: kill and resume against a real nginx.
//! * `oci`: `publish` to and `pull` from a real OCI registry (the CNCF
//!   distribution registry) as a ModelPack artifact; `oras` and `skopeo`
//!   as peers; moved tags, hostile manifests, lying blobs.
//! * `oci_more`: cross-repository mounts (and a kill storm over them),
//!   credential helpers, uploads slower than `--read-timeout`, and the
//!   registry's smaller refusals.
//! * `hf_cache`: a Hugging Face cache filled by the real `hf download` (Xet
//!   disabled, and with its defaults through Xet against Hugging Face's
//!   `local_cas_server`: the shared blob store), the hub's token
//!   conventions, offline mode.
//! * `security`: the token stays on the hub's origin and out of all state;
//!   the pin is sticky.
//! * `symlinks`: links, hard links and FIFOs planted in `DIR` are refused.
//! * `token_echo`: a hub echoing the token back (ETag, Content-Range, a
//!   401's message) or an endpoint holding credentials leaks it nowhere.
//! * `bad_input`: hostile or inconsistent listings, JSON, sizes and files on
//!   disk end in a clear error.
//! * `error_advice`: a hub's 401/403/404, an endpoint that does not answer
//!   and an `--out` that is a file each say what to do in one sentence.
//! * `human_output`: sizes with units, counts instead of lists, a pulled
//!   DIR described as one; `verify` and `publish` take either directory.
//! * `limits`: everything read from outside is bounded (listing, manifest).
//! * `tty_progress`: the progress bars in a real terminal (tmux).
//! * `interrupt`: issue 36 in a real terminal: Ctrl-C and SIGTERM during a
//!   fetch and a pull (bars cleared, one line, exit 130/143, the same
//!   command resumes), a hub outage as one status line, the stage named
//!   until sizes are known, `audit` of a live run.
//! * `plan`: `ftpipe plan`, remote (headers over HTTP Range) and local.
//! * `plan_real_geometry`: planning the released Qwen4-Exp geometry from
//!   sparse files.
//! * `convert`: `ftpipe run` converts a qwen4_exp checkpoint and the
//!   artifact reads back equal to the source.
//! * `convert_modelopt`: ModelOpt input scales and fused NVFP4 experts pass
//!   through exactly.
//! * `convert_release`: the released Qwen4-Exp layout, its bad inputs, and
//!   interrupted runs.
//! * `convert_exclude`: `--exclude` of the vision / MTP files of the
//!   released layout (never requested, listed as not fetched), and of a
//!   text shard (an error naming it).
//! * `convert_bad_input`: malformed sources fail naming the file and tensor,
//!   then resume once fixed.
//! * `convert_crash`: `ftpipe convert` killed with SIGKILL at seeded moments,
//!   with and without `--retire-sources`.
//! * `incremental_rebuild`: after `run --repin`, components whose spans
//!   the new revision left unchanged are kept, the rest converted again,
//!   the manifest equal to a fresh build; `plan --repin` says so first.
//! * `convert_identity`: no silent reuse of an artifact from another
//!   converter variant or other sources.
//! * `convert_retire`: regressions of `--retire-sources`.
//! * `recipe`: a model no profile knows, converted with a TOML recipe.
//! * `verify`: `ftpipe verify` on a copied artifact names every tampered
//!   component.
//! * `inspect`: `ftpipe inspect` on FTW, FTEXPERT and safetensors files.
//! * `audit_bundle`: `ftpipe audit` reconciles and `--bundle` holds the
//!   evidence without the token.
//! * `hardening`: hostile inputs of issue 27: FIFOs and devices where a
//!   token or recipe is read, bad tokens, selections leaving out what
//!   conversion reads, the placement's read queue depth.
//! * `demo`: `ftpipe demo` crashes twice, resumes, verifies and audits clean;
//!   `demo --serve` serves until SIGINT and its printed fetch command works.
//! * `disk_budget`: `plan --remote --disk-budget`: the schedule's predicted
//!   peak and minimum feasible budget from headers, a budget below it refused.
//! * `budgeted_ranges`: at the minimum budget a shard admitted alone is
//!   fetched over several connections, within the budget.
//! * `budget_spans`: a PLE table spread over every file: converted PLE
//!   shards punched down to their PLE spans, the span-based minimum, the
//!   punch crash points, a changed kept range refused by digest.
//! * `copy_aside`: the same on a volume that cannot punch holes (the
//!   power-cut FUSE filesystem): PLE spans copied aside and the file
//!   released, the copy-aside minimum, its crash points, a changed copy
//!   refused by digest.
//! * `s3`: `publish` and `pull` against a real S3-compatible server (moto):
//!   identical verified artifacts, no-op re-runs, hostile manifests, a
//!   truncated or replaced object, racing publishers, credentials.
//! * `s3_credentials`: the AWS default chain (web identity through STS, a
//!   `credential_process` profile, none found listing what was tried), a
//!   plain-http endpoint on another host, one sentence per common S3
//!   failure (moto enforcing IAM authentication).
//! * `s3_crash`: kill storms over `publish` and over `pull`.
//! * `s3_powercut`: power cuts during `pull` and during `publish` (the
//!   power-cut filesystem under the node's DIR).
//! * `s3_pull_verify`: a pulled artifact that fails `verify` gets no
//!   `manifest.json`.
//! * `s3_publish_shape`: small files put at once (the manifest after them),
//!   a single put's checksum signed into a presigned URL.
//! * `s3_reuse`: publish reuses an object already at a key only when the
//!   store's own checksum proves its bytes (planted objects claiming the
//!   SHA-256 in metadata are uploaded again; a previous publish's are
//!   reused without a write).
//! * `conformance`: the checks every byte source passes (resume after a
//!   kill, a short body, a `200` to a range, a changed validator, a `416`
//!   to a range, an endless body, a stalled body), once per
//!   implementation: the hub, a mirror and `pull` (moto behind a lying
//!   proxy), `pull oci://…` and Xet storage (`local_cas_server`), the last
//!   two behind the same proxy.
//! * `s3_mirror`: a checkpoint mirrored into object storage, `run` from it
//!   (the hub's manifest), a mirror with one wrong file.
//! * `xet_source`: files the hub keeps in Xet storage fetched from
//!   `local_cas_server` by reconstruction (no `resolve` body; byte-equal to
//!   a fetch with Xet off), resumed from the watermark after a kill, a
//!   `200`, short or endless xorb answer refused and refetched, a cut or a
//!   kill inside a term losing at most one batch.
//! * `xet_tail`: a killed Xet fetch's bytes written past its last
//!   checkpoint kept on resume where their recorded chunk hashes match (one
//!   stream, two ranges, a byte changed after the kill, a resume aborted
//!   between proving and claiming).
//! * `xet_bad_input`: Xet answers that lie (terms that do not add up, a
//!   term past its xorb's chunks, a truncated, shifted or expired xorb
//!   range, a refused token, a huge or endless read-token answer).
//! * `xet_delta`: after a repin (or with `--reuse-from OTHER_DIR`), Xet
//!   terms whose chunks the old files hold are read back from them and
//!   checked, only the new chunks fetched; a changed old file is fetched
//!   instead; a kill storm over a reusing repin.
//! * `xet_ranges`: a Xet file's busy ranges capped at the cores, counted
//!   as xorb requests in flight at the proxy.
//!
//! All modules share one process, and libtest runs their tests side by side
//! (`available_parallelism` threads, as it did within each former binary).
//! So nothing here may depend on being alone in the process: no test sets
//! an environment variable, the current directory or a signal handler of
//! the test process (the binary under test gets its settings on its
//! `Command`); every server binds port 0 on loopback (nginx probes for a
//! free port and retries); scratch paths are temp dirs, each tmux server
//! has a socket of its own, and `powercut`'s FUSE filesystem, served by
//! threads of this process, is mounted on a temp dir only its own runs use.
//!
//! The rule for load: a test that times SIGKILLs or power cuts against its
//! own calibration run, or drives an external server or client (nginx,
//! `hf download`), starts with `let _heavy = common::heavy();`; a test that
//! asserts a tight wall-clock bound starts with `let _time_bounded =
//! common::time_bounded();`. A heavy test then runs beside light tests only,
//! never beside another heavy or a time-bounded one, as when every file was
//! a test binary of its own (and heavy tests of one file, which used to run
//! side by side, now run one after the other). Today's heavy tests: the kill
//! storms of `crash`, `chain_crash`, `segmented`, `convert_crash` and `s3_crash`,
//! `powercut`, `nginx` and every `hf_cache` test; time-bounded: the three
//! `faults` tests with a deadline and `disk_full`'s two fills within a
//! 1.5 s stall.

// Dev-dependencies are shared by every test and bench target of a package, so
// an unused one here is not a finding; the lint stays on for libraries and binaries.
#![allow(unused_crate_dependencies)]
// Tests build their inputs (and damage ftpipe's files) with plain `std::fs`
// calls (clippy.toml).
#![allow(clippy::disallowed_methods)]

mod common;

mod attempts;
mod audit_bundle;
mod bad_input;
mod budget_spans;
mod budgeted_powercut;
mod budgeted_ranges;
mod budgeted_run;
mod chain_crash;
mod checkpoint_cadence;
mod cli_docs;
mod conformance;
mod convert;
mod convert_bad_input;
mod convert_crash;
mod convert_exclude;
mod convert_identity;
mod convert_modelopt;
mod convert_release;
mod convert_retire;
mod copy_aside;
mod crash;
mod demo;
mod digest_read_back;
mod disk_budget;
mod disk_full;
mod error_advice;
mod faults;
mod fetch_basic;
mod hardening;
mod hf_cache;
mod human_output;
mod incremental_rebuild;
mod inspect;
mod interrupt;
mod limits;
mod nginx;
mod no_progress;
mod oci;
mod oci_more;
mod plan;
mod plan_real_geometry;
mod powercut;
mod recipe;
mod s3;
mod s3_crash;
mod s3_credentials;
mod s3_mirror;
mod s3_powercut;
mod s3_publish_shape;
mod s3_pull_verify;
mod s3_reuse;
mod security;
mod segmented;
mod symlinks;
mod token_echo;
mod transfers_lead;
mod tty_progress;
mod verify;
mod xet_bad_input;
mod xet_delta;
mod xet_ranges;
mod xet_source;
mod xet_tail;
