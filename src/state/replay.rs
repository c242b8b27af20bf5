//! Replay when the owner is gone: what a requestState carries so that any replica can run a
//! replay-safe call again and answer, from the token, every server request it already has an
//! answer for.
//!
//! A [`Journal`] holds the answers given so far in this call, each bound to the
//! [`fingerprint`] of the server request it answered, and the fingerprints of the round now
//! asked. It travels inside the token encrypted (AES-256-GCM under a key derived from the
//! signing key, see `keys`), so the client cannot read the user's answers, and signed, so it
//! cannot alter them. A [`Replayer`] matches the server requests of the re-run call against
//! it: an answer goes only to a request with the same fingerprint, in order; anything else is
//! asked anew as an ordinary round.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use dashmap::DashMap;
use ring::aead::{Aad, LessSafeKey, Nonce, NONCE_LEN};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use tokio::time::Instant;

/// What a call was answered so far, and what it asks now.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Journal {
    /// Answers given so far, in the order they were delivered: (fingerprint, answer).
    #[serde(rename = "a", default)]
    pub(crate) answered: Vec<(String, Value)>,
    /// This round's keys and the fingerprint of the request each one asks.
    #[serde(rename = "p", default)]
    pub(crate) pending: Vec<(String, String)>,
}

impl Journal {
    /// The journal as compact JSON, if it is at most `max` bytes.
    pub(crate) fn encode(&self, max: usize) -> Option<Vec<u8>> {
        let bytes = serde_json::to_vec(self).ok()?;
        (bytes.len() <= max).then_some(bytes)
    }
}

/// The fingerprint of a server request: its method and canonical params, with what varies
/// between two runs of the same call left out (`_meta`: progress tokens, related-task ids).
pub(crate) fn fingerprint(method: &str, params: Option<&Value>) -> String {
    let mut h = Sha256::new();
    h.update(method.as_bytes());
    h.update(b"\0");
    // Key-sorted compact JSON (serde_json's map is ordered by key: no `preserve_order`),
    // written straight into the hash: the params are not copied to leave `_meta` out.
    let written = match params {
        Some(Value::Object(p)) => serde_json::to_writer(&mut h, &WithoutMeta(p)),
        // No params and `{}` ask the same.
        None | Some(Value::Null) => serde_json::to_writer(&mut h, &Map::new()),
        Some(other) => serde_json::to_writer(&mut h, other),
    };
    // Writing into a hash cannot fail, and a `Value` always serializes.
    debug_assert!(written.is_ok());
    hex::encode(&h.finalize()[..12])
}

// An object's members but `_meta`, serialized as the object would be.
struct WithoutMeta<'a>(&'a Map<String, Value>);

impl Serialize for WithoutMeta<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().filter(|(k, _)| k.as_str() != "_meta"))
    }
}

/// Encrypts `plain` under `key`, bound to `aad`: base64url of nonce ‖ ciphertext ‖ tag.
pub(crate) fn seal(key: &LessSafeKey, aad: &[u8], plain: &[u8]) -> Option<String> {
    let mut nonce = [0u8; NONCE_LEN];
    getrandom::getrandom(&mut nonce).ok()?;
    let mut buf = plain.to_vec();
    key.seal_in_place_append_tag(
        Nonce::assume_unique_for_key(nonce),
        Aad::from(aad),
        &mut buf,
    )
    .ok()?;
    let mut out = nonce.to_vec();
    out.extend_from_slice(&buf);
    Some(URL_SAFE_NO_PAD.encode(out))
}

/// Decrypts a journal [`seal`] made; `None` when the key, the binding or a single bit differs.
pub(crate) fn open(key: &LessSafeKey, aad: &[u8], sealed: &str) -> Option<Journal> {
    serde_json::from_slice(&open_bytes(key, aad, sealed)?).ok()
}

/// Decrypts what [`seal`] made, as bytes; `None` when the key, the binding or a single bit
/// differs.
pub(crate) fn open_bytes(key: &LessSafeKey, aad: &[u8], sealed: &str) -> Option<Vec<u8>> {
    let bytes = URL_SAFE_NO_PAD.decode(sealed).ok()?;
    if bytes.len() < NONCE_LEN {
        return None;
    }
    let (nonce, rest) = bytes.split_at(NONCE_LEN);
    let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
    let mut buf = rest.to_vec();
    let len = key
        .open_in_place(nonce, Aad::from(aad), &mut buf)
        .ok()?
        .len();
    buf.truncate(len);
    Some(buf)
}

/// Answers the server requests of a re-run call from a journal and the retry that found its
/// owner gone.
#[derive(Debug, Default)]
pub(crate) struct Replayer {
    /// Earlier answers not yet replayed, in order.
    answered: Vec<(String, Value)>,
    /// The retry's answers to the round the token asked, by the fingerprint asked.
    current: Vec<(String, Value)>,
}

impl Replayer {
    /// From the token's journal and the retry's `inputResponses` (answers to keys the token's
    /// round did not ask are ignored).
    pub(crate) fn new(journal: Journal, answers: &Map<String, Value>) -> Self {
        let current = journal
            .pending
            .into_iter()
            .filter_map(|(key, fp)| Some((fp, answers.get(&key)?.clone())))
            .collect();
        Self {
            answered: journal.answered,
            current,
        }
    }

    /// The answer for a request with fingerprint `fp`: the first unused earlier answer with
    /// it, else the retry's answer to the round that asked it. Each answer is used once.
    pub(crate) fn take(&mut self, fp: &str) -> Option<Value> {
        for list in [&mut self.answered, &mut self.current] {
            if let Some(i) = list.iter().position(|(f, _)| f == fp) {
                return Some(list.remove(i).1);
            }
        }
        None
    }
}

/// How long a tool's annotations, read from the upstream's `tools/list`, are trusted.
const HINTS_TTL: std::time::Duration = std::time::Duration::from_secs(60);

/// What the upstream's `tools/list` says of each tool, as last read.
#[derive(Debug, Default)]
pub(crate) struct ToolHints {
    /// Tool name → what it says.
    pub(crate) tools: DashMap<String, ToolHint>,
    /// When they were read.
    pub(crate) read: std::sync::Mutex<Option<Instant>>,
}

/// What the upstream's `tools/list` says of one tool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ToolHint {
    /// Replay-safe by its annotations (`readOnlyHint` or `idempotentHint` true).
    pub(crate) replay_safe: bool,
    /// Runs only as a 2025-11-25 task (`execution.taskSupport: "required"`).
    pub(crate) task_required: bool,
}

impl ToolHints {
    /// Whether they were read less than [`HINTS_TTL`] before `now`.
    pub(crate) fn fresh(&self, now: Instant) -> bool {
        self.read
            .lock()
            .ok()
            .and_then(|t| *t)
            .is_some_and(|t| now.duration_since(t) < HINTS_TTL)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::aead::{UnboundKey, AES_256_GCM};
    use serde_json::json;

    fn key(byte: u8) -> LessSafeKey {
        LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &[byte; 32]).unwrap())
    }

    fn journal() -> Journal {
        Journal {
            answered: vec![(
                "f1".into(),
                json!({"action":"accept","content":{"n":"Ada"}}),
            )],
            pending: vec![("elicitation-2".into(), "f2".into())],
        }
    }

    #[test]
    fn a_sealed_journal_opens_only_with_its_key_and_binding() {
        let sealed = seal(&key(1), b"h.j", &serde_json::to_vec(&journal()).unwrap()).unwrap();
        assert!(!sealed.contains("Ada"), "the answers are not readable");
        assert_eq!(open(&key(1), b"h.j", &sealed), Some(journal()));
        assert_eq!(open(&key(2), b"h.j", &sealed), None, "another key");
        assert_eq!(open(&key(1), b"h.k", &sealed), None, "another token");
        let mut bytes = URL_SAFE_NO_PAD.decode(&sealed).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        assert_eq!(open(&key(1), b"h.j", &URL_SAFE_NO_PAD.encode(bytes)), None);
        assert_eq!(open(&key(1), b"h.j", "short"), None);
    }

    #[test]
    fn fingerprints_ignore_meta_and_key_order_but_not_content() {
        let a = json!({"message":"Name?","requestedSchema":{"type":"object"},"_meta":{"progressToken":1}});
        let b = json!({"requestedSchema":{"type":"object"},"message":"Name?","_meta":{"progressToken":2}});
        let c = json!({"message":"Age?","requestedSchema":{"type":"object"}});
        let f = |p: &Value| fingerprint("elicitation/create", Some(p));
        assert_eq!(f(&a), f(&b));
        assert_ne!(f(&a), f(&c));
        assert_ne!(f(&a), fingerprint("sampling/createMessage", Some(&a)));
        assert_eq!(
            fingerprint("roots/list", None),
            fingerprint("roots/list", Some(&json!({})))
        );
    }

    #[test]
    fn a_fingerprint_is_the_digest_of_method_and_compact_key_sorted_params() {
        // Pinned: tokens carry fingerprints from one instance (and version) to another.
        let p = json!({"requestedSchema":{"type":"object"},"_meta":{"x":1},"message":"hi"});
        assert_eq!(
            fingerprint("elicitation/create", Some(&p)),
            "72592be109d111436000d514"
        );
    }

    #[test]
    fn answers_replay_once_each_in_order_and_a_changed_request_gets_none() {
        let mut j = journal();
        j.answered.push(("f1".into(), json!("second")));
        let answers = json!({"elicitation-2": "now", "other": "ignored"});
        let mut r = Replayer::new(j, answers.as_object().unwrap());
        assert_eq!(r.take("changed"), None);
        assert_eq!(r.take("f1").unwrap()["content"]["n"], "Ada");
        assert_eq!(
            r.take("f1"),
            Some(json!("second")),
            "same request again: the next answer"
        );
        assert_eq!(r.take("f1"), None);
        assert_eq!(r.take("f2"), Some(json!("now")));
        assert_eq!(r.take("f2"), None);
    }

    #[test]
    fn a_journal_over_its_bound_is_not_encoded() {
        let j = journal();
        let len = j.encode(usize::MAX).unwrap().len();
        assert!(j.encode(len).is_some());
        assert!(j.encode(len - 1).is_none());
    }
}
