//! A component written span by span, its source files arriving in any
//! order, is byte for byte the component the streaming writer gives (same
//! size and SHA-256), for the released layouts (BF16 and NVFP4, PLE shards
//! among other tensors or in files of their own) and seeded arrival orders;
//! finishing before every span is in is refused naming a missing file.

use std::collections::BTreeMap;

use super::*;
use crate::component::FtwTensor;
use crate::plan::tests::plan_local;
use crate::write::write_component;
use ftpipe_fixtures::checkpoint::write_repo_to_dir;
use ftpipe_fixtures::qwen4::release::{ReleaseShape, generate_release_repo};

/// A seeded shuffle (xorshift), so a failure names its order.
fn shuffled<T>(mut v: Vec<T>, mut seed: u64) -> Vec<T> {
    for i in (1..v.len()).rev() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        v.swap(i, (seed % (i as u64 + 1)) as usize);
    }
    v
}

fn check(shape: &ReleaseShape) {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("source");
    write_repo_to_dir(&generate_release_repo(3, shape), &src).unwrap();
    let plan = plan_local(&src).unwrap();
    let sources = Sources::new(&src);
    let streamed = tmp.path().join("streamed");
    let mut want = BTreeMap::new();
    for c in &plan.components {
        if placement(c).unwrap().is_some() {
            want.insert(
                c.name.clone(),
                write_component(&sources, &streamed, c, &BTreeMap::new()).unwrap(),
            );
        }
    }
    assert!(want.len() >= 2, "FTW and sidecars: {want:?}");
    let files: Vec<String> = plan.sources.iter().map(|s| s.file.clone()).collect();
    for seed in [1u64, 7, 42, 1234] {
        let out = tmp.path().join(format!("placed-{seed}"));
        let mut writers: Vec<SpanWriter<'_>> = plan
            .components
            .iter()
            .filter(|c| want.contains_key(&c.name))
            .map(|c| SpanWriter::create(&out, c).unwrap())
            .collect();
        for f in shuffled(files.clone(), seed) {
            for w in &mut writers {
                w.write_file(&sources, &f).unwrap();
                // Half the orders digest ahead as a run does, half leave
                // the whole digest to `finish`.
                if seed % 2 == 1 {
                    w.digest_ahead();
                }
            }
        }
        if seed % 2 == 1 {
            let ahead: Vec<u64> = writers.iter().map(|w| w.ahead.to).collect();
            // A component read from one file is complete at its first
            // write; one read from several is digested ahead.
            assert!(ahead.iter().any(|&to| to > 0), "digested ahead: {ahead:?}");
        }
        for w in writers {
            let name = w.component.name.clone();
            let got = w.finish(&out).unwrap();
            assert_eq!(got, want[&name], "{name}, order seed {seed}");
            assert_eq!(
                std::fs::read(out.join(&name)).unwrap(),
                std::fs::read(streamed.join(&name)).unwrap(),
                "{name}"
            );
        }
    }
}

#[test]
fn bf16_release_in_any_order_is_byte_identical() {
    check(&ReleaseShape::tiny());
}

#[test]
fn nvfp4_export_in_any_order_is_byte_identical() {
    check(&ReleaseShape::tiny_nvfp4());
}

#[test]
fn ple_only_files_in_any_order_are_byte_identical() {
    check(&ReleaseShape {
        ple_own_files: true,
        ..ReleaseShape::tiny_nvfp4()
    });
}

#[test]
fn finishing_early_names_a_missing_file() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("source");
    write_repo_to_dir(&generate_release_repo(3, &ReleaseShape::tiny()), &src).unwrap();
    let plan = plan_local(&src).unwrap();
    let ftw = plan
        .components
        .iter()
        .find(|c| c.name == "model.ftw")
        .unwrap();
    let out = tmp.path().join("out");
    let mut w = SpanWriter::create(&out, ftw).unwrap();
    let first = plan.sources[0].file.clone();
    assert!(w.write_file(&Sources::new(&src), &first).unwrap() > 0);
    assert!(!w.is_complete());
    let missing: Vec<String> = w.missing_files().iter().map(|s| s.to_string()).collect();
    assert!(!missing.contains(&first));
    let err = w.finish(&out).unwrap_err().to_string();
    assert!(err.contains(&missing[0]), "{err}");
    assert!(!out.join("model.ftw").exists());
}

/// The tiny BF16 release in a temp dir's `source/`, and its plan.
fn tiny_release() -> (tempfile::TempDir, std::path::PathBuf, crate::Plan) {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("source");
    write_repo_to_dir(&generate_release_repo(5, &ReleaseShape::tiny()), &src).unwrap();
    let plan = plan_local(&src).unwrap();
    (tmp, src, plan)
}

/// The ftw component of `plan`, the source files it reads in plan order,
/// and what the streaming writer gives for it.
fn ftw_of(plan: &crate::Plan) -> &Component {
    plan.components
        .iter()
        .find(|c| c.name == "model.ftw")
        .unwrap()
}

#[test]
fn a_crash_loses_only_unclaimed_spans_and_the_resume_is_byte_identical() {
    let (tmp, src, plan) = tiny_release();
    let ftw = ftw_of(&plan);
    let sources = Sources::new(&src);
    let want = write_component(
        &sources,
        &tmp.path().join("streamed"),
        ftw,
        &BTreeMap::new(),
    )
    .unwrap();
    let files: Vec<String> = ftw.source_files.iter().cloned().collect();
    assert!(files.len() >= 3, "{files:?}");
    let (id, other_id) = ("a".repeat(64), "b".repeat(64));
    let out = tmp.path().join("artifact");
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .build()
        .unwrap()
        .block_on(async {
            let store = Store::open(&tmp.path().join("state.db")).await.unwrap();
            let run = store.begin_run("test", "0").await.unwrap();
            // First process: one file claimed, the next written but never
            // claimed (the crash lands between its write and its claim).
            let mut w = open_durable(&store, &out, ftw, &id).await.unwrap();
            w = write_one(&store, run, w, &sources, &files[0], &id).await;
            w.write_file(&sources, &files[1]).unwrap();
            drop(w);
            let claimed: Vec<String> = store
                .span_claims(&ftw.name)
                .await
                .unwrap()
                .into_iter()
                .map(|k| k.file)
                .collect();
            assert_eq!(claimed, [files[0].clone()]);

            // Another identity never resumes that temp file: recreated,
            // its claims forgotten.
            let w = open_durable(&store, &out, ftw, &other_id).await.unwrap();
            assert_eq!(w.missing_files().len(), files.len());
            assert!(store.span_claims(&ftw.name).await.unwrap().is_empty());
            drop(w);
            let mut w = open_durable(&store, &out, ftw, &id).await.unwrap();
            w = write_one(&store, run, w, &sources, &files[0], &id).await;
            drop(w);

            // The resume: the claimed file is done, every other is missing
            // (the unclaimed write is simply written again).
            let mut w = open_durable(&store, &out, ftw, &id).await.unwrap();
            let missing: Vec<&str> = w.missing_files().into_iter().collect();
            assert_eq!(
                missing,
                files[1..].iter().map(String::as_str).collect::<Vec<_>>()
            );
            for f in &files[1..] {
                w = write_one(&store, run, w, &sources, f, &id).await;
            }
            assert!(w.is_complete());
            assert_eq!(w.finish(&out).unwrap(), want);
            // The receipt's transaction ends the claims.
            let receipt = ftpipe_receipts::ComponentReceipt {
                path: ftw.name.clone(),
                kind: "ftw".into(),
                predicted_bytes: want.size,
                size: want.size,
                sha256: want.sha256.clone(),
                identity: id.clone(),
                run_id: run,
            };
            store.put_component(run, &receipt).await.unwrap();
            assert!(store.span_claims(&ftw.name).await.unwrap().is_empty());

            // A temp file cut short is not resumed: recreated, claims gone.
            let mut w = open_durable(&store, &out, &plan.components[1], &id)
                .await
                .unwrap();
            let first = plan.components[1].source_files.first().unwrap().clone();
            w = write_one(&store, run, w, &sources, &first, &id).await;
            drop(w);
            let name = &plan.components[1].name;
            let tmp_file = out.join(ftpipe_fs::durable::temp_name(name));
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&tmp_file)
                .unwrap();
            f.set_len(100).unwrap();
            let w = open_durable(&store, &out, &plan.components[1], &id)
                .await
                .unwrap();
            assert_eq!(
                w.missing_files().len(),
                plan.components[1].source_files.len()
            );
            assert!(store.span_claims(name).await.unwrap().is_empty());
        });
}

/// [`write_file_into_all`] for one writer.
async fn write_one<'a>(
    store: &Store,
    run: ftpipe_receipts::RunId,
    w: SpanWriter<'a>,
    sources: &Sources,
    file: &str,
    id: &str,
) -> SpanWriter<'a> {
    let mut ws = vec![(w, id.to_owned())];
    write_file_into_all(store, run, &mut ws, sources, file)
        .await
        .unwrap();
    ws.pop().unwrap().0
}

/// Regression (a review of issue 28's pipelined run): a component's final
/// file left without a receipt by an earlier run (another pin, same
/// length and header) was taken by `recover_renamed` for the claims of a
/// later writer once that writer's temp file was gone, and receipted
/// under the new identity with the old weights. A writer now unlinks such
/// a file before any span of it is claimed, so a final file beside a full
/// set of claims is always the claims' own.
#[test]
fn a_final_file_without_a_receipt_is_never_recovered_for_later_claims() {
    let (tmp, src, plan) = tiny_release();
    let ftw = ftw_of(&plan);
    let sources = Sources::new(&src);
    let out = tmp.path().join("artifact");
    // The earlier run's whole component, renamed, never receipted.
    let old = write_component(&sources, &out, ftw, &BTreeMap::new()).unwrap();
    assert_eq!(
        std::fs::metadata(out.join(&ftw.name)).unwrap().len(),
        old.size
    );
    let id = "c".repeat(64);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .build()
        .unwrap()
        .block_on(async {
            let store = Store::open(&tmp.path().join("state.db")).await.unwrap();
            let run = store.begin_run("test", "0").await.unwrap();
            let mut w = open_durable(&store, &out, ftw, &id).await.unwrap();
            assert!(
                !out.join(&ftw.name).exists(),
                "the unreceipted final file outlived a new writer"
            );
            let files: Vec<String> = ftw.source_files.iter().cloned().collect();
            for f in &files {
                w = write_one(&store, run, w, &sources, f, &id).await;
            }
            // Every span claimed, then the temp file swept without its
            // claims (as a crash in another path could leave it).
            drop(w);
            std::fs::remove_file(out.join(ftpipe_fs::durable::temp_name(&ftw.name))).unwrap();
            let recovered = recover_renamed(&store, &out, ftw, &id).await.unwrap();
            assert!(recovered.is_none(), "{recovered:?}");
        });
}

/// A file of `len` bytes of 0xEE, so what `Gather` leaves untouched shows.
fn marked_file(len: usize) -> (tempfile::TempDir, File) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c");
    std::fs::write(&path, vec![0xEE; len]).unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    (dir, file)
}

fn contents(dir: &tempfile::TempDir) -> Vec<u8> {
    std::fs::read(dir.path().join("c")).unwrap()
}

#[test]
fn gathered_neighbours_get_zeros_only_where_padding_was_vouched_for() {
    let (dir, file) = marked_file(64);
    let mut g = Gather::default();
    g.put(&file, 0, b"ab", false).unwrap();
    g.put(&file, 2, b"cd", false).unwrap();
    // Padding between neighbouring slots: written as zeros.
    g.put(&file, 8, b"ef", true).unwrap();
    // A gap the caller does not vouch for (another file's span may lie
    // there): left as it is.
    g.put(&file, 16, b"gh", false).unwrap();
    g.flush(&file).unwrap();
    let got = contents(&dir);
    assert_eq!(&got[..10], b"abcd\0\0\0\0ef");
    assert_eq!(&got[10..16], &[0xEE; 6]);
    assert_eq!(&got[16..18], b"gh");
    assert_eq!(&got[18..], &[0xEE; 46][..]);
}

#[test]
fn gathering_stops_at_its_size_and_big_pieces_go_straight_to_the_file() {
    let total = 2 * GATHER_BYTES + 100;
    let (dir, file) = marked_file(total + 8192);
    let mut g = Gather::default();
    let small = vec![1u8; 100];
    let big = vec![2u8; GATHER_BYTES];
    g.put(&file, 0, &small, false).unwrap();
    assert_eq!(g.bytes.len(), 100);
    // Does not fit beside what is gathered: that is written, and a piece
    // of GATHER_BYTES goes to the file without being copied.
    g.put(&file, 100, &big, false).unwrap();
    assert!(g.bytes.is_empty());
    assert_eq!(g.end(), 100 + GATHER_BYTES as u64);
    g.put(
        &file,
        100 + GATHER_BYTES as u64,
        &big[..GATHER_BYTES - 1],
        false,
    )
    .unwrap();
    assert_eq!(g.bytes.len(), GATHER_BYTES - 1);
    // Exactly fills the gathering; one byte more starts a new one.
    g.put(&file, total as u64 - 1, &[3u8], false).unwrap();
    assert_eq!(g.bytes.len(), GATHER_BYTES);
    g.put(&file, total as u64, &[4u8], false).unwrap();
    assert_eq!(g.bytes.len(), 1);
    g.flush(&file).unwrap();
    let got = contents(&dir);
    assert_eq!(&got[..100], &small[..]);
    assert!(got[100..total - 1].iter().all(|b| *b == 2));
    assert_eq!(got[total - 1], 3);
    assert_eq!(got[total], 4);
    assert!(got[total + 1..].iter().all(|b| *b == 0xEE));
}

#[test]
fn padding_wider_than_the_limit_is_never_filled_even_when_vouched_for() {
    let far = MAX_GATHERED_PADDING + 2;
    let (dir, file) = marked_file(far as usize + 1);
    let mut g = Gather::default();
    g.put(&file, 0, b"x", true).unwrap();
    g.put(&file, far, b"y", true).unwrap();
    g.flush(&file).unwrap();
    let got = contents(&dir);
    assert_eq!(got[0], b'x');
    assert!(got[1..far as usize].iter().all(|b| *b == 0xEE));
    assert_eq!(got[far as usize], b'y');
}

/// Neighbouring slots filled from different source files: a file's spans
/// are gathered only across padding, never across the slot of another
/// file, whichever file comes first (gathering across it would write
/// zeros over spans already written, or later be overwritten by them).
#[test]
fn neighbouring_slots_of_two_files_survive_either_order() {
    let (tmp, src, plan) = tiny_release();
    let ComponentContent::Ftw { tensors } = &ftw_of(&plan).content else {
        panic!("model.ftw is an FTW component");
    };
    let small = |file: &str| -> Vec<FtwTensor> {
        tensors
            .iter()
            .filter(|t| {
                let spans = t.source.spans();
                spans.len() == 1 && &*spans[0].file == file && spans[0].len <= 4096
            })
            .cloned()
            .collect()
    };
    let files: BTreeSet<&str> = tensors.iter().map(|t| &*t.source.spans()[0].file).collect();
    let mut pick = files.iter().map(|f| small(f)).filter(|t| t.len() >= 3);
    let (a, b) = (pick.next().unwrap(), pick.next().unwrap());
    let mixed: Vec<FtwTensor> = a.into_iter().zip(b).flat_map(|(x, y)| [x, y]).collect();
    let names: Vec<String> = mixed
        .iter()
        .map(|t| t.source.spans()[0].file.to_string())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut c = Component {
        name: "mixed.ftw".into(),
        items: mixed.len() as u64,
        source_files: names.iter().cloned().collect(),
        content: ComponentContent::Ftw { tensors: mixed },
        ..ftw_of(&plan).clone()
    };
    c.predicted_bytes = placement(&c).unwrap().unwrap().0.total_len();
    let sources = Sources::new(&src);
    let want =
        write_component(&sources, &tmp.path().join("streamed"), &c, &BTreeMap::new()).unwrap();
    for (n, order) in [names.clone(), names.into_iter().rev().collect()]
        .iter()
        .enumerate()
    {
        let out = tmp.path().join(format!("placed-{n}"));
        let mut w = SpanWriter::create(&out, &c).unwrap();
        for f in order {
            w.write_file(&sources, f).unwrap();
        }
        assert_eq!(w.finish(&out).unwrap(), want, "order {order:?}");
    }
}

/// `plan`'s FTW stream (sources under `src`) written into `out` source by
/// source, digested ahead after each: the writer before `finish`.
fn written_and_digested_ahead<'p>(
    plan: &'p crate::Plan,
    src: &std::path::Path,
    out: &std::path::Path,
) -> SpanWriter<'p> {
    let mut w = SpanWriter::create(out, ftw_of(plan)).unwrap();
    for s in &plan.sources {
        if w.needs(&s.file) {
            w.write_file(&Sources::new(src), &s.file).unwrap();
            w.digest_ahead();
        }
    }
    w
}

/// A temp file cut short after part of it was digested ahead: `finish`
/// reads it whole and reports its real length, as without the digest ahead.
#[test]
fn a_file_cut_below_what_was_digested_ahead_is_read_whole() {
    let (tmp, src, plan) = tiny_release();
    let out = tmp.path().join("out");
    let w = written_and_digested_ahead(&plan, &src, &out);
    let ahead = w.ahead.to;
    assert!(ahead > 1, "nothing was digested ahead");
    std::fs::OpenOptions::new()
        .write(true)
        .open(out.join(temp_name("model.ftw")))
        .unwrap()
        .set_len(ahead / 2)
        .unwrap();
    match w.finish(&out) {
        Err(ConvertError::SizeMismatch { actual, .. }) => assert_eq!(actual, ahead / 2),
        other => panic!("expected a size mismatch, got {other:?}"),
    }
}

/// A temp file replaced after part of it was digested ahead (its first
/// bytes changed): `finish` hashes the file it renames, read whole.
#[test]
fn a_file_replaced_after_it_was_digested_ahead_is_read_whole() {
    let (tmp, src, plan) = tiny_release();
    let out = tmp.path().join("out");
    let w = written_and_digested_ahead(&plan, &src, &out);
    assert!(w.ahead.to > 1, "nothing was digested ahead");
    let temp = out.join(temp_name("model.ftw"));
    let mut bytes = std::fs::read(&temp).unwrap();
    bytes[0] ^= 0xff;
    let other = out.join("replacement");
    std::fs::write(&other, &bytes).unwrap();
    std::fs::rename(&other, &temp).unwrap();
    let got = w.finish(&out).unwrap();
    let renamed = std::fs::read(out.join("model.ftw")).unwrap();
    assert_eq!(renamed, bytes);
    assert_eq!(got.sha256, hex::encode(Sha256::digest(&renamed)));
}
