//! The params checked as a tree would check them, without building one: every number in range,
//! every string well formed (no lone surrogate), nesting within serde_json's recursion limit —
//! and, stricter than a tree, no object naming a key twice, nor the key serde_json reserves for
//! itself. The params are then read and forwarded as text, so this is what keeps what the proxy
//! reads of them (the request digest a token binds, the approval form a person sees) the same as
//! what the upstream parses: a tree keeps a duplicated key's last value, another parser may keep
//! its first; and a tree reads `{"$serde_json::private::RawValue": "<text>"}` as the value
//! `<text>` holds, where any other parser reads an object.
//!
//! A gated legacy body is checked by this walk (`check`); a modern request's params by `scan`,
//! which makes the same checks in the pass that finds their members.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

use serde::de::{Deserialize, Deserializer, Error, MapAccess, SeqAccess, Visitor};

/// Why JSON text is not params the proxy takes.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Refused {
    /// What a tree refuses: serde_json's message.
    Malformed(String),
    /// An object names a key twice.
    DuplicateKey,
    /// An object names the key serde_json's tree reads as something else ([`RESERVED_KEY`]).
    ReservedKey,
}

/// Checks JSON text `json` (known to be JSON: the envelope was parsed).
pub(super) fn check(json: &str) -> Result<(), Refused> {
    match serde_json::from_str::<Checked>(json) {
        Ok(Checked) => Ok(()),
        Err(e) if e.to_string().starts_with(DUPLICATE) => Err(Refused::DuplicateKey),
        Err(e) if e.to_string().starts_with(RESERVED_KEY) => Err(Refused::ReservedKey),
        Err(e) => Err(Refused::Malformed(e.to_string())),
    }
}

/// The key serde_json (with the `raw_value` feature, which the proxy uses) reserves: a tree
/// reads an object whose first key it is as the JSON text its value holds. Refused anywhere
/// (also the error it raises). serde_json's other reserved key, `$serde_json::private::Number`,
/// is only read so with `arbitrary_precision`, which is off.
pub(super) const RESERVED_KEY: &str = "$serde_json::private::RawValue";
/// The error a duplicated key raises (serde_json appends the position).
const DUPLICATE: &str = "duplicate key";
/// Keys of one object compared one by one up to this many, then through a set.
pub(super) const FEW_KEYS: usize = 16;

/// A JSON value walked through: every part parsed, nothing kept.
struct Checked;

impl<'de> Deserialize<'de> for Checked {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Walk)
    }
}

struct Walk;

impl<'de> Visitor<'de> for Walk {
    type Value = Checked;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_str<E>(self, _: &str) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_unit<E>(self) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
        while seq.next_element::<Checked>()?.is_some() {}
        Ok(Checked)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
        let mut keys = Keys::default();
        while let Some(Key(key)) = map.next_key()? {
            if key == RESERVED_KEY {
                return Err(A::Error::custom(RESERVED_KEY));
            }
            if !keys.insert(key) {
                return Err(A::Error::custom(DUPLICATE));
            }
            map.next_value::<Checked>()?;
        }
        Ok(Checked)
    }
}

/// An object's keys so far: borrowed from the text unless they hold escapes.
#[derive(Default)]
pub(super) struct Keys<'de> {
    few: Vec<Cow<'de, str>>,
    many: Option<HashSet<Cow<'de, str>>>,
}

impl<'de> Keys<'de> {
    // False when `key` was there already.
    pub(super) fn insert(&mut self, key: Cow<'de, str>) -> bool {
        if let Some(set) = &mut self.many {
            return set.insert(key);
        }
        if self.few.contains(&key) {
            return false;
        }
        self.few.push(key);
        if self.few.len() > FEW_KEYS {
            self.many = Some(self.few.drain(..).collect());
        }
        true
    }
}

/// An object key, parsed (escapes included) and borrowed where it can be.
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Text;
        impl<'de> Visitor<'de> for Text {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(Text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_tree_takes_passes() {
        for ok in [
            r#"{"name":"t","arguments":{"a":[1,-2,3.5e10,"\u00e9\ud83d\ude00",null,true,{}]}}"#,
            "{}",
            "[1]",
            r#"{"k\"ey":1,"k\\ey":2}"#,
        ] {
            assert_eq!(check(ok), Ok(()), "{ok}");
            assert!(serde_json::from_str::<serde_json::Value>(ok).is_ok());
        }
    }

    #[test]
    fn what_a_tree_refuses_is_refused() {
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        for bad in [
            r#"{"arguments":{"x":1e400}}"#,
            r#"{"arguments":{"x":"\ud800"}}"#,
            r#"{"\udc00":1}"#,
            deep.as_str(),
        ] {
            assert!(matches!(check(bad), Err(Refused::Malformed(_))), "{bad}");
            assert!(serde_json::from_str::<serde_json::Value>(bad).is_err());
        }
    }

    #[test]
    fn a_key_named_twice_in_any_object_is_refused() {
        let many: String = (0..40).map(|i| format!(r#""k{i}":{i},"#)).collect();
        for twice in [
            r#"{"name":"a","name":"b"}"#.to_owned(),
            r#"{"arguments":{"path":"/etc/shadow","path":"/tmp/ok"}}"#.to_owned(),
            r#"{"a":[{"x":1,"\u0078":2}]}"#.to_owned(),
            format!(r#"{{{many}"k7":0}}"#),
        ] {
            assert_eq!(check(&twice), Err(Refused::DuplicateKey), "{twice}");
        }
        assert_eq!(check(&format!(r#"{{{many}"last":0}}"#)), Ok(()));
    }

    // Found by the `params` and `sse_messages` fuzz targets: a tree read the object as the
    // value its string held, the upstream would read an object.
    #[test]
    fn the_key_serde_json_reserves_is_refused_anywhere() {
        let misread =
            r#"{"name":"t","arguments":{"repo":{"$serde_json::private::RawValue":"\"ok\""}}}"#;
        let tree: serde_json::Value = serde_json::from_str(misread).unwrap();
        assert_eq!(tree["arguments"]["repo"], "ok", "what a tree makes of it");
        for reserved in [
            misread,
            r#"{"$serde_json::private::RawValue":"1"}"#,
            r#"[{"a":1,"$serde_json::private::RawValue":"1"}]"#,
            r#"{"\u0024serde_json::private::RawValue":"1"}"#,
        ] {
            assert_eq!(check(reserved), Err(Refused::ReservedKey), "{reserved}");
        }
        assert_eq!(check(r#"{"$serde_json::private::Number":"1"}"#), Ok(()));
    }
}
