//! One pass over a modern request's params: every check of [`super::checked`] (what a tree
//! refuses, a key named twice in any object, the key serde_json reserves) made while the
//! top-level members, and those of `_meta`, are found as spans of the text. Structure is read
//! here, byte by byte; what a tree would make of an atom is left to serde_json itself wherever
//! it is not plain (a number with a fraction, an exponent or many digits; a string with an
//! escape), so that what is taken is what a tree takes. The `params` fuzz target holds it
//! to the tree.

use std::borrow::Cow;

use super::checked::{Keys, Refused, FEW_KEYS, RESERVED_KEY};
use super::plain::plain_run;

/// Containers nested this deep are refused, as serde_json's recursion limit refuses them.
const MAX_DEPTH: usize = 128;
/// Integer digits that always fit a `u64` or `i64`: taken without asking serde_json.
const PLAIN_DIGITS: usize = 18;

/// An object member: its key, and its value as a span of the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Member {
    key: Key,
    value: (usize, usize),
}

/// A key: a span of the text when it holds no escape, else its decoded text.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Key {
    At(usize, usize),
    Own(Box<str>),
}

impl Member {
    /// Its key, read from `text` (the text it was found in).
    pub(super) fn key<'t>(&'t self, text: &'t str) -> &'t str {
        match &self.key {
            Key::At(from, to) => text.get(*from..*to).unwrap_or_default(),
            Key::Own(k) => k,
        }
    }

    /// Its value's text, read from `text` (the text it was found in).
    pub(super) fn value<'t>(&self, text: &'t str) -> &'t str {
        text.get(self.value.0..self.value.1).unwrap_or_default()
    }
}

/// An object's members and, when `_meta` is an object, `_meta`'s (each sorted by key).
pub(super) type Members = (Vec<Member>, Option<Vec<Member>>);

/// What one pass found: `None` when the text is not an object (checked all the same), else its
/// members.
pub(super) type Found = Option<Members>;

/// Checks JSON text `text` and finds its members.
pub(super) fn scan(text: &str) -> Result<Found, Refused> {
    let mut s = Scanner::new(text);
    s.space();
    let found = if s.peek() == Some(b'{') {
        Some(s.params()?)
    } else {
        s.value(0)?;
        None
    };
    s.space();
    if s.at < text.len() {
        return Err(malformed("trailing characters"));
    }
    Ok(found)
}

/// Checks the object `text` opens with (at its `{`; the text may go on past it) as [`scan`]
/// checks params, and finds its members: those and the length of the object's text.
pub(super) fn scan_object(text: &str) -> Result<(Members, usize), Refused> {
    let mut s = Scanner::new(text);
    if s.peek() != Some(b'{') {
        return Err(malformed("expected an object"));
    }
    let found = s.params()?;
    Ok((found, s.at))
}

// By key, as a `BTreeMap` keeps members (keys are unique: a key named twice was refused).
fn sort(text: &str, members: &mut [Member]) {
    members.sort_unstable_by(|a, b| a.key(text).cmp(b.key(text)));
}

fn malformed(why: &str) -> Refused {
    Refused::Malformed(why.to_owned())
}

/// Called with each key of an object, the scanner before its value, and the value's depth.
type OnMember<'f, 'a> =
    dyn FnMut(&mut Scanner<'a>, Cow<'a, str>, usize) -> Result<(), Refused> + 'f;

struct Scanner<'a> {
    text: &'a str,
    at: usize,
    /// The keys of the objects open now, outermost first: one stack for the whole scan, not
    /// an allocation per object.
    keys: Vec<Cow<'a, str>>,
}

impl<'a> Scanner<'a> {
    fn new(text: &'a str) -> Self {
        Self {
            text,
            at: 0,
            keys: Vec::new(),
        }
    }

    /// The params object (at its `{`): its members, and `_meta`'s when it is an object.
    fn params(&mut self) -> Result<Members, Refused> {
        let text = self.text;
        let (mut members, mut meta) = (Vec::new(), None);
        self.object(1, &mut |s, key, depth| match (&*key, s.peek()) {
            ("_meta", Some(b'{')) => {
                let mut inner = Vec::new();
                s.object(depth + 1, &mut |s, key, depth| {
                    s.recorded(key, depth, &mut inner)
                })?;
                sort(text, &mut inner);
                meta = Some(inner);
                Ok(())
            }
            // Dropped: the request is invalid without the protocol version in `_meta`.
            ("_meta", _) => s.value(depth),
            _ => s.recorded(key, depth, &mut members),
        })?;
        sort(text, &mut members);
        Ok((members, meta))
    }

    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    fn space(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\n' | b'\t' | b'\r')) {
            self.at += 1;
        }
    }

    fn expect(&mut self, byte: u8, why: &str) -> Result<(), Refused> {
        if self.peek() != Some(byte) {
            return Err(malformed(why));
        }
        self.at += 1;
        Ok(())
    }

    // A member recorded with its span (the value walked).
    fn recorded(
        &mut self,
        key: Cow<'a, str>,
        depth: usize,
        out: &mut Vec<Member>,
    ) -> Result<(), Refused> {
        let from = self.at;
        self.value(depth)?;
        out.push(Member {
            key: self.key_of(key),
            value: (from, self.at),
        });
        Ok(())
    }

    // A key as a member keeps it: a span when borrowed from the text.
    fn key_of(&self, key: Cow<'a, str>) -> Key {
        match key {
            Cow::Borrowed(k) => {
                let from = k.as_ptr() as usize - self.text.as_ptr() as usize;
                Key::At(from, from + k.len())
            }
            Cow::Owned(k) => Key::Own(k.into()),
        }
    }

    /// One value, `depth` containers around it.
    fn value(&mut self, depth: usize) -> Result<(), Refused> {
        match self.peek() {
            Some(b'{') => self.object(depth + 1, &mut |s, _, depth| s.value(depth)),
            Some(b'[') => self.array(depth + 1),
            Some(b'"') => self.string().map(drop),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b't') => self.literal("true"),
            Some(b'f') => self.literal("false"),
            Some(b'n') => self.literal("null"),
            Some(_) => Err(malformed("expected value")),
            None => Err(malformed("EOF while parsing a value")),
        }
    }

    fn literal(&mut self, word: &str) -> Result<(), Refused> {
        if !self.text[self.at..].starts_with(word) {
            return Err(malformed("expected value"));
        }
        self.at += word.len();
        Ok(())
    }

    /// An object at `depth` (itself counted); `on_member` walks each value.
    fn object(&mut self, depth: usize, on_member: &mut OnMember<'_, 'a>) -> Result<(), Refused> {
        if depth >= MAX_DEPTH {
            return Err(malformed("recursion limit exceeded"));
        }
        self.at += 1;
        self.space();
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Ok(());
        }
        let (start, mut many) = (self.keys.len(), None);
        loop {
            if self.peek() != Some(b'"') {
                return Err(malformed("key must be a string"));
            }
            let key = self.string()?;
            if key == RESERVED_KEY {
                return Err(Refused::ReservedKey);
            }
            if !self.first_time(start, &mut many, key.clone()) {
                return Err(Refused::DuplicateKey);
            }
            self.space();
            self.expect(b':', "expected `:`")?;
            self.space();
            on_member(self, key, depth)?;
            self.space();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b'}') => {
                    self.at += 1;
                    self.keys.truncate(start);
                    return Ok(());
                }
                _ => return Err(malformed("expected `,` or `}`")),
            }
            self.space();
        }
    }

    // Whether `key` is new to the object whose keys start at `start` of the stack (compared one
    // by one); an object with many keys has them moved into a set (`many`).
    fn first_time(&mut self, start: usize, many: &mut Option<Keys<'a>>, key: Cow<'a, str>) -> bool {
        if let Some(set) = many {
            return set.insert(key);
        }
        if self.keys[start..].contains(&key) {
            return false;
        }
        self.keys.push(key);
        if self.keys.len() - start > FEW_KEYS {
            let mut set = Keys::default();
            for k in self.keys.drain(start..) {
                set.insert(k);
            }
            *many = Some(set);
        }
        true
    }

    /// An array at `depth` (itself counted).
    fn array(&mut self, depth: usize) -> Result<(), Refused> {
        if depth >= MAX_DEPTH {
            return Err(malformed("recursion limit exceeded"));
        }
        self.at += 1;
        self.space();
        if self.peek() == Some(b']') {
            self.at += 1;
            return Ok(());
        }
        loop {
            self.value(depth)?;
            self.space();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b']') => {
                    self.at += 1;
                    return Ok(());
                }
                _ => return Err(malformed("expected `,` or `]`")),
            }
            self.space();
        }
    }

    /// A string (at its opening quote): borrowed when plain, else decoded by serde_json (which
    /// refuses a lone surrogate, as a tree does).
    fn string(&mut self) -> Result<Cow<'a, str>, Refused> {
        let text = self.text;
        let bytes = text.as_bytes();
        let from = self.at + 1;
        let mut at = plain_run(bytes, from);
        let mut escaped = false;
        loop {
            match bytes.get(at) {
                Some(b'"') => break,
                Some(b'\\') => {
                    escaped = true;
                    at += 2;
                }
                Some(0..=0x1f) => {
                    return Err(malformed("control character found while parsing a string"))
                }
                Some(_) => at += 1,
                None => return Err(malformed("EOF while parsing a string")),
            }
        }
        self.at = at + 1;
        if !escaped {
            return Ok(Cow::Borrowed(&text[from..at]));
        }
        serde_json::from_str::<String>(&text[from - 1..=at])
            .map(Cow::Owned)
            .map_err(|e| Refused::Malformed(e.to_string()))
    }

    /// A number: plain integers taken here, the rest as serde_json parses them (one out of
    /// range refused, as a tree refuses it).
    fn number(&mut self) -> Result<(), Refused> {
        let bytes = self.text.as_bytes();
        let from = self.at;
        let digits = |at: usize| {
            bytes[at..]
                .iter()
                .position(|b| !b.is_ascii_digit())
                .map_or(bytes.len(), |n| at + n)
        };
        let int = from + usize::from(bytes[from] == b'-');
        let mut at = digits(int);
        let plain = at > int && at - int <= PLAIN_DIGITS && (bytes[int] != b'0' || at == int + 1);
        let mut fancy = false;
        if bytes.get(at) == Some(&b'.') {
            at = digits(at + 1);
            fancy = true;
        }
        if matches!(bytes.get(at), Some(b'e' | b'E')) {
            at += 1;
            if matches!(bytes.get(at), Some(b'+' | b'-')) {
                at += 1;
            }
            at = digits(at);
            fancy = true;
        }
        self.at = at;
        if plain && !fancy {
            return Ok(());
        }
        match serde_json::from_str::<serde_json::Value>(&self.text[from..at]) {
            Ok(_) => Ok(()),
            Err(e) => Err(Refused::Malformed(e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    fn refused(text: &str) -> Option<Refused> {
        scan(text).err()
    }

    fn malformed(text: &str) -> bool {
        matches!(refused(text), Some(Refused::Malformed(_)))
    }

    #[test]
    fn members_and_meta_members_are_found_by_key() {
        let text = r#" {"name" : "t", "a\u0062c":[1,{"x":null}],"_meta":{"z":1,"k\"ey":"v"}} "#;
        let Ok(Some((members, Some(meta)))) = scan(text) else {
            panic!("an object with a _meta object");
        };
        let read = |ms: &[Member]| -> Vec<(String, String)> {
            let pairs = ms
                .iter()
                .map(|m| (m.key(text).into(), m.value(text).into()));
            pairs.collect()
        };
        assert_eq!(
            read(&members),
            [
                ("abc".into(), r#"[1,{"x":null}]"#.into()),
                ("name".into(), r#""t""#.into())
            ]
        );
        assert_eq!(
            read(&meta),
            [("k\"ey".into(), r#""v""#.into()), ("z".into(), "1".into())]
        );
        assert!(matches!(scan("[1]"), Ok(None)));
        assert!(matches!(scan(r#"{"_meta":[{}]}"#), Ok(Some((m, None))) if m.is_empty()));
    }

    #[test]
    fn a_key_named_twice_is_refused_at_any_depth() {
        for twice in [
            r#"{"a":1,"a":2}"#,
            r#"{"_meta":{"k":1,"k":2}}"#,
            r#"{"arguments":{"x":[{"p":1,"\u0070":2}]}}"#,
            r#"[{"a":{"b":{"c":1,"c":1}}}]"#,
        ] {
            assert_eq!(refused(twice), Some(Refused::DuplicateKey), "{twice}");
        }
        assert_eq!(
            scan(r#"{"a":{"a":{"a":1}},"b":[{"a":1},{"a":2}]}"#).err(),
            None
        );
        // Keys are kept on one stack: an object's are forgotten when it closes, its parent's
        // are still compared after it, and an object past the few keys compared one by one
        // is checked through a set.
        let many = |extra: &str| {
            let keys: Vec<String> = (0..20).map(|i| format!(r#""k{i}":{{"k0":1}}"#)).collect();
            format!("{{{},{extra}}}", keys.join(","))
        };
        assert_eq!(scan(r#"{"x":{"b":1},"b":2}"#).err(), None);
        assert_eq!(refused(&many(r#""k3":0"#)), Some(Refused::DuplicateKey));
        assert_eq!(refused(&many(r#""k19":0"#)), Some(Refused::DuplicateKey));
        assert_eq!(scan(&many(r#""k20":{"k20":{"k1":1}}"#)).err(), None);
    }

    #[test]
    fn the_reserved_key_is_refused_at_any_depth() {
        for reserved in [
            r#"{"$serde_json::private::RawValue":"1"}"#,
            r#"{"a":[{"\u0024serde_json::private::RawValue":"1"}]}"#,
        ] {
            assert_eq!(refused(reserved), Some(Refused::ReservedKey), "{reserved}");
        }
    }

    #[test]
    fn numbers_and_strings_a_tree_refuses_are_refused() {
        let long = format!("{{\"n\":1{}}}", "0".repeat(400));
        for bad in [
            r#"{"n":1e999}"#,
            r#"{"n":-1.5E+400}"#,
            long.as_str(),
            r#"{"s":"\ud800"}"#,
            r#"{"s":"a\udc00b"}"#,
            r#"{"\ud83d":1}"#,
            "{\"s\":\"tab\there\"}",
            r#"{"n":01}"#,
            r#"{"n":1.}"#,
            r#"{"n":-}"#,
            r#"{"a":tru}"#,
            r#"{"a":1,}"#,
            r#"{"a":1} x"#,
        ] {
            assert!(malformed(bad), "{bad}");
            assert!(serde_json::from_str::<Value>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn what_a_tree_takes_is_taken() {
        let big = format!("{{\"n\":{}}}", "9".repeat(300));
        for ok in [
            r#"{"n":[0,-0,123456789012345678,1234567890123456789012,1.5e-400,2E+3,-0.25]}"#,
            r#"{"s":"\ud83d\ude00 \" \\ \/ \b \f \n \r \t é 😀"}"#,
            r#"{"s":"a string longer than eight bytes, with a \"quote\" late in it"}"#,
            r#"{"t":true,"f":false,"z":null,"e":{},"l":[]}"#,
            big.as_str(),
        ] {
            assert_eq!(refused(ok), None, "{ok}");
            assert!(serde_json::from_str::<Value>(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn nesting_stops_where_a_tree_stops() {
        let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert_eq!(refused(&nested(127)), None);
        assert!(malformed(&nested(128)));
        assert!(serde_json::from_str::<Value>(&nested(128)).is_err());
        let meta = |n: usize| format!(r#"{{"_meta":{{"k":{}}}}}"#, nested(n));
        assert_eq!(refused(&meta(125)), None);
        assert!(malformed(&meta(126)));
    }
}
