//! Validating reader of safetensors headers.
//!
//! Layout: `u64` little-endian header length N, N bytes of JSON (tensor name →
//! `{dtype, shape, data_offsets: [begin, end]}` plus an optional
//! `__metadata__` string map), then the data. Offsets are relative to the
//! data start. Every check has its own error naming the file and tensor:
//! the header must fit the file and [`MAX_HEADER_LEN`]; tensors, sorted by
//! offset, must tile the data exactly (no gap, no overlap) and each length
//! must equal elements × dtype width; the data must end exactly at the end
//! of the file. Only the header is read; tensor bytes are read later in
//! bounded chunks at the absolute offsets this reader returns.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;

/// Largest header accepted (the safetensors reference uses the same bound).
pub const MAX_HEADER_LEN: u64 = 100 * 1024 * 1024;
/// Most dimensions accepted for a tensor.
pub const MAX_RANK: usize = 8;
/// Most tensors accepted in one file.
pub const MAX_TENSORS: usize = 1_000_000;

/// A check on a safetensors source that failed.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// Fewer than 8 bytes: no header length.
    #[error("{file}: {len} bytes is too short for a safetensors header length")]
    TooShort {
        /// The safetensors file at fault.
        file: String,
        /// The file's size in bytes.
        len: u64,
    },
    /// The declared header length exceeds [`MAX_HEADER_LEN`].
    #[error("{file}: header length {header_len} exceeds the limit of {limit} bytes")]
    HeaderTooLarge {
        /// The safetensors file at fault.
        file: String,
        /// The declared header length in bytes.
        header_len: u64,
        /// The largest header length accepted, in bytes.
        limit: u64,
    },
    /// The declared header runs past the end of the file.
    #[error(
        "{file}: header of {header_len} bytes at offset 8 runs past the end of the {file_len}-byte file"
    )]
    HeaderBeyondFile {
        /// The safetensors file at fault.
        file: String,
        /// The declared header length in bytes.
        header_len: u64,
        /// The file's size in bytes.
        file_len: u64,
    },
    /// The header is not the expected JSON.
    /// `at` names the part (`tensor NAME: `, `__metadata__: `) or is empty.
    #[error("{file}: malformed header JSON: {at}{source}")]
    MalformedHeader {
        /// The safetensors file at fault.
        file: String,
        /// The part of the header at fault, as a message prefix, or empty.
        at: String,
        /// The JSON parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// The header bytes are not UTF-8.
    #[error("{file}: malformed header JSON: header is not UTF-8: {source}")]
    HeaderNotUtf8 {
        /// The safetensors file at fault.
        file: String,
        /// The UTF-8 decoding error.
        #[source]
        source: std::string::FromUtf8Error,
    },
    /// A key repeats in the header JSON (a map would keep only the last).
    #[error("{file}: duplicate key(s) in the header: {keys}")]
    DuplicateKeys {
        /// The safetensors file at fault.
        file: String,
        /// The repeated keys, with the objects they repeat in.
        keys: String,
    },
    /// The header holds a credential this process sent (a server echoing
    /// the token into the file): it would reach the plan, the manifest
    /// and the components, so the file is refused.
    #[error("{file}: the header holds the hub token this process sent; refusing the file")]
    HoldsCredential {
        /// The safetensors file at fault.
        file: String,
    },
    /// A dtype this reader does not know.
    #[error("{file}: tensor {tensor}: unknown dtype {dtype:?}")]
    UnknownDtype {
        /// The safetensors file at fault.
        file: String,
        /// The tensor name.
        tensor: String,
        /// The dtype the header gives.
        dtype: String,
    },
    /// Too many dimensions.
    #[error("{file}: tensor {tensor}: rank {rank} exceeds {MAX_RANK}")]
    RankTooLarge {
        /// The safetensors file at fault.
        file: String,
        /// The tensor name.
        tensor: String,
        /// The number of dimensions the header gives.
        rank: usize,
    },
    /// Too many tensors.
    #[error("{file}: {count} tensors exceed the limit of {MAX_TENSORS}")]
    TooManyTensors {
        /// The safetensors file at fault.
        file: String,
        /// How many tensors the header lists.
        count: usize,
    },
    /// `data_offsets` has end < begin.
    #[error("{file}: tensor {tensor}: data_offsets [{begin}, {end}] end before they begin")]
    InvertedOffsets {
        /// The safetensors file at fault.
        file: String,
        /// The tensor name.
        tensor: String,
        /// The begin data offset.
        begin: u64,
        /// The end data offset, below `begin`.
        end: u64,
    },
    /// Element count × width overflows.
    #[error("{file}: tensor {tensor}: shape {shape:?} overflows")]
    ShapeOverflow {
        /// The safetensors file at fault.
        file: String,
        /// The tensor name.
        tensor: String,
        /// The shape whose size overflows.
        shape: Vec<u64>,
    },
    /// The byte length disagrees with dtype × shape.
    #[error(
        "{file}: tensor {tensor}: {dtype} {shape:?} needs {expected} bytes, data_offsets give {actual}"
    )]
    DtypeShapeMismatch {
        /// The safetensors file at fault.
        file: String,
        /// The tensor name.
        tensor: String,
        /// The dtype the header gives.
        dtype: String,
        /// The shape the header gives.
        shape: Vec<u64>,
        /// The byte length dtype and shape need.
        expected: u64,
        /// The byte length `data_offsets` give.
        actual: u64,
    },
    /// A tensor starts after the previous one ended.
    #[error(
        "{file}: tensor {tensor}: gap before it: starts at data offset {begin}, previous data ended at {expected}"
    )]
    Gap {
        /// The safetensors file at fault.
        file: String,
        /// The tensor name.
        tensor: String,
        /// The data offset where the tensor starts.
        begin: u64,
        /// The data offset where the previous tensor ended.
        expected: u64,
    },
    /// A tensor starts before the previous one ended.
    #[error(
        "{file}: tensor {tensor}: overlaps the previous tensor: starts at data offset {begin}, previous data ended at {expected}"
    )]
    Overlap {
        /// The safetensors file at fault.
        file: String,
        /// The tensor name.
        tensor: String,
        /// The data offset where the tensor starts.
        begin: u64,
        /// The data offset where the previous tensor ended.
        expected: u64,
    },
    /// The file is shorter than header + data.
    #[error("{file}: truncated: header and data need {expected} bytes, the file has {actual}")]
    Truncated {
        /// The safetensors file at fault.
        file: String,
        /// The bytes header and data need.
        expected: u64,
        /// The file's size in bytes.
        actual: u64,
    },
    /// The file has bytes after the data.
    #[error(
        "{file}: {extra} unexpected bytes after the last tensor (file has {actual}, header and data end at {expected})"
    )]
    TrailingBytes {
        /// The safetensors file at fault.
        file: String,
        /// The byte offset where header and data end.
        expected: u64,
        /// The file's size in bytes.
        actual: u64,
        /// How many bytes follow the data.
        extra: u64,
    },
}

impl SourceError {
    /// Always [`ErrorClass::Failure`](ftpipe_fs::ErrorClass::Failure): a
    /// malformed source header is bad input, named by file and tensor.
    pub fn class(&self) -> ftpipe_fs::ErrorClass {
        ftpipe_fs::ErrorClass::Failure
    }
}

#[derive(Deserialize)]
struct RawTensor {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: (u64, u64),
}

/// A key repeated anywhere in the header is an error (a map keeps one),
/// and so is a header holding a credential of this process.
fn refuse_duplicate_keys(file: &str, json: &[u8]) -> Result<(), SourceError> {
    let found =
        ftpipe_hub::json_keys::scan(json).map_err(|source| SourceError::MalformedHeader {
            file: file.to_owned(),
            at: String::new(),
            source,
        })?;
    if found.holds_secret {
        return Err(SourceError::HoldsCredential {
            file: file.to_owned(),
        });
    }
    if found.duplicates.is_empty() {
        Ok(())
    } else {
        Err(SourceError::DuplicateKeys {
            file: file.to_owned(),
            keys: ftpipe_hub::json_keys::describe(&found.duplicates),
        })
    }
}

/// The header object: `__metadata__` and the tensors, in file order (a
/// repeated key is kept twice; the duplicate check refuses it).
struct Entries {
    metadata: BTreeMap<String, String>,
    tensors: Vec<(String, RawTensor)>,
}

impl Entries {
    /// The entries of header `json` of `file`: typed straight from the
    /// bytes; a header that does not fit is parsed again as a JSON tree,
    /// whose errors name the part at fault. (The tree of a 37k-tensor
    /// header is ~30 MB; the typed entries a quarter of that.)
    fn parse(file: &str, json: &[u8]) -> Result<Entries, SourceError> {
        match serde_json::from_slice::<Entries>(json) {
            Ok(entries) => {
                refuse_duplicate_keys(file, json)?;
                Ok(entries)
            }
            Err(_) => Entries::from_tree(file, json),
        }
    }

    /// The entries of a header that does not deserialize as [`Entries`],
    /// through the JSON tree, or the error naming the part at fault.
    fn from_tree(file: &str, json: &[u8]) -> Result<Entries, SourceError> {
        let f = || file.to_owned();
        let mut raw: BTreeMap<String, serde_json::Value> =
            serde_json::from_slice(json).map_err(|source| SourceError::MalformedHeader {
                file: f(),
                at: String::new(),
                source,
            })?;
        refuse_duplicate_keys(file, json)?;
        let metadata = match raw.remove("__metadata__") {
            None => BTreeMap::new(),
            Some(v) => {
                serde_json::from_value(v).map_err(|source| SourceError::MalformedHeader {
                    file: f(),
                    at: "__metadata__: ".into(),
                    source,
                })?
            }
        };
        if raw.len() > MAX_TENSORS {
            return Err(SourceError::TooManyTensors {
                file: f(),
                count: raw.len(),
            });
        }
        let mut tensors = Vec::with_capacity(raw.len());
        for (name, value) in raw {
            let t: RawTensor =
                serde_json::from_value(value).map_err(|source| SourceError::MalformedHeader {
                    file: f(),
                    at: format!("tensor {name}: "),
                    source,
                })?;
            tensors.push((name, t));
        }
        Ok(Entries { metadata, tensors })
    }
}

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a safetensors header object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Entries, A::Error> {
                let mut metadata = BTreeMap::new();
                let mut tensors = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    if key == "__metadata__" {
                        metadata = map.next_value()?;
                    } else if tensors.len() >= MAX_TENSORS {
                        // Past the limit: the tree path counts and refuses.
                        return Err(serde::de::Error::custom("too many tensors"));
                    } else {
                        tensors.push((key, map.next_value()?));
                    }
                }
                Ok(Entries { metadata, tensors })
            }
        }
        d.deserialize_map(Visit)
    }
}

/// One validated tensor of a source file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceTensor {
    /// Shared with the plan's source spans and inventory, so each name is
    /// allocated once however many places refer to it.
    name: Arc<str>,
    dtype: safetensors::Dtype,
    shape: Vec<u64>,
    offset: u64,
    len: u64,
}

impl SourceTensor {
    /// Tensor name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Tensor name, shared.
    pub fn shared_name(&self) -> &Arc<str> {
        &self.name
    }
    /// Element type.
    pub fn dtype(&self) -> safetensors::Dtype {
        self.dtype
    }
    /// Shape.
    pub fn shape(&self) -> &[u64] {
        &self.shape
    }
    /// Absolute offset of the first byte in the file.
    pub fn offset(&self) -> u64 {
        self.offset
    }
    /// Byte length.
    pub fn len(&self) -> u64 {
        self.len
    }
    /// Whether the tensor holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A validated safetensors header: tensors in file order with absolute offsets.
#[derive(Debug, Clone)]
pub struct SourceHeader {
    file: Arc<str>,
    header_len: u64,
    tensors: Vec<SourceTensor>,
    /// Indices into `tensors` in name order, for [`SourceHeader::tensor`].
    by_name: Vec<u32>,
    metadata: BTreeMap<String, String>,
}

fn parse_dtype(s: &str) -> Option<safetensors::Dtype> {
    serde_json::from_value(serde_json::Value::String(s.to_owned())).ok()
}

impl SourceHeader {
    /// Reads the header length from the first 8 bytes and checks it against
    /// the limit and the file length. Returns N.
    pub fn header_len(file: &str, first8: &[u8], file_len: u64) -> Result<u64, SourceError> {
        let bytes: [u8; 8] = first8
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| SourceError::TooShort {
                file: file.to_owned(),
                len: file_len,
            })?;
        let n = u64::from_le_bytes(bytes);
        if n > MAX_HEADER_LEN {
            return Err(SourceError::HeaderTooLarge {
                file: file.to_owned(),
                header_len: n,
                limit: MAX_HEADER_LEN,
            });
        }
        if 8u64.checked_add(n).is_none_or(|end| end > file_len) {
            return Err(SourceError::HeaderBeyondFile {
                file: file.to_owned(),
                header_len: n,
                file_len,
            });
        }
        Ok(n)
    }

    /// Parses and validates the header JSON (`json` = the N header bytes)
    /// of a `file_len`-byte file.
    pub fn parse(file: &str, json: &[u8], file_len: u64) -> Result<SourceHeader, SourceError> {
        let header_len = json.len() as u64;
        let Entries {
            metadata,
            tensors: mut raw,
        } = Entries::parse(file, json)?;
        // Checked in name order, as the tree (a sorted map) gave them.
        raw.sort_by(|a, b| a.0.cmp(&b.0));
        if raw.len() > MAX_TENSORS {
            return Err(SourceError::TooManyTensors {
                file: file.to_owned(),
                count: raw.len(),
            });
        }
        let mut tensors = Vec::with_capacity(raw.len());
        for (name, t) in raw {
            tensors.push(CheckedEntry::check(file, name, t)?);
        }
        tensors.sort_by_key(|t| (t.begin, t.end));
        let data_start = 8 + header_len;
        let (out, data_len) = lay_out(file, tensors, data_start)?;
        check_file_len(file, data_start.saturating_add(data_len), file_len)?;
        let by_name = name_order(&out);
        Ok(SourceHeader {
            file: file.into(),
            header_len,
            tensors: out,
            by_name,
            metadata,
        })
    }

    /// Reads and validates the header of a local file (8 + N bytes only).
    pub fn read(
        path: &std::path::Path,
        name: &str,
    ) -> std::io::Result<Result<SourceHeader, SourceError>> {
        Ok(Self::read_with_json(path, name)?.map(|(h, _)| h))
    }

    /// [`SourceHeader::read`], also returning the raw header JSON (kept so
    /// the header can be parsed again after the file is gone).
    pub fn read_with_json(
        path: &std::path::Path,
        name: &str,
    ) -> std::io::Result<Result<(SourceHeader, Vec<u8>), SourceError>> {
        let (json, file_len) = match Self::read_json(path, name)? {
            Ok(read) => read,
            Err(e) => return Ok(Err(e)),
        };
        Ok(SourceHeader::parse(name, &json, file_len).map(|h| (h, json)))
    }

    /// The raw header JSON of a local file (the N bytes after the length,
    /// N checked against [`MAX_HEADER_LEN`] and the file), and the file's
    /// length.
    pub fn read_json(
        path: &std::path::Path,
        name: &str,
    ) -> std::io::Result<Result<(Vec<u8>, u64), SourceError>> {
        use std::io::Read;
        let mut file = ftpipe_fs::nofollow::open_read(path)?;
        let file_len = file.metadata()?.len();
        let mut first8 = [0u8; 8];
        let got = file.read(&mut first8)?;
        let n = match SourceHeader::header_len(name, &first8[..got], file_len) {
            Ok(n) => n,
            Err(e) => return Ok(Err(e)),
        };
        // n ≤ MAX_HEADER_LEN, so it fits in memory and in usize.
        let mut json = vec![0u8; n as usize];
        file.read_exact(&mut json)?;
        Ok(Ok((json, file_len)))
    }

    /// The file this header belongs to.
    pub fn file(&self) -> &str {
        &self.file
    }
    /// The file this header belongs to, shared.
    pub fn shared_file(&self) -> &Arc<str> {
        &self.file
    }
    /// N, the JSON length.
    pub fn json_len(&self) -> u64 {
        self.header_len
    }
    /// Tensors in file order.
    pub fn tensors(&self) -> &[SourceTensor] {
        &self.tensors
    }
    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&SourceTensor> {
        // Binary search: the plan looks up every tensor of the index, so a
        // scan would be quadratic in the tensors per file.
        let i = self
            .by_name
            .binary_search_by(|&i| (*self.tensors[i as usize].name).cmp(name))
            .ok()?;
        self.tensors.get(self.by_name[i] as usize)
    }
    /// `__metadata__`.
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }
}

/// One tensor entry of a header, its dtype known, its rank within
/// [`MAX_RANK`] and its data offsets spanning exactly its dtype × shape.
struct CheckedEntry {
    begin: u64,
    end: u64,
    name: String,
    dtype: safetensors::Dtype,
    shape: Vec<u64>,
}

impl CheckedEntry {
    /// Checks entry `name` (`t`) of `file`.
    fn check(file: &str, name: String, t: RawTensor) -> Result<CheckedEntry, SourceError> {
        let f = || file.to_owned();
        let dtype = parse_dtype(&t.dtype).ok_or_else(|| SourceError::UnknownDtype {
            file: f(),
            tensor: name.clone(),
            dtype: t.dtype.clone(),
        })?;
        if t.shape.len() > MAX_RANK {
            return Err(SourceError::RankTooLarge {
                file: f(),
                tensor: name,
                rank: t.shape.len(),
            });
        }
        let (begin, end) = t.data_offsets;
        if end < begin {
            return Err(SourceError::InvertedOffsets {
                file: f(),
                tensor: name,
                begin,
                end,
            });
        }
        let bits = t
            .shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .and_then(|n| n.checked_mul(dtype.bitsize() as u64))
            .ok_or_else(|| SourceError::ShapeOverflow {
                file: f(),
                tensor: name.clone(),
                shape: t.shape.clone(),
            })?;
        let expected = bits.div_ceil(8);
        if expected != end - begin {
            return Err(SourceError::DtypeShapeMismatch {
                file: f(),
                tensor: name,
                dtype: t.dtype,
                shape: t.shape,
                expected,
                actual: end - begin,
            });
        }
        Ok(CheckedEntry {
            begin,
            end,
            name,
            dtype,
            shape: t.shape,
        })
    }
}

/// The tensors of `file` (`entries`, in offset order) at their absolute
/// offsets after `data_start`, checked to follow each other with no gap and
/// no overlap from offset 0; and the length of the data they cover.
fn lay_out(
    file: &str,
    entries: Vec<CheckedEntry>,
    data_start: u64,
) -> Result<(Vec<SourceTensor>, u64), SourceError> {
    let mut cursor = 0u64;
    let mut out = Vec::with_capacity(entries.len());
    for CheckedEntry {
        begin,
        end,
        name,
        dtype,
        shape,
    } in entries
    {
        if begin > cursor {
            return Err(SourceError::Gap {
                file: file.to_owned(),
                tensor: name,
                begin,
                expected: cursor,
            });
        }
        if begin < cursor {
            return Err(SourceError::Overlap {
                file: file.to_owned(),
                tensor: name,
                begin,
                expected: cursor,
            });
        }
        cursor = end;
        out.push(SourceTensor {
            name: name.into(),
            dtype,
            shape,
            // Saturates only when `cursor` does too: then Truncated below.
            offset: data_start.saturating_add(begin),
            len: end - begin,
        });
    }
    Ok((out, cursor))
}

/// Refuses a `file_len`-byte file whose header and tensors end at
/// `expected` bytes: truncated, or with trailing bytes.
fn check_file_len(file: &str, expected: u64, file_len: u64) -> Result<(), SourceError> {
    if expected > file_len {
        return Err(SourceError::Truncated {
            file: file.to_owned(),
            expected,
            actual: file_len,
        });
    }
    if expected < file_len {
        return Err(SourceError::TrailingBytes {
            file: file.to_owned(),
            expected,
            actual: file_len,
            extra: file_len - expected,
        });
    }
    Ok(())
}

/// Indices into `tensors` in name order. [`MAX_TENSORS`] bounds the
/// count, so every index fits in a u32.
fn name_order(tensors: &[SourceTensor]) -> Vec<u32> {
    let mut by_name: Vec<u32> = (0..tensors.len())
        .filter_map(|i| u32::try_from(i).ok())
        .collect();
    by_name.sort_unstable_by(|&a, &b| tensors[a as usize].name.cmp(&tensors[b as usize].name));
    by_name
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_of(json: &str, data_len: u64) -> (Vec<u8>, u64) {
        let len = 8 + json.len() as u64 + data_len;
        (json.as_bytes().to_vec(), len)
    }

    fn parse(json: &str, data_len: u64) -> Result<SourceHeader, SourceError> {
        let (j, len) = file_of(json, data_len);
        SourceHeader::parse("m.safetensors", &j, len)
    }

    const GOOD: &str = r#"{"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2,2],"data_offsets":[8,16]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;

    #[test]
    fn valid_header_sorted_by_offset_with_absolute_offsets() {
        let h = parse(GOOD, 16).unwrap();
        let names: Vec<_> = h.tensors().iter().map(|t| t.name()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(h.tensor("a").unwrap().offset(), 8 + GOOD.len() as u64);
        assert_eq!(h.metadata()["format"], "pt");
    }

    #[test]
    fn a_header_holding_a_credential_of_this_process_is_refused() {
        let secret = "hf_headerEchoUnitTestSecret42";
        ftpipe_secrets::register(secret);
        let echoed = GOOD.replace("\"pt\"", &format!("\"{secret}\""));
        assert!(matches!(
            parse(&echoed, 16),
            Err(SourceError::HoldsCredential { file }) if file == "m.safetensors"
        ));
        assert!(parse(GOOD, 16).is_ok());
    }

    #[test]
    fn each_check_has_its_error() {
        let g = |s: &str| s.replace("[8,16]", "[9,17]");
        assert!(
            matches!(parse(&g(GOOD), 17), Err(SourceError::Gap { tensor, .. }) if tensor == "b")
        );
        let o = GOOD.replace("[8,16]", "[7,15]");
        assert!(matches!(parse(&o, 16), Err(SourceError::Overlap { tensor, .. }) if tensor == "b"));
        let m = GOOD.replace("[2,2]", "[2,3]");
        assert!(
            matches!(parse(&m, 16), Err(SourceError::DtypeShapeMismatch { tensor, expected: 12, actual: 8, .. }) if tensor == "b")
        );
        assert!(matches!(
            parse(GOOD, 15),
            Err(SourceError::Truncated { .. })
        ));
        assert!(matches!(
            parse(GOOD, 17),
            Err(SourceError::TrailingBytes { extra: 1, .. })
        ));
        let d = GOOD.replace("\"F32\"", "\"F31\"");
        assert!(
            matches!(parse(&d, 16), Err(SourceError::UnknownDtype { tensor, .. }) if tensor == "a")
        );
        let inv = GOOD.replace("[0,8]", "[8,0]");
        assert!(matches!(
            parse(&inv, 16),
            Err(SourceError::InvertedOffsets { .. })
        ));
        assert!(matches!(
            parse("{", 0),
            Err(SourceError::MalformedHeader { .. })
        ));
        let big = GOOD.replace("[2]", "[4294967296,4294967296]");
        assert!(matches!(
            parse(&big, 16),
            Err(SourceError::ShapeOverflow { .. })
        ));
    }

    /// The typed parse and the JSON tree read a good header alike; a header
    /// the typed parse refuses gets the tree's error naming the part.
    #[test]
    fn typed_entries_agree_with_the_tree() {
        let flat = |e: Entries| {
            let mut t: Vec<_> = e
                .tensors
                .into_iter()
                .map(|(n, r)| (n, r.dtype, r.shape, r.data_offsets))
                .collect();
            t.sort();
            (e.metadata, t)
        };
        let typed = serde_json::from_slice::<Entries>(GOOD.as_bytes()).unwrap();
        let tree = Entries::from_tree("m.safetensors", GOOD.as_bytes()).unwrap();
        assert_eq!(flat(typed), flat(tree));
        let bad = GOOD.replace(r#""dtype":"BF16""#, r#""dtype":16"#);
        assert!(serde_json::from_slice::<Entries>(bad.as_bytes()).is_err());
        let e = parse(&bad, 16).unwrap_err();
        assert!(
            matches!(&e, SourceError::MalformedHeader { at, .. } if at == "tensor b: "),
            "{e}"
        );
        let meta = GOOD.replace(r#"{"format":"pt"}"#, r#"{"format":1}"#);
        let e = parse(&meta, 16).unwrap_err();
        assert!(
            matches!(&e, SourceError::MalformedHeader { at, .. } if at == "__metadata__: "),
            "{e}"
        );
        let dup = GOOD.replace(r#""a":{"#, r#""b":{"#);
        assert!(matches!(
            parse(&dup, 16),
            Err(SourceError::DuplicateKeys { .. })
        ));
    }

    #[test]
    fn header_length_checks() {
        let n = (MAX_HEADER_LEN + 1).to_le_bytes();
        assert!(matches!(
            SourceHeader::header_len("f", &n, u64::MAX),
            Err(SourceError::HeaderTooLarge { .. })
        ));
        assert!(matches!(
            SourceHeader::header_len("f", &100u64.to_le_bytes(), 50),
            Err(SourceError::HeaderBeyondFile { .. })
        ));
        assert!(matches!(
            SourceHeader::header_len("f", &[1, 2], 2),
            Err(SourceError::TooShort { .. })
        ));
        assert!(matches!(
            SourceHeader::header_len("f", &u64::MAX.to_le_bytes(), u64::MAX),
            Err(SourceError::HeaderTooLarge { .. })
        ));
    }

    #[test]
    fn messages_name_file_and_tensor() {
        let m = GOOD.replace("[2,2]", "[2,3]");
        let msg = parse(&m, 16).unwrap_err().to_string();
        assert!(
            msg.contains("m.safetensors") && msg.contains("tensor b"),
            "{msg}"
        );
    }
}
