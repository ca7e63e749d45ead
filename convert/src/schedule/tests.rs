//! The schedule under a disk budget: the held source bytes never exceed the
//! budget, every file is fetched, converted and retired exactly once in
//! that order, the Q3 table is written only after every PLE file was
//! converted and before any PLE file is retired, and a budget below the
//! minimum is refused naming it (proptest over random workloads, plus
//! worked examples).

use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::component::{Component, ComponentKind, FtwTensor, TensorSource};
use crate::plan::PlannedSource;

fn file(name: &str, bytes: u64, ple: bool, artifact: u64) -> ScheduledFile {
    kept_file(name, bytes, ple, bytes, artifact)
}

fn kept_file(name: &str, bytes: u64, ple: bool, kept: u64, artifact: u64) -> ScheduledFile {
    ScheduledFile {
        file: name.into(),
        bytes,
        ple,
        kept,
        artifact_bytes: artifact,
    }
}

/// A workload of `files` (in fetch order) released span by span.
fn spans(resident: u64, files: Vec<ScheduledFile>, q3_bytes: u64, upfront: u64) -> Workload {
    Workload {
        release: Release::Spans { unit: 1 },
        kept: BTreeMap::new(),
        resident,
        files,
        q3_bytes,
        upfront_bytes: upfront,
    }
}

/// Replays `s` over `w`: checks every rule of the module and returns the
/// artifact bytes at the end.
fn check_schedule(w: &Workload, s: &Schedule) -> u64 {
    let n = w.files.len();
    let (mut fetched, mut converted, mut retired) =
        (vec![false; n], vec![false; n], vec![false; n]);
    let (mut held, mut artifact) = (w.resident, w.upfront_bytes);
    let mut holding = vec![0u64; n];
    let has_ple = w.files.iter().any(|f| f.ple);
    if !has_ple {
        artifact += w.q3_bytes;
    }
    let (mut q3_written, mut peak, mut peak_held) = (false, held + artifact, held);
    for step in &s.steps {
        match *step {
            Step::Fetch(i) => {
                assert!(!fetched[i], "file {i} fetched twice");
                fetched[i] = true;
                held += w.files[i].bytes;
                holding[i] = w.files[i].bytes;
            }
            Step::Convert(i) => {
                assert!(
                    fetched[i] && !converted[i],
                    "file {i} converted out of order"
                );
                converted[i] = true;
                artifact += w.files[i].artifact_bytes;
            }
            Step::Keep(i) => {
                assert!(converted[i] && w.files[i].ple && holding[i] == w.files[i].bytes);
                held -= w.files[i].bytes - w.files[i].kept;
                holding[i] = w.files[i].kept;
            }
            Step::WriteQ3 => {
                assert!(!q3_written && has_ple);
                let all = w.files.iter().zip(&converted).all(|(f, &c)| !f.ple || c);
                assert!(all, "Q3 written before every PLE file was converted");
                q3_written = true;
                artifact += w.q3_bytes;
            }
            Step::Retire(i) => {
                assert!(converted[i] && !retired[i], "file {i} retired out of order");
                assert!(
                    !w.files[i].ple || q3_written,
                    "PLE file {i} retired before Q3"
                );
                retired[i] = true;
                held -= holding[i];
            }
        }
        assert!(held <= s.budget, "held {held} over budget {}", s.budget);
        peak = peak.max(held + artifact);
        peak_held = peak_held.max(held);
    }
    assert!(fetched.iter().chain(&converted).chain(&retired).all(|&b| b));
    assert_eq!(q3_written, has_ple);
    assert_eq!((peak, peak_held), (s.peak, s.peak_held));
    assert_eq!(held, w.resident);
    artifact
}

fn workload() -> impl Strategy<Value = Workload> {
    let f = (1u64..10_000, any::<bool>(), 0u64..=100, 0u64..10_000);
    (
        0u64..1_000,
        proptest::collection::vec(f, 0..24),
        0u64..20_000,
        0u64..100,
    )
        .prop_map(|(resident, fs, q3, upfront)| {
            let mut files: Vec<ScheduledFile> = fs
                .into_iter()
                .enumerate()
                .map(|(i, (b, p, pct, a))| {
                    let kept = if p { b * pct / 100 } else { b };
                    kept_file(&format!("f{i}"), b, p, kept, a)
                })
                .collect();
            files.sort_by_key(|f| (!f.ple, std::cmp::Reverse(f.bytes - f.kept)));
            spans(resident, files, q3, upfront)
        })
}

proptest! {
    #[test]
    fn a_schedule_never_exceeds_its_budget(w in workload(), extra in 0u64..50_000) {
        let min = w.minimum_budget();
        let s = w.simulate(min + extra).unwrap();
        let end = check_schedule(&w, &s);
        prop_assert_eq!(end, w.artifact_bytes());
        prop_assert!(s.peak >= w.resident + w.artifact_bytes());
        prop_assert!(s.peak <= w.unbudgeted_peak());
    }

    #[test]
    fn below_the_minimum_is_refused_naming_it(w in workload()) {
        let min = w.minimum_budget();
        prop_assume!(min > 0);
        match w.simulate(min - 1) {
            Err(ConvertError::DiskBudgetTooSmall { minimum, .. }) => prop_assert_eq!(minimum, min),
            other => prop_assert!(false, "expected a refusal, got {:?}", other.map(|s| s.peak)),
        }
    }
}

#[test]
fn ple_files_are_held_together_then_others_one_at_a_time() {
    let w = Workload {
        release: Release::WholeFiles,
        ..spans(
            10,
            vec![
                file("p1", 100, true, 5),
                file("p2", 100, true, 5),
                file("a", 150, false, 60),
                file("b", 120, false, 50),
            ],
            40,
            0,
        )
    };
    // 10 + max(200, 150).
    assert_eq!(w.minimum_budget(), 210);
    let s = w.simulate(210).unwrap();
    use Step::*;
    assert_eq!(
        s.steps,
        [
            Fetch(0),
            Fetch(1),
            Convert(0),
            Convert(1),
            WriteQ3,
            Retire(0),
            Retire(1),
            Fetch(2),
            Convert(2),
            Retire(2),
            Fetch(3),
            Convert(3),
            Retire(3),
        ]
    );
    // After the Q3 table: 10 + 200 + 50; at the end 10 + 160 + 120 = 290.
    assert_eq!(s.peak, 10 + 160 + 120);
    assert_eq!(s.peak_held, 210);
    assert_eq!(w.unbudgeted_peak(), 10 + 470 + 160);
    let err = w.simulate(209).unwrap_err().to_string();
    assert!(
        err.contains("minimum feasible budget of 210 bytes"),
        "{err}"
    );
    assert!(err.contains("2 file(s) holding the PLE table"), "{err}");
    // A larger budget admits a file while the PLE files are held.
    let s = w.simulate(400).unwrap();
    assert_eq!(&s.steps[..3], &[Fetch(0), Fetch(1), Fetch(2)]);
}

#[test]
fn the_largest_other_file_can_set_the_minimum() {
    let w = spans(
        0,
        vec![file("p", 10, true, 1), file("big", 500, false, 1)],
        1,
        0,
    );
    assert_eq!(w.minimum_budget(), 500);
    let err = w.simulate(499).unwrap_err().to_string();
    assert!(err.contains("the largest file, big, has 500 B"), "{err}");
    assert_eq!(
        [
            shown(999),
            shown(11_566_750),
            shown(102_466_392_440),
            shown(1_500_000_000_000)
        ],
        ["999 B", "11.6 MB", "102.5 GB", "1.5 TB"]
    );
}

fn span(file: &str, offset: u64, len: u64) -> SourceSpan {
    SourceSpan {
        file: Arc::from(file),
        tensor: Arc::from(format!("{file}@{offset}")),
        offset,
        len,
    }
}

fn ftw(spans: Vec<SourceSpan>, bytes: u64) -> Component {
    let tensors = spans
        .into_iter()
        .map(|s| FtwTensor {
            desc: ftpipe_formats::TensorDesc::new(
                s.tensor.to_string(),
                ftpipe_formats::Dtype::BF16,
                ftpipe_formats::TensorKind::Plain,
                [s.len / 2],
            ),
            source: TensorSource::Span(s),
        })
        .collect::<Vec<_>>();
    Component {
        name: "model.ftw".into(),
        kind: ComponentKind::Ftw,
        predicted_bytes: bytes,
        items: tensors.len() as u64,
        source_files: tensors
            .iter()
            .flat_map(|t| t.source.files())
            .map(str::to_owned)
            .collect(),
        content: ComponentContent::Ftw { tensors },
    }
}

#[test]
fn a_plan_puts_ple_then_idle_files_first_and_shares_components_by_span_bytes() {
    let seg = span("b.safetensors", 100, 400);
    let q3 = Component {
        name: "ple/layer_001/shard_0.q3".into(),
        kind: ComponentKind::Q3Segment,
        predicted_bytes: 70,
        items: 1,
        source_files: ["b.safetensors".to_owned()].into(),
        content: ComponentContent::Q3Segment {
            layer: 1,
            index: 0,
            rows: 1,
            width: 32,
            source: seg,
            scale: None,
        },
    };
    let source = |file: &str, bytes| PlannedSource {
        file: file.into(),
        bytes,
        header_bytes: 8,
        tensors: 1,
    };
    let plan = Plan {
        model_type: "qwen4_exp".into(),
        profile: "qwen4_exp".into(),
        sources: vec![
            source("a.safetensors", 1000),
            source("b.safetensors", 600),
            source("c.safetensors", 300),
        ],
        source_bytes: 1900,
        components: vec![
            ftw(
                vec![
                    span("a.safetensors", 8, 300),
                    span("b.safetensors", 8, 100),
                    span("c.safetensors", 8, 0),
                ],
                1001,
            ),
            q3,
        ],
        total_bytes: 1071,
        omitted: vec![],
        excluded_sources: vec![],
    };
    let w = Workload::of_plan(&plan, 7, Release::WholeFiles);
    let names: Vec<_> = w.files.iter().map(|f| f.file.as_str()).collect();
    // PLE first, then what feeds nothing, then the rest.
    assert_eq!(names, ["b.safetensors", "c.safetensors", "a.safetensors"]);
    // 1001 × 300/400 = 750 (+1 remainder to the file with the most), 1001 × 100/400 = 250.
    let shares: Vec<_> = w.files.iter().map(|f| f.artifact_bytes).collect();
    assert_eq!(shares, [250, 0, 751]);
    assert_eq!((w.q3_bytes, w.artifact_bytes()), (70, 1071));
    assert_eq!(w.minimum_budget(), 7 + 1000);
    let r = w.report(2000).unwrap();
    assert_eq!(r.unbudgeted_peak, 7 + 1900 + 1071);
    assert_eq!(r.ple_files, 1);
    check_schedule(&w, &w.simulate(2000).unwrap());
}

proptest! {
    /// The fetch order of the PLE files (most bytes to punch first) gives
    /// the smallest minimum of any order, which is at most the kept bytes
    /// plus the largest PLE file.
    #[test]
    fn the_fetch_order_of_ple_files_minimises_the_minimum(w in workload()) {
        let ple: Vec<ScheduledFile> = w.files.iter().filter(|f| f.ple).cloned().collect();
        prop_assume!(!ple.is_empty() && ple.len() <= 6);
        let peak_of = |order: &[ScheduledFile]| {
            let mut before = 0;
            order.iter().map(|f| { let at = before + f.bytes; before += f.kept; at }).max().unwrap()
        };
        let largest = ple.iter().map(|f| f.bytes).max().unwrap();
        prop_assert!(w.ple_peak().0 <= w.ple_kept_bytes() + largest);
        let mut order = ple.clone();
        permutations(&mut order, 0, &mut |o| assert!(peak_of(o) >= w.ple_peak().0));
    }
}

fn permutations(v: &mut [ScheduledFile], k: usize, f: &mut dyn FnMut(&[ScheduledFile])) {
    if k == v.len() {
        return f(v);
    }
    for i in k..v.len() {
        v.swap(k, i);
        permutations(v, k + 1, f);
        v.swap(k, i);
    }
}

/// Issue 35: a PLE table spread over every file among other tensors. Held
/// whole, every file is held at once; span by span, each converted file
/// keeps its PLE spans and the next is fetched beside them.
#[test]
fn converted_ple_files_keep_only_their_spans() {
    let files = || {
        vec![
            kept_file("p1", 100, true, 10, 5),
            kept_file("p2", 300, true, 20, 5),
            kept_file("p3", 200, true, 30, 5),
        ]
    };
    let whole = Workload {
        release: Release::WholeFiles,
        ..spans(
            5,
            files()
                .into_iter()
                .map(|f| file(&f.file, f.bytes, true, 5))
                .collect(),
            9,
            0,
        )
    };
    assert_eq!(whole.minimum_budget(), 5 + 600);
    // Fetch order p2 (280 to punch), p3 (170), p1 (90): 300, 20 + 200,
    // 20 + 30 + 100.
    let mut fs = files();
    fs.sort_by_key(|f| std::cmp::Reverse(f.bytes - f.kept));
    let w = spans(5, fs, 9, 0);
    assert_eq!(w.ple_peak().0, 300);
    assert_eq!(w.minimum_budget(), 5 + 300);
    assert!(w.minimum_budget() <= 5 + w.ple_kept_bytes() + 300 + 200);
    let s = w.simulate(305).unwrap();
    check_schedule(&w, &s);
    use Step::*;
    assert_eq!(
        s.steps,
        [
            Fetch(0),
            Convert(0),
            Keep(0),
            Fetch(1),
            Convert(1),
            Keep(1),
            Fetch(2),
            Convert(2),
            Keep(2),
            WriteQ3,
            Retire(0),
            Retire(1),
            Retire(2),
        ]
    );
    let err = w.simulate(304).unwrap_err().to_string();
    assert!(
        err.contains("minimum feasible budget of 305 bytes"),
        "{err}"
    );
    assert!(err.contains("p2 (300 B) is fetched whole"), "{err}");
}
