//! A modern request's declared capabilities, remembered by their text.
//!
//! A client declares the same `clientCapabilities` on every request. Reading them (a tree for
//! the call, and the legacy declaration its upstream session is keyed by, `Declared::of`) was
//! ~2k instructions of a modern call; finding them by their text is a tenth of that. Reading is
//! a pure function of the text, so what was read once serves every request that declares the
//! same text (a [`TextMemo`]: past [`MAX_ENTRIES`] it starts over, and a text longer than
//! [`MAX_KEY`] bytes is read each time rather than kept).

use std::sync::Arc;

use serde_json::Value;

use crate::memo::TextMemo;
use crate::upstream::{Declared, ExtensionsTooLarge};

/// Declarations remembered at most.
pub(crate) const MAX_ENTRIES: usize = 512;

/// The longest declaration remembered, in bytes (real clients declare a few hundred).
pub(crate) const MAX_KEY: usize = 2 * 1024;

/// Capabilities as read: the tree, and the legacy declaration.
#[derive(Debug, Clone)]
pub(super) struct Read {
    pub(super) tree: Arc<Value>,
    pub(super) declared: Declared,
}

/// Why a declaration is refused.
#[derive(Debug)]
pub(super) enum Refused {
    /// Not a JSON object.
    NotAnObject,
    /// Its extensions passed on are larger than the bound.
    TooLarge(ExtensionsTooLarge),
}

static MEMO: TextMemo<Read> = TextMemo::new(MAX_ENTRIES, MAX_KEY);

/// The capabilities declared as `text` (JSON already checked), their extensions passed on at
/// most `max_extensions_bytes` (checked on every request: the bound is the caller's).
pub(super) fn read(text: &str, max_extensions_bytes: usize) -> Result<Read, Refused> {
    let read = MEMO.get_or_try(text, || {
        let tree = serde_json::from_str::<Value>(text)
            .ok()
            .filter(Value::is_object)
            .ok_or(Refused::NotAnObject)?;
        // Unbounded here: the bound is checked below, remembered or not.
        let declared = Declared::of(&tree, usize::MAX).map_err(Refused::TooLarge)?;
        Ok(Read {
            tree: Arc::new(tree),
            declared,
        })
    })?;
    let bytes = read.declared.extension_bytes();
    if bytes > max_extensions_bytes {
        return Err(Refused::TooLarge(ExtensionsTooLarge { bytes }));
    }
    Ok(read)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_declaration_reads_the_same_remembered_or_not() {
        let text =
            r#"{"sampling":{},"extensions":{"x/a":{"k":1},"x/b":5},"roots":{"listChanged":true}}"#;
        let tree: Value = serde_json::from_str(text).unwrap();
        let fresh = Declared::of(&tree, 1024).unwrap();
        for _ in 0..2 {
            let read = read(text, 1024).unwrap();
            assert_eq!(*read.tree, tree);
            assert_eq!(read.declared, fresh);
        }
        // Too long to keep: read all the same.
        let long = json!({"extensions": {"x/a": {"pad": "p".repeat(MAX_KEY)}}}).to_string();
        let tree: Value = serde_json::from_str(&long).unwrap();
        assert_eq!(
            read(&long, usize::MAX).unwrap().declared,
            Declared::of(&tree, usize::MAX).unwrap()
        );
    }

    #[test]
    fn the_bound_is_the_callers_even_for_a_remembered_declaration() {
        let text = r#"{"extensions":{"x/a":{"k":"0123456789"}}}"#;
        let tree: Value = serde_json::from_str(text).unwrap();
        let Err(too) = Declared::of(&tree, 10) else {
            panic!("over ten bytes")
        };
        assert!(read(text, 1024).is_ok());
        match read(text, 10) {
            Err(Refused::TooLarge(t)) => assert_eq!(t, too),
            other => panic!("{other:?}"),
        }
        assert!(read(text, too.bytes).is_ok());
    }

    #[test]
    fn what_is_not_an_object_is_refused_and_not_remembered() {
        for text in ["[]", "5", "\"caps\"", "null"] {
            assert!(
                matches!(read(text, 1024), Err(Refused::NotAnObject)),
                "{text}"
            );
            assert!(!MEMO.holds(text), "{text}");
        }
    }
}
