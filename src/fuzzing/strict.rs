//! The oracles' own reading of JSON text: a `serde_json::Value` built by a visitor that reads
//! every key as a key and refuses an object naming one twice (a `Value` keeps the last of them,
//! silently). Written apart from the proxy's walker (`front::params::checked`), so that the two
//! can disagree; a tree that reads the text otherwise than this visitor is a failure too.

use std::fmt;

use serde::de::{Deserialize, Deserializer, Error, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// How JSON text reads.
#[derive(Debug, PartialEq)]
pub(super) enum Read {
    /// As a tree reads it, no key named twice.
    Value(Value),
    /// Not JSON, or JSON a tree refuses (a number out of range, a lone surrogate, too deep).
    Malformed,
    /// JSON a tree takes, but some object names a key twice.
    Duplicate,
    /// Some object names the key serde_json reserves (with its `raw_value` feature, a tree reads
    /// `{"$serde_json::private::RawValue": "<text>"}` as the value `<text>` holds, where JSON
    /// says it is an object): refused by the proxy wherever it is, modelled here on purpose.
    Reserved,
}

/// Reads `bytes` as the oracle does; a tree (`serde_json::from_slice::<Value>`) must agree with
/// it on everything but duplicated keys (checked here, so every caller relies on it).
pub(super) fn read(bytes: &[u8]) -> Read {
    let tree = serde_json::from_slice::<Value>(bytes);
    // JSON text is UTF-8 (RFC 8259 §8.1): bytes that are not are malformed, whatever else is
    // wrong with them (a key named twice before the bad byte included).
    if std::str::from_utf8(bytes).is_err() {
        assert!(tree.is_err(), "a tree takes text that is not UTF-8");
        return Read::Malformed;
    }
    match serde_json::from_slice::<Strict>(bytes) {
        Ok(Strict(v)) => {
            let Ok(tree) = tree else {
                panic!("the oracle takes what a tree refuses");
            };
            assert_eq!(tree, v, "the oracle reads other values than a tree");
            Read::Value(v)
        }
        // The key comes before its value: a key named twice (or reserved) is what is wrong
        // first, whatever follows it (a tree may refuse the text later, or keep the last value).
        Err(e) if e.to_string().starts_with(DUPLICATE) => Read::Duplicate,
        Err(e) if e.to_string().starts_with(RESERVED) => Read::Reserved,
        Err(e) => {
            assert!(tree.is_err(), "the oracle refuses what a tree takes: {e}");
            Read::Malformed
        }
    }
}

const DUPLICATE: &str = "oracle: duplicate key";
const RESERVED: &str = "oracle: reserved key";
/// The key serde_json's `Value` reads as raw JSON text (its `raw_value` feature).
const RAW_VALUE_KEY: &str = "$serde_json::private::RawValue";

/// A value whose objects name each key once.
struct Strict(Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Build).map(Self)
    }
}

struct Build;

impl<'de> Visitor<'de> for Build {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JSON")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(Strict(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if key == RAW_VALUE_KEY {
                return Err(A::Error::custom(RESERVED));
            }
            if out.contains_key(&key) {
                return Err(A::Error::custom(DUPLICATE));
            }
            let Strict(value) = map.next_value()?;
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}
