//! The convert side of a budgeted, pipelined build (issue 28): what happens
//! when a source file is verified, and when a file may be deleted.
//!
//! [`StreamConverter::published`] writes the spans a verified file feeds
//! into every FTW and FTEXPERT1 component it reads, durably
//! ([`crate::placed::write_file_into_all`]), and finishes each component
//! whose last span came in. Q3 components wait for
//! [`StreamConverter::q3_job`], run once every PLE file is published
//! (the global scale is the absmax of the whole table): scales first, then
//! the segments encoded under their scales read back. A file is
//! [`StreamConverter::retirable`] once no unfinished component needs it
//! and, for a PLE file, the Q3 components are written: the rule
//! [`crate::schedule`] assumes. The fetch side (admission under the budget,
//! verification) and the receipts of finished components are the caller's.
//!
//! After a crash, [`StreamConverter::open`] resumes every unfinished
//! component from its span claims; the caller hands it each file verified
//! before the crash again: [`StreamConverter::published`] for one still on
//! disk (writing only what was not claimed), [`StreamConverter::retired`]
//! for one already deleted (which no unfinished component may still need).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use tokio::task::block_in_place;

use ftpipe_receipts::{RunId, Store};

use crate::component::{Component, ComponentContent, ComponentKind};
use crate::error::{ConvertError, Result, RetiredBy};
use crate::placed::{
    SpanWriter, create_component_dir, in_threads, open_durable, recover_renamed,
    write_file_into_all,
};
use crate::plan::Plan;
use crate::write::{Sources, Written, read_global_scale, write_component, write_component_with};

/// Components finished (read back for their digest) at once.
const FINISH_THREADS: usize = 4;

/// The components of a plan being written as their sources arrive.
pub struct StreamConverter<'p> {
    plan: &'p Plan,
    artifact: PathBuf,
    /// Unfinished FTW / FTEXPERT1 components with their identity.
    writers: Vec<(SpanWriter<'p>, String)>,
    /// Components renamed before a crash without their receipt, found
    /// whole at open ([`recover_renamed`]); handed out by the next
    /// [`StreamConverter::finish_complete`].
    recovered: Vec<(String, Written)>,
    /// Every file holding a span of a Q3 component.
    ple_files: BTreeSet<&'p str>,
    published: BTreeSet<String>,
    q3_written: bool,
}

impl<'p> StreamConverter<'p> {
    /// Opens (resuming from their span claims) the writers of every FTW
    /// and FTEXPERT1 component of `plan` not in `done`, each under the
    /// identity `identity` gives it.
    pub async fn open(
        store: &Store,
        artifact: &Path,
        plan: &'p Plan,
        done: &BTreeSet<String>,
        identity: impl Fn(&Component) -> String,
    ) -> Result<StreamConverter<'p>> {
        let mut writers = Vec::new();
        let mut recovered = Vec::new();
        let mut ple_files = BTreeSet::new();
        let claimed = store.components_with_span_claims().await?;
        // Each directory made durable once, not once per component in it.
        let mut dirs = BTreeSet::new();
        for c in &plan.components {
            if is_q3(c) {
                ple_files.extend(c.source_files.iter().map(String::as_str));
            } else if !done.contains(&c.name) {
                let id = identity(c);
                if !claimed.contains(&c.name) {
                    // Nothing claimed: nothing to recover or resume, and
                    // no claim to forget (one query for all, not two per
                    // component).
                    let writer = block_in_place(|| {
                        let dir = Path::new(&c.name).parent().map(Path::to_owned);
                        if dirs.insert(dir) {
                            create_component_dir(artifact, c)?;
                        }
                        SpanWriter::create_in_dir(artifact, c)
                    })?;
                    writers.push((writer, id));
                    continue;
                }
                match recover_renamed(store, artifact, c, &id).await? {
                    Some(w) => recovered.push((c.name.clone(), w)),
                    None => writers.push((open_durable(store, artifact, c, &id).await?, id)),
                }
            }
        }
        let q3_written = plan
            .components
            .iter()
            .filter(|c| is_q3(c))
            .all(|c| done.contains(&c.name));
        Ok(StreamConverter {
            plan,
            artifact: artifact.to_owned(),
            writers,
            recovered,
            ple_files,
            published: BTreeSet::new(),
            q3_written,
        })
    }

    /// After a restart: `file` was verified and then retired by an earlier
    /// process. Refused, naming the component, if an unfinished component
    /// still needs a span of it (the schedule never retires such a file:
    /// its spans were claimed before it was deleted).
    pub fn retired(&mut self, file: &str) -> Result<()> {
        if let Some((w, _)) = self.writers.iter().find(|(w, _)| w.needs(file)) {
            return Err(ConvertError::SourceRetired {
                component: w.name().to_owned(),
                source_file: file.to_owned(),
                run: RetiredBy(None),
            });
        }
        self.published.insert(file.to_owned());
        Ok(())
    }

    /// After a restart: `file` was verified, converted and punched down to
    /// its PLE spans by an earlier process. Refused, naming the component,
    /// if an unfinished component still needs a span of it (the run
    /// punches a file only once its spans are claimed).
    pub fn punched(&mut self, file: &str) -> Result<()> {
        if let Some((w, _)) = self.writers.iter().find(|(w, _)| w.needs(file)) {
            return Err(ConvertError::SourcePunched {
                component: w.name().to_owned(),
                source_file: file.to_owned(),
            });
        }
        self.published.insert(file.to_owned());
        Ok(())
    }

    /// `file` may be punched down to its PLE spans: it is a published PLE
    /// file, the Q3 components are not written yet (else it is retired
    /// instead), and no unfinished component needs any other span of it.
    pub fn punchable(&self, file: &str) -> bool {
        self.published.contains(file)
            && !self.q3_written
            && self.ple_files.contains(file)
            && !self.writers.iter().any(|(w, _)| w.needs(file))
    }

    /// Source `file` is verified: its spans are written into every
    /// unfinished component reading it; returns the components it
    /// completed (durable and renamed; their receipts are the caller's).
    pub async fn published(
        &mut self,
        store: &Store,
        run: RunId,
        sources: &Sources,
        file: &str,
    ) -> Result<Vec<(String, Written)>> {
        self.published.insert(file.to_owned());
        write_file_into_all(store, run, &mut self.writers, sources, file).await?;
        self.finish_complete()
    }

    /// Finishes every component whose spans are all in (one that reads
    /// no span, or one completed before a restart): durable and renamed,
    /// their receipts are the caller's.
    pub fn finish_complete(&mut self) -> Result<Vec<(String, Written)>> {
        let (complete, open): (Vec<_>, Vec<_>) = std::mem::take(&mut self.writers)
            .into_iter()
            .partition(|(w, _)| w.is_complete());
        self.writers = open;
        let artifact = &self.artifact;
        let mut finished = std::mem::take(&mut self.recovered);
        // Each is read back for its digest: FINISH_THREADS at a time.
        let done = block_in_place(|| {
            in_threads(complete, FINISH_THREADS, "component finish", |(w, _)| {
                let name = w.name().to_owned();
                w.finish(artifact).map(|written| (name, written))
            })
        });
        for d in done {
            finished.push(d?);
        }
        Ok(finished)
    }

    /// Q3 components are written (or there are none).
    pub fn q3_written(&self) -> bool {
        self.q3_written
    }

    /// Every PLE file is published (so `G` can be computed).
    pub fn q3_ready(&self) -> bool {
        self.ple_files.iter().all(|f| self.published.contains(*f))
    }

    /// Whether every PLE file is in once `file` is.
    pub fn q3_ready_with(&self, file: &str) -> bool {
        self.ple_files
            .iter()
            .all(|f| *f == file || self.published.contains(*f))
    }

    /// The job that writes every Q3 component without a receipt in `done`
    /// (name → SHA-256), owning what it reads so it can run beside the
    /// span writes; call once every PLE file is verified
    /// ([`Self::q3_ready_with`]), then [`Self::q3_done`] once its
    /// components are receipted. A global scale in `absmax` (component →
    /// absolute max of its whole table, every element checked finite) is
    /// computed from it instead of reading the table again.
    pub fn q3_job(
        &self,
        sources: &Sources,
        done: BTreeMap<String, String>,
        absmax: BTreeMap<String, f32>,
    ) -> Q3Job {
        Q3Job {
            components: self
                .plan
                .components
                .iter()
                .filter(|c| is_q3(c))
                .cloned()
                .collect(),
            artifact: self.artifact.clone(),
            sources: sources.clone(),
            done,
            absmax,
        }
    }

    /// The Q3 components are receipted: PLE files may be retired.
    pub fn q3_done(&mut self) {
        self.q3_written = true;
    }

    /// `file` may be deleted: no unfinished component needs it, and a PLE
    /// file waits for the Q3 components.
    pub fn retirable(&self, file: &str) -> bool {
        self.published.contains(file)
            && (self.q3_written || !self.ple_files.contains(file))
            && !self.writers.iter().any(|(w, _)| w.needs(file))
    }
}

/// The Q3 components of a plan still to write, with what they read.
pub struct Q3Job {
    components: Vec<Component>,
    artifact: PathBuf,
    sources: Sources,
    done: BTreeMap<String, String>,
    absmax: BTreeMap<String, f32>,
}

impl Q3Job {
    /// Writes (blocking) the global scales first, then the segments under
    /// their scales read back from disk and checked against their
    /// digests, `FINISH_THREADS` segments at a time (encoding is the
    /// costly part); returns the components renamed into place, whose
    /// receipts are the caller's.
    pub fn run(self) -> Result<Vec<(String, Written)>> {
        let (sources, artifact) = (&self.sources, self.artifact.as_path());
        let of = |k: ComponentKind| self.components.iter().filter(move |c| c.kind == k);
        let mut written = Vec::new();
        let mut scales = BTreeMap::new();
        for c in of(ComponentKind::Q3GlobalScale) {
            let sha = match self.done.get(&c.name) {
                Some(sha) => sha.clone(),
                None => {
                    let known = self.absmax.get(&c.name).copied();
                    let w = write_component_with(sources, artifact, c, &scales, known)?;
                    let sha = w.sha256.clone();
                    written.push((c.name.clone(), w));
                    sha
                }
            };
            if let ComponentContent::Q3GlobalScale { layer, .. } = c.content {
                scales.insert(layer, read_global_scale(artifact, &c.name, &sha)?);
            }
        }
        let segments: Vec<&Component> = of(ComponentKind::Q3Segment)
            .filter(|c| !self.done.contains_key(&c.name))
            .collect();
        let results = in_threads(segments.clone(), FINISH_THREADS, "Q3 segment write", |c| {
            write_component(sources, artifact, c, &scales)
        });
        for (c, w) in segments.iter().zip(results) {
            written.push((c.name.clone(), w?));
        }
        Ok(written)
    }
}

fn is_q3(c: &Component) -> bool {
    matches!(
        c.kind,
        ComponentKind::Q3Segment | ComponentKind::Q3GlobalScale
    )
}

#[cfg(test)]
mod tests;
