//! The pool's idle sessions: taken by a lease of their key, given back when a lease ends,
//! evicted (least recently used first) to make room, and reaped after `pool.idle_timeout`.
//! Sessions a listen stream relies on are lent first and never evicted or reaped.

use std::sync::Arc;

use tokio::time::Instant;

use super::{PoolKey, SessionPool};
use crate::upstream::session::Session;

impl SessionPool {
    /// Closes idle sessions older than the idle timeout. Returns how many were closed.
    pub(crate) async fn reap_idle(&self) -> usize {
        self.client().close_idle();
        self.extension_sets.forget_expired();
        let cutoff = Instant::now().checked_sub(self.cfg.idle_timeout);
        let mut stale = Vec::new();
        if let Ok(mut idle) = self.idle.lock() {
            for list in idle.values_mut() {
                list.retain(|s| {
                    let last = s
                        .last_used
                        .lock()
                        .map(|t| *t)
                        .unwrap_or_else(|_| Instant::now());
                    let keep =
                        !s.is_dead() && (s.has_listeners() || cutoff.is_none_or(|c| last > c));
                    if !keep {
                        stale.push(Arc::clone(s));
                    }
                    keep
                });
            }
            idle.retain(|_, l| !l.is_empty());
        }
        let n = stale.len();
        for s in stale {
            s.close().await;
        }
        n
    }

    /// Number of idle sessions (for tests and metrics).
    pub(crate) fn idle_count(&self) -> usize {
        self.idle
            .lock()
            .map(|m| m.values().map(Vec::len).sum())
            .unwrap_or(0)
    }

    // Prefers a session a listen stream relies on: a legacy server ties per-session features (e.g.
    // "send updates for the resources this session subscribed to") to the session a call runs on.
    pub(super) fn take_idle(&self, key: &PoolKey) -> Option<Arc<Session>> {
        let mut idle = self.idle.lock().ok()?;
        let list = idle.get_mut(key)?;
        list.retain(|s| !s.is_dead());
        let i = list
            .iter()
            .rposition(|s| s.has_listeners())
            .or_else(|| list.len().checked_sub(1))?;
        Some(list.remove(i))
    }

    pub(super) async fn evict_one_idle(&self) {
        let victim = self.idle.lock().ok().and_then(|mut idle| {
            let key = idle
                .iter()
                .filter_map(|(k, v)| {
                    v.iter().find(|s| !s.has_listeners()).map(|s| {
                        (
                            k.clone(),
                            s.last_used
                                .lock()
                                .map(|t| *t)
                                .unwrap_or_else(|_| Instant::now()),
                        )
                    })
                })
                .min_by_key(|(_, t)| *t)
                .map(|(k, _)| k)?;
            let list = idle.get_mut(&key)?;
            let i = list.iter().position(|s| !s.has_listeners())?;
            let s = Some(list.remove(i));
            if list.is_empty() {
                idle.remove(&key);
            }
            s
        });
        if let Some(s) = victim {
            s.close().await;
        }
    }

    pub(super) fn give_back(&self, key: PoolKey, session: Arc<Session>) {
        if let Ok(mut t) = session.last_used.lock() {
            *t = Instant::now();
        }
        if let Ok(mut idle) = self.idle.lock() {
            idle.entry(key).or_default().push(session);
        }
        self.returned.notify_waiters();
    }
}
