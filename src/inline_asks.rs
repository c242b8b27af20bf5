//! What the proxy knows of the legacy clients' sessions it relays: whether each declared
//! elicitation at `initialize` (so the proxy itself may ask on it), and the requests the proxy
//! asked inline on a session, awaiting the client's answer. Bounded: a session past the bound is
//! not recorded (the proxy then never asks on it), and an entry idle past its time is swept.

use std::time::Duration;

use dashmap::DashMap;
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// Sessions recorded at most.
pub(crate) const MAX_SESSIONS: usize = 65_536;

/// Where the proxy may ask relayed legacy sessions, and its own requests pending on them.
#[derive(Debug)]
pub(crate) struct InlineAsks {
    /// Session id → (declared form elicitation, last seen).
    declared: DashMap<String, (bool, Instant)>,
    /// (session id, request id) → who waits for the client's answer.
    waiting: DashMap<(String, String), oneshot::Sender<Value>>,
    idle: Duration,
}

impl InlineAsks {
    /// An empty record whose sessions are forgotten after `idle` without a request.
    pub(crate) fn new(idle: Duration) -> Self {
        Self {
            declared: DashMap::new(),
            waiting: DashMap::new(),
            idle,
        }
    }

    /// Records session `id` and whether its `initialize` declared form elicitation.
    pub(crate) fn record(&self, id: &str, elicitation: bool) {
        if self.declared.len() < MAX_SESSIONS || self.declared.contains_key(id) {
            self.declared
                .insert(id.to_owned(), (elicitation, Instant::now()));
        }
    }

    /// Notes that session `id` is in use (a session is forgotten only when idle).
    pub(crate) fn seen(&self, id: &str) {
        if let Some(mut entry) = self.declared.get_mut(id) {
            entry.1 = Instant::now();
        }
    }

    /// Whether session `id` declared form elicitation (`false` when not recorded).
    pub(crate) fn can_elicit(&self, id: &str) -> bool {
        match self.declared.get_mut(id) {
            Some(mut entry) => {
                entry.1 = Instant::now();
                entry.0
            }
            None => false,
        }
    }

    /// Forgets session `id` (it was deleted); its pending requests are dropped.
    pub(crate) fn forget(&self, id: &str) {
        self.declared.remove(id);
        self.waiting.retain(|(session, _), _| session != id);
    }

    /// Awaits the client's answer to request `request` asked on session `session`.
    pub(crate) fn expect(&self, session: &str, request: &str) -> oneshot::Receiver<Value> {
        let (tx, rx) = oneshot::channel();
        self.waiting
            .insert((session.to_owned(), request.to_owned()), tx);
        rx
    }

    /// Stops awaiting `request` on `session` (answered elsewhere, or given up).
    pub(crate) fn abandon(&self, session: &str, request: &str) {
        self.waiting
            .remove(&(session.to_owned(), request.to_owned()));
    }

    /// Hands the client's answer `message` (a JSON-RPC response) to the request it answers on
    /// `session`; `false` when no such request of the proxy's is pending (relay it then).
    pub(crate) fn answer(&self, session: &str, request: &str, message: Value) -> bool {
        match self
            .waiting
            .remove(&(session.to_owned(), request.to_owned()))
        {
            Some((_, tx)) => {
                let _ = tx.send(message);
                true
            }
            None => false,
        }
    }

    /// Drops sessions idle past their time, and waiters nobody awaits any more.
    pub(crate) fn sweep(&self) {
        let now = Instant::now();
        self.declared
            .retain(|_, (_, seen)| now.duration_since(*seen) < self.idle);
        self.waiting.retain(|_, tx| !tx.is_closed());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_session_is_known_until_forgotten_or_idle() {
        let s = InlineAsks::new(Duration::from_secs(60));
        s.record("a", true);
        s.record("b", false);
        assert!(s.can_elicit("a"));
        assert!(!s.can_elicit("b"));
        assert!(!s.can_elicit("c"), "unknown sessions are not asked");
        s.forget("a");
        assert!(!s.can_elicit("a"));
        s.record("d", true);
        s.record("e", true);
        tokio::time::advance(Duration::from_secs(40)).await;
        s.seen("e");
        tokio::time::advance(Duration::from_secs(21)).await;
        s.sweep();
        assert!(!s.can_elicit("d"), "idle past its time");
        assert!(s.can_elicit("e"), "in use 21 s ago");
    }

    #[tokio::test]
    async fn an_answer_reaches_the_request_it_answers_on_its_session_only() {
        let s = InlineAsks::new(Duration::from_secs(60));
        let rx = s.expect("a", "\"r1\"");
        assert!(!s.answer("b", "\"r1\"", Value::Null), "another session");
        assert!(!s.answer("a", "\"r2\"", Value::Null), "another request");
        assert!(s.answer("a", "\"r1\"", Value::from(1)));
        assert_eq!(rx.await.unwrap(), Value::from(1));
        assert!(!s.answer("a", "\"r1\"", Value::Null), "taken once");
    }
}
