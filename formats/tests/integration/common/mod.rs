//! Builders of small valid files shared by the integration tests.

use ftpipe_formats::*;
use half::bf16;

/// A small FTW file with one tensor of each interesting kind.
pub fn sample_ftw_descs() -> Vec<TensorDesc> {
    vec![
        TensorDesc::new(
            "model.embed",
            Dtype::BF16,
            TensorKind::Protected,
            vec![4, 8],
        ),
        TensorDesc::new(
            "layers.0.w",
            Dtype::Nvfp4,
            TensorKind::Quantized,
            vec![2, 32],
        ),
        TensorDesc::new("layers.0.norm", Dtype::F32, TensorKind::Plain, vec![3]),
        TensorDesc::new("scalar", Dtype::U8, TensorKind::Plain, vec![]),
    ]
}

/// Deterministic filler bytes for a tensor.
pub fn fill(len: u64, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1)
        .collect()
}

/// Write an FTW file from descriptors with filler data.
pub fn write_ftw(descs: Vec<TensorDesc>) -> Vec<u8> {
    let layout = FtwLayout::plan(descs).unwrap();
    let mut w = FtwWriter::new(&layout, Vec::new()).unwrap();
    for (i, e) in layout.entries().iter().enumerate() {
        w.write_tensor(e.key(), &fill(e.len(), i as u8)).unwrap();
    }
    let out = w.finish().unwrap();
    assert_eq!(out.len() as u64, layout.total_len());
    out
}

pub fn sample_ftw() -> Vec<u8> {
    write_ftw(sample_ftw_descs())
}

pub fn sample_expert_fields() -> Vec<TensorDesc> {
    vec![
        TensorDesc::new(
            "gate_proj",
            Dtype::Nvfp4,
            TensorKind::Quantized,
            vec![4, 32],
        ),
        TensorDesc::new("up_proj", Dtype::Nvfp4, TensorKind::Native, vec![4, 32]),
        TensorDesc::new("down_proj", Dtype::BF16, TensorKind::Protected, vec![32, 4]),
    ]
}

/// A small FTEXPERT1 sidecar with `experts` records.
pub fn write_expert(layer: u32, experts: u32, fields: Vec<TensorDesc>) -> Vec<u8> {
    let layout = ExpertLayout::plan(layer, experts, fields).unwrap();
    let mut w = ExpertWriter::new(&layout, Vec::new()).unwrap();
    for e in 0..experts {
        for (i, f) in layout.fields().iter().enumerate() {
            w.write_field(e, f.key(), &fill(f.len(), (e * 7 + i as u32) as u8))
                .unwrap();
        }
    }
    let out = w.finish().unwrap();
    assert_eq!(out.len() as u64, layout.total_len());
    out
}

pub fn sample_expert() -> Vec<u8> {
    write_expert(3, 2, sample_expert_fields())
}

/// A Q3 table of `segments` × `rows` × `width` stored as an FTW file.
pub fn write_q3_ftw(segments: u64, rows: u64, width: u64) -> (Vec<u8>, q3_set::Q3Geometry) {
    let geometry = Q3Geometry::uniform(segments, rows, width).unwrap();
    let n = (rows * width) as usize;
    let tables: Vec<Vec<bf16>> = (0..segments)
        .map(|s| {
            (0..n)
                .map(|i| bf16::from_f32(((i as f32) * 0.37 + s as f32).sin()))
                .collect()
        })
        .collect();
    let amax = tables
        .iter()
        .map(|t| q3::table_absmax("ple", t, 0).unwrap())
        .fold(0.0, f32::max);
    let g = Q3GlobalScale::from_absmax(amax).unwrap();
    let mut descs: Vec<TensorDesc> = (0..segments)
        .map(|s| {
            TensorDesc::new(
                q3_set::q3_segment_name(s),
                Dtype::Q3Ple32,
                TensorKind::Quantized,
                vec![rows, width],
            )
        })
        .collect();
    descs.push(TensorDesc::new(
        q3_set::Q3_GLOBAL_SCALE_NAME,
        Dtype::BF16,
        TensorKind::Plain,
        vec![],
    ));
    let layout = FtwLayout::plan(descs).unwrap();
    let mut w = FtwWriter::new(&layout, Vec::new()).unwrap();
    for (s, t) in tables.iter().enumerate() {
        let mut out = vec![0u8; q3_segment_len(rows, width).unwrap() as usize];
        q3::encode("ple", t, width as usize, g, 0, &mut out).unwrap();
        w.write_tensor(&q3_set::q3_segment_name(s as u64), &out)
            .unwrap();
    }
    w.write_tensor(q3_set::Q3_GLOBAL_SCALE_NAME, &g.to_bytes())
        .unwrap();
    (w.finish().unwrap(), geometry)
}

/// A hand-built index entry whose every stored field can be overridden.
#[derive(Clone)]
pub struct RawE {
    pub key: Vec<u8>,
    pub dtype: u8,
    pub kind: u8,
    pub rank: Option<u8>,
    pub reserved: u8,
    pub dims: Vec<u64>,
    pub offset: Option<u64>,
    pub len: Option<u64>,
}

impl RawE {
    pub fn new(key: &str, dtype: Dtype, kind: TensorKind, dims: &[u64]) -> Self {
        RawE {
            key: key.as_bytes().to_vec(),
            dtype: dtype.code(),
            kind: kind.code(),
            rank: None,
            reserved: 0,
            dims: dims.to_vec(),
            offset: None,
            len: None,
        }
    }

    fn natural_len(&self) -> u64 {
        Dtype::from_code(self.dtype)
            .and_then(|d| d.byte_len("k", &self.dims).ok())
            .unwrap_or(2)
    }
}

fn up(x: u64, a: u64) -> u64 {
    x.wrapping_add(a - 1) & !(a - 1)
}

/// Serialize entries laid out from `start` with `align`; returns the index
/// bytes and the (wrapping) end of the last entry.
pub fn raw_index(entries: &[RawE], start: u64, align: u64) -> (Vec<u8>, u64) {
    let mut b = Vec::new();
    let mut end = start;
    for e in entries {
        let len = e.len.unwrap_or_else(|| e.natural_len());
        let off = e.offset.unwrap_or_else(|| up(end, align));
        end = off.wrapping_add(len);
        b.extend_from_slice(&(e.key.len() as u16).to_le_bytes());
        b.extend_from_slice(&e.key);
        b.extend_from_slice(&[
            e.dtype,
            e.kind,
            e.rank.unwrap_or(e.dims.len() as u8),
            e.reserved,
        ]);
        for d in &e.dims {
            b.extend_from_slice(&d.to_le_bytes());
        }
        b.extend_from_slice(&off.to_le_bytes());
        b.extend_from_slice(&len.to_le_bytes());
    }
    (b, end)
}

/// Build an FTW file from raw entries; `extra_index` appends junk to the
/// index. Data is zeros; the file is truncated to 1 MiB if huge.
pub fn raw_ftw(entries: &[RawE], extra_index: &[u8]) -> Vec<u8> {
    let (first, _) = raw_index(entries, 0, 1);
    let index_len = (first.len() + extra_index.len()) as u64;
    let data_offset = up(40 + index_len, 4096);
    let (mut index, end) = raw_index(entries, data_offset, 4096);
    index.extend_from_slice(extra_index);
    let total = if entries.is_empty() {
        data_offset
    } else {
        up(end, 4096)
    };
    let mut b = Vec::new();
    b.extend_from_slice(b"FTW\0\r\n\x1a\n");
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    b.extend_from_slice(&index_len.to_le_bytes());
    b.extend_from_slice(&data_offset.to_le_bytes());
    b.extend_from_slice(&total.to_le_bytes());
    b.extend_from_slice(&index);
    b.resize(total.min(1 << 20).max(data_offset) as usize, 0);
    b
}

pub fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

pub fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

pub fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}
