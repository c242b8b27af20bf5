//! Compiled `requestedSchema`s, remembered by their text.
//!
//! Compiling a JSON Schema costs far more than the rest of a round (`docs/BENCHMARKS.md` has
//! the profile), and an upstream's tool asks
//! with the same schema every time. Compiling is a pure function of the schema, so a validator
//! compiled once serves every round that asks with the same text. The memo (a [`TextMemo`]) is
//! bounded: past [`MAX_ENTRIES`] it starts over, and schemas longer than [`MAX_KEY`] bytes are
//! compiled each time rather than kept.

use std::sync::Arc;

use serde_json::Value;

use crate::memo::TextMemo;

/// Schemas remembered at most; an upstream that asks with ever-new schemas only costs a
/// compile per round, as it would with no memo.
pub(crate) const MAX_ENTRIES: usize = 1024;

/// The longest schema text remembered, in bytes.
pub(crate) const MAX_KEY: usize = 16 * 1024;

type Compiled = Option<Arc<jsonschema::Validator>>;

static MEMO: TextMemo<Compiled> = TextMemo::new(MAX_ENTRIES, MAX_KEY);

/// The validator for `schema` (`None` when it does not compile: answers then pass unchecked).
pub(crate) fn compiled(schema: &Value) -> Compiled {
    MEMO.get_or(&crate::jsonrpc::text(schema), || compile(schema))
}

fn compile(schema: &Value) -> Compiled {
    match jsonschema::validator_for(schema) {
        Ok(v) => Some(Arc::new(v)),
        Err(e) => {
            tracing::debug!(error = %e, "the upstream's requestedSchema does not compile; answers pass unchecked");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_same_schema_text_gets_the_same_validator() {
        let schema = json!({"type": "object", "properties": {"memo-test-a": {"type": "string"}}});
        let a = compiled(&schema).expect("compiles");
        // Another value with the same text.
        let again = json!({"type": "object", "properties": {"memo-test-a": {"type": "string"}}});
        let b = compiled(&again).expect("compiles");
        assert!(Arc::ptr_eq(&a, &b));
        let other = json!({"type": "object", "properties": {"memo-test-b": {"type": "integer"}}});
        let c = compiled(&other).expect("compiles");
        assert!(!Arc::ptr_eq(&a, &c));
        assert!(c.is_valid(&json!({"memo-test-b": 3})));
        assert!(!c.is_valid(&json!({"memo-test-b": "three"})));
    }

    #[test]
    fn a_schema_that_does_not_compile_is_remembered_as_unchecked() {
        let bad = json!({"type": "memo-test-no-such-type"});
        assert!(compiled(&bad).is_none());
        assert!(compiled(&bad).is_none());
    }

    #[test]
    fn the_memo_stays_bounded() {
        for i in 0..MAX_ENTRIES + 10 {
            let s = json!({"type": "object", "properties": {format!("memo-bound-{i}"): {}}});
            assert!(compiled(&s).is_some());
        }
        assert!(MEMO.len() <= MAX_ENTRIES);
    }

    #[test]
    fn a_long_schema_still_validates() {
        let long = "x".repeat(MAX_KEY);
        let s = json!({"type": "object", "properties": {long: {"type": "string"}}});
        let v = compiled(&s).expect("compiles");
        assert!(!v.is_valid(&json!({"x".repeat(MAX_KEY): 1})));
    }
}
