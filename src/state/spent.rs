//! Tokens spent on this instance, each at most once: a lost call's token replayed here, an
//! approval taken. What a token allows is its claims'; whether it was already used is this.
//! The ledger is the process's memory: a restart starts it empty, so an approval is taken only
//! from a token this process signed (`TokenCodec::signed_since_start`), and a replay is at most
//! once per process.

use std::time::Duration;

use dashmap::DashMap;
use tokio::time::Instant;

/// Tokens spent on this instance: each is taken at most once here, however often its retry
/// arrives. An entry lives one `state.ttl` (no token outlives that), and the periodic sweep
/// drops it after.
#[derive(Debug)]
pub(crate) struct SpentTokens {
    /// Token id (`jti`) → when its entry may go.
    spent: DashMap<String, Instant>,
    ttl: Duration,
}

impl SpentTokens {
    /// An empty ledger whose entries live `ttl`.
    pub(crate) fn new(ttl: Duration) -> Self {
        Self {
            spent: DashMap::new(),
            ttl,
        }
    }

    /// Records that the token `jti` is spent now; `false` when it already was.
    pub(crate) fn first(&self, jti: &str) -> bool {
        match self.spent.entry(jti.to_owned()) {
            dashmap::Entry::Occupied(_) => false,
            dashmap::Entry::Vacant(v) => {
                v.insert(Instant::now() + self.ttl);
                true
            }
        }
    }

    /// Drops the entries past their time.
    pub(crate) fn sweep(&self) {
        let now = Instant::now();
        self.spent.retain(|_, until| *until > now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_token_is_spent_once_until_its_entry_expires() {
        let ledger = SpentTokens::new(Duration::from_secs(60));
        assert!(ledger.first("j1"));
        assert!(!ledger.first("j1"), "the second use of one token");
        assert!(ledger.first("j2"), "another token");
        tokio::time::advance(Duration::from_secs(61)).await;
        ledger.sweep();
        assert!(ledger.spent.is_empty(), "swept after the ttl");
    }
}
