//! Duplicate keys in JSON objects.
//!
//! JSON maps built by serde keep the last of two equal keys, so a header
//! naming a tensor twice (perhaps with two dtypes) would be read as if the
//! first never existed. A verifier must refuse that: [`scan`]
//! walks the whole document once and lists every key that repeats within
//! its object.
//!
//! The same walk answers whether any decoded string (a key or a value)
//! holds a credential of this process ([`scan`]): a scan of the raw bytes
//! misses a token written with `\u` escapes, which every parser decodes
//! into the same string.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt::{self, Write as _};

use foldhash::fast::RandomState;
use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// A key that appears more than once in one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DuplicateKey {
    /// Where the object is (`weight_map`, `layers[2]`; empty for the top).
    pub object: String,
    /// The repeated key.
    pub key: String,
}

impl fmt::Display for DuplicateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.object.is_empty() {
            write!(f, "{:?}", self.key)
        } else {
            write!(f, "{:?} in {}", self.key, self.object)
        }
    }
}

/// What one walk of a JSON document found.
#[derive(Debug, Default)]
pub struct Findings {
    /// Every repeated key, in document order (once per repetition).
    pub duplicates: Vec<DuplicateKey>,
    /// True when a decoded key or string value holds a registered
    /// credential (`ftpipe_secrets`), or the raw bytes do.
    pub holds_secret: bool,
}

/// True when `json` holds a registered secret, raw or in a string or key
/// as parsed (a `\u`-escaped token included); bytes that do not parse
/// are searched raw.
pub fn holds_secret(json: &[u8]) -> bool {
    scan(json).map_or_else(
        |_| ftpipe_secrets::contains_secret(json),
        |found| found.holds_secret,
    )
}

/// Walks `json` once: its repeated keys, and whether it holds a credential
/// in any form a parser would decode. Fails only when `json` is not JSON.
/// A document without a backslash has no escapes, so each string decodes
/// to the bytes between its quotes: the search of the raw bytes then
/// covers every string, and the walk searches none of them again.
pub fn scan(json: &[u8]) -> Result<Findings, serde_json::Error> {
    let mut found = Findings {
        holds_secret: ftpipe_secrets::contains_secret(json),
        ..Findings::default()
    };
    let mut de = serde_json::Deserializer::from_slice(json);
    Walk {
        path: &mut String::new(),
        found: &mut found,
        strings_decoded: memchr::memchr(b'\\', json).is_some(),
    }
    .deserialize(&mut de)?;
    de.end()?;
    Ok(found)
}

/// Lists duplicates as one line: `"a", "b" in weight_map`.
pub fn describe(dups: &[DuplicateKey]) -> String {
    dups.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// One value of the document at `path` (`weight_map.a`, `layers[2]`;
/// empty at the top): a buffer the walk extends while it descends and cuts
/// back after, so that a key costs no allocation unless it repeats.
struct Walk<'a> {
    path: &'a mut String,
    found: &'a mut Findings,
    /// Strings may decode to other bytes than the document's (it holds
    /// escapes): each is searched for a credential as decoded.
    strings_decoded: bool,
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, v: &str) -> Result<(), E> {
        if self.strings_decoded {
            self.found.holds_secret |= ftpipe_secrets::contains_secret(v.as_bytes());
        }
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let (path, found, strings_decoded) = (self.path, self.found, self.strings_decoded);
        let object = path.len();
        for i in 0usize.. {
            // Writing to a String cannot fail.
            let _ = write!(path, "[{i}]");
            let more = seq.next_element_seed(Walk {
                path: &mut *path,
                found: &mut *found,
                strings_decoded,
            })?;
            path.truncate(object);
            if more.is_none() {
                break;
            }
        }
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let (path, found, strings_decoded) = (self.path, self.found, self.strings_decoded);
        let object = path.len();
        // Seeded per process: a document cannot choose keys that collide.
        let mut seen: HashSet<Cow<'de, str>, RandomState> = HashSet::default();
        while let Some(key) = map.next_key_seed(Key)? {
            if strings_decoded {
                found.holds_secret |= ftpipe_secrets::contains_secret(key.as_bytes());
            }
            if object > 0 {
                path.push('.');
            }
            path.push_str(&key);
            if let Some(repeated) = seen.replace(key) {
                found.duplicates.push(DuplicateKey {
                    object: path[..object].to_owned(),
                    key: repeated.into_owned(),
                });
            }
            map.next_value_seed(Walk {
                path: &mut *path,
                found: &mut *found,
                strings_decoded,
            })?;
            path.truncate(object);
        }
        Ok(())
    }
}

/// An object's key, borrowed from the document unless it holds escapes.
struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Cow<'de, str>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Cow<'de, str>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Borrowed(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan_duplicates(json: &[u8]) -> Result<Vec<DuplicateKey>, serde_json::Error> {
        scan(json).map(|f| f.duplicates)
    }

    #[test]
    fn finds_every_repeat_at_any_depth() {
        let json = br#"{"a": 1, "b": {"x": [1, {"y": 1, "y": 2}], "x": 0}, "a": 2, "a": 3}"#;
        let d = scan_duplicates(json).unwrap();
        let got: Vec<(String, String)> = d.into_iter().map(|d| (d.object, d.key)).collect();
        assert_eq!(
            got,
            [
                ("b.x[1]".to_owned(), "y".to_owned()),
                ("b".to_owned(), "x".to_owned()),
                (String::new(), "a".to_owned()),
                (String::new(), "a".to_owned()),
            ]
        );
        assert!(
            scan_duplicates(br#"{"a": 1, "b": {"a": 1}}"#)
                .unwrap()
                .is_empty()
        );
        assert!(scan_duplicates(b"{\"a\": ").is_err());
        assert!(scan_duplicates(b"{} x").is_err());
    }

    #[test]
    fn a_credential_is_found_however_its_string_is_escaped() {
        ftpipe_secrets::register("hf_json_scan_secret");
        let plain = br#"{"a": ["x", {"b": "..hf_json_scan_secret.."}]}"#;
        let escaped = br#"{"a": "hf\u005fjson\u005fscan_secret"}"#;
        let as_key = br#"{"hf_json_\u0073can_secret": 1}"#;
        for json in [&plain[..], escaped, as_key] {
            assert!(
                scan(json).unwrap().holds_secret,
                "{}",
                String::from_utf8_lossy(json)
            );
        }
        assert!(!scan(br#"{"a": "hf_json_scan"}"#).unwrap().holds_secret);
    }
}
