//! The order of work under a disk budget (`--disk-budget`): when each
//! source file is fetched, converted and retired, so that the source bytes
//! held on disk never exceed the budget. Pure: computed from the plan
//! (headers only) before a shard body is fetched, so a budget that cannot
//! work is refused first, naming the minimum.
//!
//! Why this order:
//!
//! - A file's digest covers the whole file, so nothing is converted from a
//!   file before it is verified; once it is, every span it feeds is
//!   written at its planned offset in its component's temp file, and the
//!   file is retired as soon as those spans are durable.
//! - Q3_PLE_32 encodes every segment under `G`, the absmax of the whole PLE
//!   table (docs/formats.md), so no segment is written before every PLE
//!   span was read once. A file holding any span of a Q3 component (a *PLE
//!   file*) therefore keeps its PLE spans until the last PLE file is
//!   verified and the table is written. Once a PLE file is converted, the
//!   rest of it is punched out ([`crate::keep`]): it holds only its *kept*
//!   bytes (header and PLE spans, in whole allocation units) until it is
//!   retired. On a volume that cannot punch holes its PLE spans are
//!   copied aside and the file released whole: it holds the copy's bytes,
//!   and, from its admission until it is released, the copy beside the
//!   whole file (counted from admission, so the copy always fits).
//!   PLE files are fetched first, those with the most bytes to punch
//!   first: while they are held the artifact is still small, and they are
//!   gone before most of it is written.
//! - A file that feeds no component (only tensors the artifact omits,
//!   such as the vision tower) is fetched, verified and retired right
//!   after the PLE files, while the artifact is still small.
//! - Admission is head of line in that order (PLE files, files feeding
//!   nothing, then the others; the two last groups in plan order): the
//!   next file starts only while the bytes held plus its size fit the
//!   budget. Held bytes are the *resident* files (config, index and any
//!   other selected file that is not a shard: never retired), every
//!   admitted file not yet converted, a `.part` counted at its full size
//!   from its first byte, and the kept bytes of every converted PLE file
//!   not yet retired.
//!
//! The minimum feasible budget is `resident + max(max_k (Σ_{j<k} kept_j +
//! size_k), largest other file)` over the PLE files in fetch order: PLE
//! file `k` is fetched whole while the files before it keep their PLE
//! spans, and no segment can be written (so no PLE file retired) before
//! the last one is in; the largest other file can only ever be held whole.
//! Fetching first the files with the most bytes to punch (`size − kept`
//! descending) makes that maximum the smallest any order gives (an
//! exchange of two neighbours out of that order never lowers it), and it
//! is at most the kept bytes of every PLE file plus the largest one. At it
//! the schedule completes (each PLE file fits beside what the earlier ones
//! keep, then every other file fits alone), so for span retirement it is
//! the floor, not an estimate. Copied aside, `size_k` is `size_k +
//! kept_k` (the copy is made before the file goes) and the order is by
//! size descending, by the same exchange argument. Held whole (`kept =
//! size`) it is the old
//! `resident + max(Σ PLE files, largest other file)`.
//!
//! The predicted peak is the maximum over the schedule of held source
//! bytes plus artifact bytes written so far. A component's bytes are
//! attributed to the files it reads in proportion to the source bytes of
//! its spans in each (its temp file is written at planned offsets, so it
//! grows as spans arrive); the Q3 components' bytes count when the table
//! is written. The simulation completes files in the order they were
//! admitted; a real run may complete them in another order, which moves
//! the peak of held + artifact a little but never the held bytes above the
//! budget: admission alone bounds them.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::Serialize;

use crate::component::{ComponentContent, SourceSpan};
use crate::error::{ConvertError, Result};
use crate::keep::{Release, kept_of_plan};
use crate::plan::Plan;

/// One source file as the schedule sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ScheduledFile {
    /// Repo-relative path.
    pub file: String,
    /// Its size (what it holds on disk from its first byte to retirement).
    pub bytes: u64,
    /// Holds a span of a Q3 component: keeps them until the table is
    /// written.
    pub ple: bool,
    /// What a PLE file still holds once converted (its kept ranges, or
    /// its size when held whole); its size for any other file.
    pub kept: u64,
    /// Artifact bytes attributed to it: written when it is converted.
    pub artifact_bytes: u64,
}

/// What the schedule orders: files in fetch order and the bytes that do
/// not belong to one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    /// How a converted PLE file's other bytes leave the disk.
    pub release: Release,
    /// The kept ranges of every PLE file (empty for whole files).
    pub kept: BTreeMap<String, Vec<crate::keep::Range>>,
    /// Source bytes held from the start and never retired (config, index,
    /// every selected file that is not a planned shard).
    pub resident: u64,
    /// The planned shards in fetch order: PLE files first, then files
    /// feeding no component, then the others, each group in plan order.
    pub files: Vec<ScheduledFile>,
    /// Bytes of every Q3 component (segments and global scales), written
    /// once the last PLE file is converted.
    pub q3_bytes: u64,
    /// Bytes of components that read no source span (written first).
    pub upfront_bytes: u64,
}

/// One step of a schedule; indices are into [`Workload::files`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    /// The file is admitted: its fetch starts.
    Fetch(usize),
    /// The file is verified and every non-Q3 span it feeds written.
    Convert(usize),
    /// A converted PLE file's other bytes are punched out: it holds its
    /// kept bytes only.
    Keep(usize),
    /// Every PLE span was read: `G` is known, the Q3 components are written.
    WriteQ3,
    /// The file is deleted.
    Retire(usize),
}

/// A simulated schedule under one budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    /// The budget it respects.
    pub budget: u64,
    /// Every step, in order.
    pub steps: Vec<Step>,
    /// Maximum of held source bytes + artifact bytes written so far.
    pub peak: u64,
    /// Maximum of held source bytes alone (≤ `budget`).
    pub peak_held: u64,
}

/// What `plan --disk-budget` reports (also in its `--json`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BudgetReport {
    /// The budget, in bytes.
    pub budget: u64,
    /// The smallest budget a schedule completes under: converted PLE
    /// files keep their spans only (or are held whole, see `release`).
    pub minimum_budget: u64,
    /// The schedule's peak of source bytes held + artifact written so far.
    pub predicted_peak: u64,
    /// The schedule's peak of source bytes held alone.
    pub predicted_peak_sources: u64,
    /// Today's peak without a budget: every source and the whole artifact.
    pub unbudgeted_peak: u64,
    /// `predicted_peak / unbudgeted_peak`.
    pub peak_ratio: f64,
    /// Source bytes held throughout (config, index, other files).
    pub resident_bytes: u64,
    /// Files holding a PLE span, held until the Q3 table is written.
    pub ple_files: usize,
    /// Their bytes.
    pub ple_bytes: u64,
    /// The largest file that holds no PLE span.
    pub largest_other_bytes: u64,
    /// The kept bytes of the PLE files once converted (their PLE spans
    /// and headers in whole allocation units; `ple_bytes` when held whole).
    pub ple_kept_bytes: u64,
    /// How a converted PLE file's other bytes leave the disk.
    pub release: ReleaseKind,
    /// The allocation unit holes are punched in (0 unless `spans`).
    pub allocation_unit: u64,
    /// The shards in fetch order.
    pub fetch_order: Vec<String>,
}

/// How `plan` says a converted PLE file's other bytes leave the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReleaseKind {
    /// Punched out: the file keeps its PLE spans in place.
    Spans,
    /// The volume cannot punch holes: the PLE spans are copied aside and
    /// the file released whole.
    CopyAside,
    /// Held whole until the Q3 table is written.
    WholeFiles,
}

/// Σ `sizes`, saturating: sizes come from a listing (each at most
/// i64::MAX), and a sum past u64 is "more than any disk" either way.
fn saturating_sum(sizes: impl Iterator<Item = u64>) -> u64 {
    sizes.fold(0, u64::saturating_add)
}

/// `bytes` for people: the one formatter, [`ftpipe_progress::human::bytes`].
pub use ftpipe_progress::human::bytes as shown;

impl Workload {
    /// The workload of `plan`, with `resident` bytes of other files held
    /// throughout and converted PLE files released as `release` allows.
    pub fn of_plan(plan: &Plan, resident: u64, release: Release) -> Workload {
        let mut attributed: BTreeMap<&str, u64> = BTreeMap::new();
        let (mut q3_bytes, mut upfront_bytes) = (0u64, 0u64);
        let mut ple: BTreeSet<&str> = BTreeSet::new();
        for c in &plan.components {
            let spans: Vec<&SourceSpan> = match &c.content {
                ComponentContent::Q3Segment { .. } | ComponentContent::Q3GlobalScale { .. } => {
                    q3_bytes += c.predicted_bytes;
                    ple.extend(c.source_files.iter().map(String::as_str));
                    continue;
                }
                ComponentContent::Ftw { tensors } => {
                    tensors.iter().flat_map(|t| t.source.spans()).collect()
                }
                ComponentContent::Experts { records, .. } => {
                    records.iter().flatten().flat_map(|s| s.spans()).collect()
                }
            };
            if !share(c.predicted_bytes, &spans, &mut attributed) {
                upfront_bytes += c.predicted_bytes;
            }
        }
        let kept = kept_of_plan(plan, release).unwrap_or_default();
        let file = |s: &crate::plan::PlannedSource| ScheduledFile {
            file: s.file.clone(),
            bytes: s.bytes,
            ple: ple.contains(s.file.as_str()),
            kept: kept
                .get(&s.file)
                .map_or(s.bytes, |r| release.held(r, s.bytes)),
            artifact_bytes: attributed.get(s.file.as_str()).copied().unwrap_or(0),
        };
        let (mut files, others): (Vec<_>, Vec<_>) =
            plan.sources.iter().map(file).partition(|f| f.ple);
        // Most bytes released first (stable: plan order among equals):
        // punched, size − kept; copied aside, the size (the copy is held
        // beside the file until it is released).
        files.sort_by_key(|f| std::cmp::Reverse(release.peak(f.bytes, f.kept) - f.kept));
        let (idle, feeding): (Vec<_>, Vec<_>) =
            others.into_iter().partition(|f| f.artifact_bytes == 0);
        files.extend(idle);
        files.extend(feeding);
        Workload {
            release,
            kept,
            resident,
            files,
            q3_bytes,
            upfront_bytes,
        }
    }

    /// The most `f` holds at once: a PLE file copied aside holds its copy
    /// beside the whole file until the file is released.
    pub fn peak_of(&self, f: &ScheduledFile) -> u64 {
        if f.ple {
            self.release.peak(f.bytes, f.kept)
        } else {
            f.bytes
        }
    }

    /// What admitting shard `file` of `size` bytes reserves: its
    /// [`Self::peak_of`] (`size` for a file the schedule does not know).
    pub fn admitted_bytes(&self, file: &str, size: u64) -> u64 {
        self.files
            .iter()
            .find(|f| f.file == file)
            .map_or(size, |f| self.peak_of(f).max(size))
    }

    /// Σ kept bytes of the PLE files.
    pub fn ple_kept_bytes(&self) -> u64 {
        saturating_sum(self.files.iter().filter(|f| f.ple).map(|f| f.kept))
    }

    /// The most source bytes the PLE files hold at once, with the file
    /// fetched then: `max_k (Σ_{j<k} kept_j + size_k)` in fetch order
    /// (`+ kept_k` when copied aside: the copy beside the file).
    pub fn ple_peak(&self) -> (u64, Option<&ScheduledFile>) {
        let mut before = 0u64;
        let mut peak = (0u64, None);
        for f in self.files.iter().filter(|f| f.ple) {
            let at = before.saturating_add(self.peak_of(f));
            if at > peak.0 {
                peak = (at, Some(f));
            }
            before = before.saturating_add(f.kept);
        }
        peak
    }

    /// Bytes of the PLE files.
    pub fn ple_bytes(&self) -> u64 {
        saturating_sum(self.files.iter().filter(|f| f.ple).map(|f| f.bytes))
    }

    /// The largest file holding no PLE span.
    pub fn largest_other(&self) -> u64 {
        self.files
            .iter()
            .filter(|f| !f.ple)
            .map(|f| f.bytes)
            .max()
            .unwrap_or(0)
    }

    /// The smallest budget the schedule completes under (see the module
    /// documentation for why no schedule does with less).
    pub fn minimum_budget(&self) -> u64 {
        self.resident
            .saturating_add(self.ple_peak().0.max(self.largest_other()))
    }

    /// Every source and the whole artifact on disk at once: today's peak.
    pub fn unbudgeted_peak(&self) -> u64 {
        let sources = saturating_sum(self.files.iter().map(|f| f.bytes));
        self.resident
            .saturating_add(sources)
            .saturating_add(self.artifact_bytes())
    }

    /// Every artifact byte.
    pub fn artifact_bytes(&self) -> u64 {
        saturating_sum(self.files.iter().map(|f| f.artifact_bytes))
            .saturating_add(self.q3_bytes)
            .saturating_add(self.upfront_bytes)
    }

    /// Why the minimum is what it is, for the refusal.
    fn minimum_reason(&self) -> String {
        let (ple, at) = self.ple_peak();
        let other = self.largest_other();
        let what = if ple >= other {
            let n = self.files.iter().filter(|f| f.ple).count();
            match (self.release, at) {
                (Release::Spans { .. }, Some(f)) => format!(
                    "the {n} file(s) holding the PLE table keep their PLE spans until its global scale is known, and {} ({}) is fetched whole while the files before it keep {}",
                    f.file,
                    shown(f.bytes),
                    shown(ple - f.bytes)
                ),
                (Release::CopyAside, Some(f)) => format!(
                    "the {n} file(s) holding the PLE table keep copies of their PLE spans until its global scale is known (this volume cannot punch holes), and {} ({}) is held whole beside its copy ({}) while the files before it keep {}",
                    f.file,
                    shown(f.bytes),
                    shown(f.kept),
                    shown(ple - f.bytes - f.kept)
                ),
                _ => format!(
                    "the {n} file(s) holding the PLE table ({}) are all held until its global scale is known",
                    shown(ple)
                ),
            }
        } else {
            let name = self
                .files
                .iter()
                .filter(|f| !f.ple)
                .max_by_key(|f| f.bytes)
                .map_or("", |f| f.file.as_str());
            format!("the largest file, {name}, has {}", shown(other))
        };
        format!(
            "{what}, beside {} of config, index and other files kept throughout",
            shown(self.resident)
        )
    }

    /// The schedule under `budget`, refused below [`Self::minimum_budget`].
    pub fn simulate(&self, budget: u64) -> Result<Schedule> {
        let minimum = self.minimum_budget();
        if budget < minimum {
            return Err(ConvertError::DiskBudgetTooSmall {
                budget,
                budget_shown: shown(budget),
                minimum,
                minimum_shown: shown(minimum),
                why: self.minimum_reason(),
            });
        }
        let mut sim = Simulation::new(self, budget);
        sim.run();
        if sim.next < self.files.len() || !sim.in_flight.is_empty() {
            return Err(ConvertError::internal(format!(
                "the disk-budget schedule stopped at file {} of {} under a feasible budget of {budget} bytes",
                sim.next,
                self.files.len()
            )));
        }
        Ok(Schedule {
            budget,
            steps: sim.steps,
            peak: sim.peak,
            peak_held: sim.peak_held,
        })
    }

    /// The report of `plan --disk-budget`.
    pub fn report(&self, budget: u64) -> Result<BudgetReport> {
        let s = self.simulate(budget)?;
        let unbudgeted = self.unbudgeted_peak();
        Ok(BudgetReport {
            budget,
            minimum_budget: self.minimum_budget(),
            predicted_peak: s.peak,
            predicted_peak_sources: s.peak_held,
            unbudgeted_peak: unbudgeted,
            peak_ratio: if unbudgeted == 0 {
                1.0
            } else {
                s.peak as f64 / unbudgeted as f64
            },
            resident_bytes: self.resident,
            ple_files: self.files.iter().filter(|f| f.ple).count(),
            ple_bytes: self.ple_bytes(),
            largest_other_bytes: self.largest_other(),
            ple_kept_bytes: self.ple_kept_bytes(),
            release: match self.release {
                Release::WholeFiles => ReleaseKind::WholeFiles,
                Release::CopyAside => ReleaseKind::CopyAside,
                Release::Spans { .. } => ReleaseKind::Spans,
            },
            allocation_unit: match self.release {
                Release::WholeFiles | Release::CopyAside => 0,
                Release::Spans { unit } => unit,
            },
            fetch_order: self.files.iter().map(|f| f.file.clone()).collect(),
        })
    }
}

/// Adds `total` to `out`, split over the files of `spans` in proportion
/// to their span bytes (the remainder to the file with the most); false
/// when the spans hold no byte.
fn share<'a>(total: u64, spans: &[&'a SourceSpan], out: &mut BTreeMap<&'a str, u64>) -> bool {
    let mut per_file: BTreeMap<&str, u64> = BTreeMap::new();
    for s in spans {
        *per_file.entry(&*s.file).or_default() += s.len;
    }
    let sum: u64 = per_file.values().sum();
    let Some((&largest, _)) = per_file.iter().max_by_key(|&(_, &len)| len) else {
        return false;
    };
    if sum == 0 {
        *out.entry(largest).or_default() += total;
        return true;
    }
    let mut given = 0u64;
    for (&file, &len) in &per_file {
        let part = u128::from(total) * u128::from(len) / u128::from(sum);
        let part = u64::try_from(part).unwrap_or(u64::MAX);
        given += part;
        *out.entry(file).or_default() += part;
    }
    *out.entry(largest).or_default() += total - given;
    true
}

/// The state of one simulated run.
struct Simulation<'a> {
    w: &'a Workload,
    budget: u64,
    held: u64,
    artifact: u64,
    next: usize,
    in_flight: VecDeque<usize>,
    /// What each file holds now.
    holding: Vec<u64>,
    ple_left: usize,
    steps: Vec<Step>,
    peak: u64,
    peak_held: u64,
}

impl<'a> Simulation<'a> {
    fn new(w: &'a Workload, budget: u64) -> Self {
        let ple_left = w.files.iter().filter(|f| f.ple).count();
        // Without a PLE file the Q3 bytes (none in practice) go first.
        let q3_now = if ple_left == 0 { w.q3_bytes } else { 0 };
        let mut sim = Simulation {
            w,
            budget,
            held: w.resident,
            artifact: w.upfront_bytes.saturating_add(q3_now),
            next: 0,
            in_flight: VecDeque::new(),
            holding: vec![0; w.files.len()],
            ple_left,
            steps: Vec::new(),
            peak: 0,
            peak_held: 0,
        };
        sim.note();
        sim
    }

    fn note(&mut self) {
        self.peak = self.peak.max(self.held.saturating_add(self.artifact));
        self.peak_held = self.peak_held.max(self.held);
    }

    fn run(&mut self) {
        loop {
            self.admit();
            let Some(i) = self.in_flight.pop_front() else {
                return;
            };
            self.convert(i);
        }
    }

    /// Starts files head of line while they fit.
    fn admit(&mut self) {
        while let Some(f) = self.w.files.get(self.next) {
            let bytes = self.w.peak_of(f);
            if self.held.saturating_add(bytes) > self.budget {
                return;
            }
            self.held = self.held.saturating_add(bytes);
            self.holding[self.next] = bytes;
            self.steps.push(Step::Fetch(self.next));
            self.in_flight.push_back(self.next);
            self.next += 1;
            self.note();
        }
    }

    /// File `i` verified: its spans written, then whatever may retire.
    fn convert(&mut self, i: usize) {
        let f = &self.w.files[i];
        self.artifact = self.artifact.saturating_add(f.artifact_bytes);
        self.steps.push(Step::Convert(i));
        self.note();
        if !f.ple {
            self.retire(i);
            return;
        }
        if f.kept < self.holding[i] {
            self.held -= self.holding[i] - f.kept;
            self.holding[i] = f.kept;
            self.steps.push(Step::Keep(i));
        }
        self.ple_left -= 1;
        if self.ple_left > 0 {
            return;
        }
        self.artifact = self.artifact.saturating_add(self.w.q3_bytes);
        self.steps.push(Step::WriteQ3);
        self.note();
        for j in 0..self.w.files.len() {
            if self.w.files[j].ple {
                self.retire(j);
            }
        }
    }

    fn retire(&mut self, i: usize) {
        self.held -= std::mem::take(&mut self.holding[i]);
        self.steps.push(Step::Retire(i));
    }
}

#[cfg(test)]
mod tests;
