//! What the hub and the CAS answer, as the Xet protocol documents it
//! (xet-core `cas_types`; huggingface_hub `utils/_xet.py`): the read token,
//! and a file's reconstruction (v2: per-xorb multi-range fetches; v1:
//! per-xorb fetch infos), both read into one [`Reconstruction`] whose terms
//! each carry the one xorb byte range that holds them.
//!
//! The types are small serde structs rather than `xet-client`'s (its
//! `cas_types` come with its whole client and runtime); the field names and
//! range conventions are the protocol's: chunk ranges `[start, end)`,
//! byte ranges `[start, end]` (inclusive, as in an HTTP `Range`).

use std::collections::HashMap;

use serde::Deserialize;

/// A reconstruction answer larger than this is refused while reading.
pub const MAX_RECONSTRUCTION_BYTES: u64 = 64 << 20;
/// A read-token answer larger than this is refused while reading.
pub const MAX_TOKEN_BYTES: u64 = 64 << 10;
/// A xorb range longer than this is refused before it is asked (a xorb
/// holds at most 64 MiB).
pub const MAX_XORB_RANGE_BYTES: u64 = 64 << 20;

/// A range as the protocol writes it.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
pub struct WireRange {
    /// First index.
    pub start: u64,
    /// End: exclusive for chunks, inclusive for bytes.
    pub end: u64,
}

#[derive(Debug, Deserialize)]
struct WireTerm {
    hash: String,
    unpacked_length: u64,
    range: WireRange,
}

#[derive(Debug, Deserialize)]
struct V2Fetch {
    url: String,
    ranges: Vec<V2Range>,
}

#[derive(Debug, Deserialize)]
struct V2Range {
    chunks: WireRange,
    bytes: WireRange,
}

#[derive(Debug, Deserialize)]
struct V2 {
    offset_into_first_range: u64,
    terms: Vec<WireTerm>,
    xorbs: HashMap<String, Vec<V2Fetch>>,
}

#[derive(Debug, Deserialize)]
struct V1Fetch {
    range: WireRange,
    url: String,
    url_range: WireRange,
}

#[derive(Debug, Deserialize)]
struct V1 {
    offset_into_first_range: u64,
    terms: Vec<WireTerm>,
    fetch_info: HashMap<String, Vec<V1Fetch>>,
}

/// Where a term's bytes are: a URL and the xorb byte range `[first, last]`
/// holding chunks `[chunk_start, chunk_end)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XorbFetch {
    /// The (presigned) URL.
    pub url: String,
    /// The first chunk the range holds.
    pub chunk_start: u64,
    /// One past the last chunk it holds.
    pub chunk_end: u64,
    /// First byte.
    pub first: u64,
    /// Last byte (inclusive).
    pub last: u64,
}

/// One term: chunks `[chunk_start, chunk_end)` of a xorb, `length` bytes
/// once decoded, fetched through `fetch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Term {
    /// The xorb's hash (64 hex).
    pub xorb: String,
    /// First chunk.
    pub chunk_start: u64,
    /// One past the last chunk.
    pub chunk_end: u64,
    /// Decoded length.
    pub length: u64,
    /// The range to fetch.
    pub fetch: XorbFetch,
}

#[cfg(test)]
impl Term {
    /// Chunks `chunks` of `xorb`, `length` bytes, in a range of chunks
    /// 0..10 at bytes 0-99.
    pub(crate) fn for_test(xorb: &str, chunks: std::ops::Range<u64>, length: u64) -> Term {
        Term {
            xorb: xorb.to_owned(),
            chunk_start: chunks.start,
            chunk_end: chunks.end,
            length,
            fetch: XorbFetch {
                url: "u".into(),
                chunk_start: 0,
                chunk_end: 10,
                first: 0,
                last: 99,
            },
        }
    }
}

/// A file's (or a span's) reconstruction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reconstruction {
    /// Bytes of the first term before the span asked.
    pub offset: u64,
    /// The terms, in file order.
    pub terms: Vec<Term>,
}

/// Why a reconstruction answer is refused (JSON paths named).
#[derive(Debug, thiserror::Error)]
pub enum ReconstructionError {
    /// Not the JSON of either version.
    #[error("not a reconstruction: {0}")]
    Json(#[source] serde_json::Error),
    /// A term no fetch covers, or an inconsistent range.
    #[error("terms[{index}]: {what}")]
    Term {
        /// The term's index.
        index: usize,
        /// What is wrong.
        what: String,
    },
}

impl Reconstruction {
    /// Reads a v2 answer.
    pub fn from_v2(body: &[u8]) -> Result<Reconstruction, ReconstructionError> {
        let v2: V2 = serde_json::from_slice(body).map_err(ReconstructionError::Json)?;
        let mut by_xorb: HashMap<String, Vec<XorbFetch>> = HashMap::new();
        for (xorb, fetches) in v2.xorbs {
            let list = by_xorb.entry(xorb).or_default();
            for f in fetches {
                list.extend(f.ranges.into_iter().map(|r| XorbFetch {
                    url: f.url.clone(),
                    chunk_start: r.chunks.start,
                    chunk_end: r.chunks.end,
                    first: r.bytes.start,
                    last: r.bytes.end,
                }));
            }
        }
        Self::assemble(v2.offset_into_first_range, v2.terms, &by_xorb)
    }

    /// Reads a v1 answer.
    pub fn from_v1(body: &[u8]) -> Result<Reconstruction, ReconstructionError> {
        let v1: V1 = serde_json::from_slice(body).map_err(ReconstructionError::Json)?;
        let by_xorb: HashMap<String, Vec<XorbFetch>> = v1
            .fetch_info
            .into_iter()
            .map(|(xorb, infos)| {
                let list = infos
                    .into_iter()
                    .map(|i| XorbFetch {
                        url: i.url,
                        chunk_start: i.range.start,
                        chunk_end: i.range.end,
                        first: i.url_range.start,
                        last: i.url_range.end,
                    })
                    .collect();
                (xorb, list)
            })
            .collect();
        Self::assemble(v1.offset_into_first_range, v1.terms, &by_xorb)
    }

    fn assemble(
        offset: u64,
        wire: Vec<WireTerm>,
        fetches: &HashMap<String, Vec<XorbFetch>>,
    ) -> Result<Reconstruction, ReconstructionError> {
        let mut terms = Vec::with_capacity(wire.len());
        for (index, t) in wire.into_iter().enumerate() {
            let bad = |what: String| ReconstructionError::Term { index, what };
            let (start, end) = (t.range.start, t.range.end);
            if start >= end || t.unpacked_length == 0 {
                return Err(bad(format!(
                    "empty term: chunks {start}..{end}, {} bytes",
                    t.unpacked_length
                )));
            }
            let fetch = fetches
                .get(&t.hash)
                .and_then(|l| {
                    l.iter()
                        .find(|f| f.chunk_start <= start && end <= f.chunk_end)
                })
                .ok_or_else(|| {
                    bad(format!(
                        "no fetch holds chunks {start}..{end} of xorb {}",
                        t.hash
                    ))
                })?;
            if fetch.first > fetch.last || fetch.last - fetch.first >= MAX_XORB_RANGE_BYTES {
                return Err(bad(format!(
                    "byte range {}-{} of xorb {} is reversed or longer than {MAX_XORB_RANGE_BYTES} bytes",
                    fetch.first, fetch.last, t.hash
                )));
            }
            terms.push(Term {
                xorb: t.hash,
                chunk_start: start,
                chunk_end: end,
                length: t.unpacked_length,
                fetch: fetch.clone(),
            });
        }
        if terms.first().is_some_and(|t| offset >= t.length) {
            return Err(ReconstructionError::Term {
                index: 0,
                what: format!("offset_into_first_range {offset} is past the term"),
            });
        }
        Ok(Reconstruction { offset, terms })
    }
}

/// The read-token JSON body (hf_xet's refresher reads it).
#[derive(Debug, Deserialize)]
pub struct TokenBody {
    /// The CAS token.
    #[serde(rename = "accessToken")]
    pub access_token: String,
    /// Its expiry, seconds since the epoch.
    pub exp: u64,
    /// The CAS URL.
    #[serde(rename = "casUrl")]
    pub cas_url: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    const X: &str = "aa";

    fn v2(terms: &str, bytes: &str) -> String {
        format!(
            r#"{{"offset_into_first_range":3,"terms":[{terms}],
               "xorbs":{{"{X}":[{{"url":"http://c/x","ranges":[{{"chunks":{{"start":0,"end":4}},"bytes":{bytes}}}]}}]}}}}"#
        )
    }

    #[test]
    fn v1_and_v2_give_each_term_the_range_that_holds_it() {
        let term =
            format!(r#"{{"hash":"{X}","unpacked_length":100,"range":{{"start":1,"end":3}}}}"#);
        let r = Reconstruction::from_v2(v2(&term, r#"{"start":0,"end":99}"#).as_bytes()).unwrap();
        assert_eq!(r.offset, 3);
        assert_eq!((r.terms[0].fetch.first, r.terms[0].fetch.last), (0, 99));
        let v1 = format!(
            r#"{{"offset_into_first_range":0,"terms":[{term}],
               "fetch_info":{{"{X}":[{{"range":{{"start":1,"end":3}},"url":"u","url_range":{{"start":5,"end":9}}}}]}}}}"#
        );
        let r = Reconstruction::from_v1(v1.as_bytes()).unwrap();
        assert_eq!(r.terms[0].fetch.url, "u");
    }

    #[test]
    fn a_term_no_range_holds_or_a_huge_range_is_refused_naming_the_term() {
        let outside =
            format!(r#"{{"hash":"{X}","unpacked_length":100,"range":{{"start":3,"end":9}}}}"#);
        let e = Reconstruction::from_v2(v2(&outside, r#"{"start":0,"end":99}"#).as_bytes());
        assert!(
            e.unwrap_err()
                .to_string()
                .starts_with("terms[0]: no fetch holds")
        );
        let term =
            format!(r#"{{"hash":"{X}","unpacked_length":100,"range":{{"start":0,"end":2}}}}"#);
        let huge = format!(r#"{{"start":0,"end":{MAX_XORB_RANGE_BYTES}}}"#);
        let e = Reconstruction::from_v2(v2(&term, &huge).as_bytes()).unwrap_err();
        assert!(e.to_string().contains("longer than"), "{e}");
        let e = Reconstruction::from_v2(b"[]").unwrap_err();
        assert!(e.to_string().starts_with("not a reconstruction"), "{e}");
    }
}
