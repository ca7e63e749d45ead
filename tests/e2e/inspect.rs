//! `ftpipe inspect` reads FTW v1, FTEXPERT1 and safetensors headers from
//! real files, and refuses anything else with an error naming the file.

use crate::common::*;

use ftpipe_formats::dtype::{Dtype, TensorKind};
use ftpipe_formats::entry::TensorDesc;
use ftpipe_formats::ftexpert::{ExpertLayout, ExpertWriter};
use ftpipe_formats::ftw::{FtwLayout, FtwWriter};

fn inspect_json(path: &std::path::Path) -> serde_json::Value {
    let o = run(ftpipe().args(["inspect", "--json"]).arg(path));
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn inspects_ftw_ftexpert_and_safetensors_and_refuses_garbage() {
    let dir = tempfile::tempdir().unwrap();

    let layout = FtwLayout::plan(vec![
        TensorDesc::new("embed", Dtype::BF16, TensorKind::Protected, [4u64, 8]),
        TensorDesc::new("norm", Dtype::F32, TensorKind::Plain, [8u64]),
    ])
    .unwrap();
    let mut w = FtwWriter::new(&layout, Vec::new()).unwrap();
    w.write_tensor("embed", &[1u8; 64]).unwrap();
    w.write_tensor("norm", &[2u8; 32]).unwrap();
    let ftw = dir.path().join("model.ftw");
    std::fs::write(&ftw, w.finish().unwrap()).unwrap();
    let j = inspect_json(&ftw);
    assert_eq!(j["format"], "FTW v1");
    assert_eq!(j["file_len"], layout.total_len());
    assert_eq!(j["tensors"][0]["name"], "embed");
    assert_eq!(j["tensors"][0]["kind"], "protected");

    let layout = ExpertLayout::plan(
        3,
        2,
        vec![TensorDesc::new(
            "down_proj",
            Dtype::BF16,
            TensorKind::Plain,
            [4u64, 4],
        )],
    )
    .unwrap();
    let mut w = ExpertWriter::new(&layout, Vec::new()).unwrap();
    for e in 0..2 {
        w.write_field(e, "down_proj", &[e as u8; 32]).unwrap();
    }
    let fte = dir.path().join("layer_003.ftexpert");
    std::fs::write(&fte, w.finish().unwrap()).unwrap();
    let j = inspect_json(&fte);
    assert_eq!(j["format"], "FTEXPERT1");
    assert_eq!(
        (j["layer"].as_u64(), j["experts"].as_u64()),
        (Some(3), Some(2))
    );
    assert_eq!(j["record_size"], layout.record_size());

    let files = ftpipe_fixtures::checkpoint::generate_small_repo(5, 1 << 20);
    let shard = files
        .iter()
        .find(|f| f.path.ends_with(".safetensors"))
        .unwrap();
    let st = dir.path().join("shard.safetensors");
    std::fs::write(
        &st,
        ftpipe_fixtures::checkpoint::content_bytes(shard).unwrap(),
    )
    .unwrap();
    let j = inspect_json(&st);
    assert_eq!(j["format"], "safetensors");
    assert!(!j["tensors"].as_array().unwrap().is_empty());
    let o = run(ftpipe().arg("inspect").arg(&st));
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("safetensors"));

    let junk = dir.path().join("junk.bin");
    std::fs::write(&junk, b"\xff\xff\xff\xff\xff\xff\xff\xffnot a header").unwrap();
    let o = run(ftpipe().arg("inspect").arg(&junk));
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("junk.bin") && stderr(&o).contains("header length"),
        "{}",
        stderr(&o)
    );
}
