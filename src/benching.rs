//! What the benchmarks (`benches/`) measure below the HTTP surface: a requestState signed and
//! verified as the proxy does on every round.
//!
//! Not part of the supported API; public only so that the benchmarks can reach it.

use std::time::{Duration, SystemTime};

use crate::config::Secret;
use crate::state::keys::{self, KeySet};
use crate::state::TokenCodec;

/// A token codec with an HS256 key, and the bindings a round's token carries.
#[derive(Debug)]
pub struct TokenBench {
    codec: TokenCodec,
    principal: String,
    request: String,
}

impl Default for TokenBench {
    fn default() -> Self {
        Self::new()
    }
}

impl TokenBench {
    /// A codec as a default-configured proxy has it (HS256, a 5 minute TTL).
    pub fn new() -> Self {
        let key = Secret::new("benchmark-key-benchmark-key-benchmark!".into());
        Self {
            codec: TokenCodec::new(
                KeySet::new(keys::hs256(&key), Vec::new()),
                "bench".into(),
                Duration::from_secs(300),
            ),
            principal: crate::state::principal_digest(Some(b"Bearer bench")),
            request: crate::state::request_digest(
                "tools/call",
                "ask_name",
                &serde_json::json!({"text": "x"}),
            ),
        }
    }

    /// Mints and signs the token of a round (what `park` does), then verifies it (what a retry
    /// does); returns the token's length.
    ///
    /// # Panics
    /// If the token does not verify, which would be a bug.
    pub fn sign_and_verify(&self) -> usize {
        let now = SystemTime::now();
        let claims = self.codec.claims(
            "handle-0123456789abcdef",
            &self.principal,
            &self.request,
            1,
            now,
        );
        let Ok(token) = self.codec.sign(&claims) else {
            panic!("signing failed");
        };
        if self
            .codec
            .verify(&token, &self.principal, &self.request, now)
            .is_err()
        {
            panic!("a fresh token did not verify");
        }
        token.len()
    }
}
