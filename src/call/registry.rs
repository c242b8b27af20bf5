//! The registry of parked calls: unguessable handle → the call actor's retry channel, plus what
//! a retry must match (principal, request digest, the current round's single-use `jti`).
//!
//! Entries are removed by an RAII guard held by the actor; a removed handle leaves a tombstone for
//! one TTL so that a late retry learns *why* its call is gone. Counts are bounded in total and per
//! principal. No map reference is ever held across an `.await`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use futures_channel::mpsc::{UnboundedReceiver, UnboundedSender};
use serde_json::{Map, Value};

use super::leg::Leg;
use crate::config::HeldBounds;
use crate::error::ProxyError;
use crate::input::{self, Asked};
use crate::limits::Quota;
use crate::state::{Claims, TokenError};
use crate::sync::lock;
use crate::upstream::Credentials;

/// A retry delivered to a parked call.
#[derive(Debug)]
pub(crate) struct Retry {
    /// The retry's `inputResponses` (only keys the call asked for were validated).
    pub(crate) answers: Map<String, Value>,
    /// Where to send what comes next.
    pub(crate) leg: Leg,
    /// What goes upstream for the principal from now on: the retry's own credentials.
    pub(crate) credentials: Credentials,
    /// The client span of the answers' delivery upstream (ends once they are delivered).
    pub(crate) span: tracing::Span,
    /// When the resumed call becomes a task, as the retry itself allows (a task is only ever
    /// returned to a request that declares the extension).
    pub(crate) task_after: Option<std::time::Duration>,
}

/// Where a parked call's retries go (one at a time: a retry's token is claimed before it is
/// sent, and the next token is minted only once the call took this one). The channel makes a
/// node per retry as it comes; a tokio channel's first block and its padded state, allocated as
/// the call parks, were 0.8 KiB of every parked call (docs/BENCHMARKS.md § Issue 35).
#[derive(Debug, Clone)]
pub(crate) struct RetrySender(UnboundedSender<Box<Retry>>);

impl RetrySender {
    /// A parked call's retry channel.
    pub(crate) fn channel() -> (Self, UnboundedReceiver<Box<Retry>>) {
        let (tx, rx) = futures_channel::mpsc::unbounded();
        (Self(tx), rx)
    }

    /// Hands `retry` to the call.
    ///
    /// # Errors
    /// The call ended (its receiver is gone or closed).
    pub(crate) fn send(&self, retry: Retry) -> Result<(), Box<Retry>> {
        self.0
            .unbounded_send(Box::new(retry))
            .map_err(futures_channel::mpsc::TrySendError::into_inner)
    }
}

/// What one parked call is charged besides its params: its actor, its upstream streams and
/// their connection buffers, its session, the registry entry — as measured (`cargo bench
/// --bench sidecar`, capacity), so that `state.max_parked_memory` bounds real memory.
pub(crate) const PARKED_CALL_OVERHEAD: usize = crate::config::PARKED_CALL_BYTES;

/// The registry.
#[derive(Debug)]
pub(crate) struct ParkedCalls {
    map: DashMap<String, Slot, foldhash::fast::RandomState>,
    quota: Quota,
    tombstone_ttl: Duration,
}

#[derive(Debug)]
enum Slot {
    Live(Arc<Parked>),
    Gone { reason: String, until: Instant },
}

/// One parked call as the front sees it.
#[derive(Debug)]
pub(crate) struct Parked {
    principal: String,
    request: String,
    /// Bytes charged against the total bound.
    bytes: usize,
    tx: RetrySender,
    round: Mutex<Round>,
}

/// The round a retry may claim: its single-use `jti`, and what it asks (shared with the call's
/// round, not copied).
#[derive(Debug)]
struct Round {
    jti: Option<String>,
    pending: Arc<[Asked]>,
}

/// Held by the call actor; retiring the entry when dropped, if the actor did not first.
#[derive(Debug)]
pub(crate) struct ParkGuard {
    calls: Arc<ParkedCalls>,
    handle: String,
    entry: Arc<Parked>,
    /// Why the entry was retired; `None` while it is live.
    retired: Option<String>,
}

impl ParkedCalls {
    /// An empty registry with the given bounds.
    pub(crate) fn new(limits: HeldBounds, tombstone_ttl: Duration) -> Arc<Self> {
        Arc::new(Self {
            map: DashMap::default(),
            quota: Quota::new(limits, "parked calls"),
            tombstone_ttl,
        })
    }

    /// Bytes charged to parked calls right now.
    pub(crate) fn held_bytes(&self) -> usize {
        self.quota.held_bytes()
    }

    /// Parked calls right now.
    pub(crate) fn len(&self) -> usize {
        self.quota.len()
    }

    /// Registers a parked call under `handle`, charging it `held` bytes (what it keeps: its
    /// params) plus [`PARKED_CALL_OVERHEAD`].
    ///
    /// # Errors
    /// [`ProxyError::Overloaded`] past the total, per-principal or memory bound.
    pub(crate) fn register(
        self: &Arc<Self>,
        handle: String,
        (principal, request): (&str, &str),
        held: usize,
        tx: RetrySender,
    ) -> Result<ParkGuard, ProxyError> {
        let bytes = held.saturating_add(PARKED_CALL_OVERHEAD);
        self.quota.admit(principal, bytes)?;
        let entry = Arc::new(Parked {
            principal: principal.to_owned(),
            request: request.to_owned(),
            bytes,
            tx,
            round: Mutex::new(Round {
                jti: None,
                pending: Arc::new([]),
            }),
        });
        self.map
            .insert(handle.clone(), Slot::Live(Arc::clone(&entry)));
        Ok(ParkGuard {
            calls: Arc::clone(self),
            handle,
            entry,
            retired: None,
        })
    }

    /// Claims the round named by verified `claims`: checks the handle is live, the `jti` is the
    /// current one, and the answers to this round's keys have the right shape; then consumes the
    /// `jti` (single use) and returns the sender to the actor.
    ///
    /// # Errors
    /// [`TokenError`]s for gone or used state; [`ProxyError::BadRetry`] for bad answers (the
    /// token is then *not* consumed and the call stays parked).
    pub(crate) fn claim(
        &self,
        claims: &Claims,
        answers: &Map<String, Value>,
    ) -> Result<RetrySender, ProxyError> {
        let entry = match self.map.get(&claims.handle).as_deref() {
            Some(Slot::Live(e)) => Arc::clone(e),
            Some(Slot::Gone { reason, .. }) => return Err(TokenError::Gone(reason.clone()).into()),
            // Signed by this instance's key for this instance, yet never parked here: an earlier
            // process under the same id held it (a restart with a fixed `state.instance_id`).
            None => return Err(ProxyError::CallLost("this instance no longer has it")),
        };
        if entry.principal != claims.principal || entry.request != claims.request {
            return Err(TokenError::Invalid.into());
        }
        let mut round = lock(&entry.round);
        if round.jti.as_deref() != Some(claims.token_id.as_str()) {
            return Err(TokenError::AlreadyUsed.into());
        }
        input::answered(round.pending.iter(), answers).map_err(ProxyError::BadRetry)?;
        round.jti = None;
        Ok(entry.tx.clone())
    }

    /// Drops tombstones older than their TTL.
    pub(crate) fn sweep(&self) {
        let now = Instant::now();
        self.map.retain(|_, slot| match slot {
            Slot::Live(_) => true,
            Slot::Gone { until, .. } => *until > now,
        });
    }
}

impl ParkGuard {
    /// Publishes a new round: its single-use `jti` and the keys (with kinds) it asks for.
    pub(crate) fn open_round(&self, jti: &str, pending: Arc<[Asked]>) {
        let mut r = lock(&self.entry.round);
        r.jti = Some(jti.to_owned());
        r.pending = pending;
    }

    /// Invalidates the current round's token (the call is running again or ending).
    pub(crate) fn close_round(&self) {
        lock(&self.entry.round).jti = None;
    }

    /// The handle.
    pub(crate) fn handle(&self) -> &str {
        &self.handle
    }

    /// Removes the entry now, leaving a tombstone that tells a late retry `reason`; from here on
    /// no retry can claim the call. Only the first call counts.
    pub(crate) fn retire(&mut self, reason: impl Into<String>) {
        if self.retired.is_some() {
            return;
        }
        let reason = reason.into();
        let until = Instant::now() + self.calls.tombstone_ttl;
        self.calls.map.insert(
            self.handle.clone(),
            Slot::Gone {
                reason: reason.clone(),
                until,
            },
        );
        self.retired = Some(reason);
        self.calls
            .quota
            .release(&self.entry.principal, self.entry.bytes);
    }

    /// Why the entry was retired, once it was.
    pub(crate) fn retired_because(&self) -> Option<&str> {
        self.retired.as_deref()
    }
}

impl Drop for ParkGuard {
    fn drop(&mut self) {
        self.retire("the call ended");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(h: &str, jti: &str) -> Claims {
        Claims {
            handle: h.into(),
            issuer: "i".into(),
            boot: None,
            principal: "p".into(),
            request: "r".into(),
            round: 1,
            issued_at: 0,
            expires_at: u64::MAX,
            token_id: jti.into(),
            sealed: None,
            replay: None,
            approval: None,
            origin: None,
        }
    }

    #[test]
    fn a_claim_is_single_use_and_checks_principal_and_request() {
        let calls = ParkedCalls::new(limits(10), Duration::from_secs(60));
        let (tx, _rx) = RetrySender::channel();
        let guard = calls.register("h".into(), ("p", "r"), 0, tx).unwrap();
        let asked = Asked {
            key: "elicitation-1".into(),
            kind: crate::input::InputKind::Elicitation,
            schema: None,
        };
        guard.open_round("j1", Arc::new([asked]));
        let none = Map::new();
        let mut other = claims("h", "j1");
        other.principal = "q".into();
        assert!(calls.claim(&other, &none).is_err());
        assert!(calls.claim(&claims("h", "j0"), &none).is_err(), "stale jti");
        assert!(calls.claim(&claims("h", "j1"), &none).is_ok());
        assert!(matches!(
            calls.claim(&claims("h", "j1"), &none),
            Err(ProxyError::State(TokenError::AlreadyUsed))
        ));
    }

    #[test]
    fn a_round_whose_lock_was_poisoned_still_opens_and_is_claimed() {
        let calls = ParkedCalls::new(limits(10), Duration::from_secs(60));
        let (tx, _rx) = RetrySender::channel();
        let guard = calls.register("h".into(), ("p", "r"), 0, tx).unwrap();
        let entry = Arc::clone(&guard.entry);
        let poisoned = std::thread::spawn(move || {
            let _held = entry.round.lock().unwrap();
            panic!("a panic while the round is locked");
        })
        .join();
        assert!(poisoned.is_err() && guard.entry.round.is_poisoned());
        guard.open_round("j1", Arc::new([]));
        assert!(
            calls.claim(&claims("h", "j1"), &Map::new()).is_ok(),
            "the round opened and its retry is taken, not refused until the TTL"
        );
    }

    #[test]
    fn retiring_closes_the_entry_at_once_and_counts_it_once() {
        let calls = ParkedCalls::new(limits(10), Duration::from_secs(60));
        let (tx, _rx) = RetrySender::channel();
        let mut guard = calls.register("h".into(), ("p", "r"), 100, tx).unwrap();
        assert_eq!(calls.held_bytes(), 100 + PARKED_CALL_OVERHEAD);
        guard.open_round("j1", Arc::new([]));
        assert_eq!(calls.len(), 1);
        guard.retire("the call expired");
        guard.retire("a second reason is ignored");
        assert_eq!(calls.len(), 0);
        match calls.claim(&claims("h", "j1"), &Map::new()) {
            Err(ProxyError::State(TokenError::Gone(why))) => assert_eq!(why, "the call expired"),
            other => panic!("{other:?}"),
        }
        drop(guard);
        assert_eq!(
            calls.len(),
            0,
            "dropping a retired guard does not count it again"
        );
        assert!(!calls.quota.holds("p"));
        assert_eq!(calls.held_bytes(), 0);
    }

    fn limits(n: usize) -> HeldBounds {
        HeldBounds {
            total: n,
            per_principal: n,
            bytes: usize::MAX,
        }
    }

    #[test]
    fn the_memory_bound_refuses_a_call_and_counts_nothing_for_it() {
        let bound = HeldBounds {
            bytes: 3 * PARKED_CALL_OVERHEAD,
            ..limits(10)
        };
        let calls = ParkedCalls::new(bound, Duration::from_secs(60));
        let (tx, _rx) = RetrySender::channel();
        let big = calls
            .register("a".into(), ("p", "r"), PARKED_CALL_OVERHEAD, tx.clone())
            .unwrap();
        let refused = calls.register("b".into(), ("p", "r"), PARKED_CALL_OVERHEAD, tx.clone());
        assert!(matches!(refused, Err(ProxyError::Overloaded(m)) if m.contains("memory")));
        assert_eq!(
            (calls.len(), calls.held_bytes()),
            (1, 2 * PARKED_CALL_OVERHEAD)
        );
        let small = calls.register("c".into(), ("p", "r"), 0, tx).unwrap();
        drop((big, small));
        assert_eq!((calls.len(), calls.held_bytes()), (0, 0));
    }
}
