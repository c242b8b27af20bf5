//! A count of held things — parked calls, tasks — against three bounds: in all, per principal,
//! and the memory charged to them. Admission is all or nothing: a refused one counts nowhere.

use std::sync::atomic::{AtomicUsize, Ordering};

use dashmap::DashMap;

use crate::config::HeldBounds;
use crate::error::ProxyError;

/// Held things, counted against their bounds.
#[derive(Debug)]
pub(crate) struct Quota {
    bounds: HeldBounds,
    /// What is held, for the refusals ("parked calls", "tasks").
    what: &'static str,
    total: AtomicUsize,
    held_bytes: AtomicUsize,
    per_principal: DashMap<String, usize>,
}

impl Quota {
    /// Nothing held yet of `what`, bounded by `bounds`.
    pub(crate) fn new(bounds: HeldBounds, what: &'static str) -> Self {
        Self {
            bounds,
            what,
            total: AtomicUsize::new(0),
            held_bytes: AtomicUsize::new(0),
            per_principal: DashMap::new(),
        }
    }

    /// Held now.
    pub(crate) fn len(&self) -> usize {
        self.total.load(Ordering::Relaxed)
    }

    /// Bytes charged now.
    pub(crate) fn held_bytes(&self) -> usize {
        self.held_bytes.load(Ordering::Relaxed)
    }

    /// Whether `principal` holds anything (its count is dropped at zero).
    #[cfg(test)]
    pub(crate) fn holds(&self, principal: &str) -> bool {
        self.per_principal.contains_key(principal)
    }

    /// One more for `principal`, charged `bytes`.
    ///
    /// # Errors
    /// [`ProxyError::Overloaded`] past the memory, total or per-principal bound (nothing counted).
    pub(crate) fn admit(&self, principal: &str, bytes: usize) -> Result<(), ProxyError> {
        let what = self.what;
        let over = |why: String| Err(ProxyError::Overloaded(format!("{why}; retry later")));
        if self.held_bytes.fetch_add(bytes, Ordering::AcqRel) + bytes > self.bounds.bytes {
            self.held_bytes.fetch_sub(bytes, Ordering::AcqRel);
            return over(format!("{what} hold too much memory"));
        }
        if self.total.fetch_add(1, Ordering::AcqRel) >= self.bounds.total {
            self.total.fetch_sub(1, Ordering::AcqRel);
            self.held_bytes.fetch_sub(bytes, Ordering::AcqRel);
            return over(format!("too many {what}"));
        }
        let mut n = self.per_principal.entry(principal.to_owned()).or_insert(0);
        if *n >= self.bounds.per_principal {
            drop(n);
            self.total.fetch_sub(1, Ordering::AcqRel);
            self.held_bytes.fetch_sub(bytes, Ordering::AcqRel);
            return over(format!("too many {what} for this principal"));
        }
        *n += 1;
        Ok(())
    }

    /// Charges `bytes` more to something already held (a task's result).
    pub(crate) fn charge(&self, bytes: usize) {
        self.held_bytes.fetch_add(bytes, Ordering::AcqRel);
    }

    /// `bytes` of what one still held was charged are no longer held (it stays counted).
    pub(crate) fn uncharge(&self, bytes: usize) {
        self.held_bytes.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// One held by `principal` and charged `bytes` is gone.
    pub(crate) fn release(&self, principal: &str, bytes: usize) {
        self.total.fetch_sub(1, Ordering::AcqRel);
        self.held_bytes.fetch_sub(bytes, Ordering::AcqRel);
        if let Some(mut n) = self.per_principal.get_mut(principal) {
            *n = n.saturating_sub(1);
        }
        self.per_principal.remove_if(principal, |_, n| *n == 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_bound_refuses_without_counting_and_release_gives_back() {
        let q = Quota::new(
            HeldBounds {
                total: 2,
                per_principal: 1,
                bytes: 100,
            },
            "things",
        );
        q.admit("a", 40).unwrap();
        let e = q.admit("a", 10).unwrap_err().to_string();
        assert!(e.contains("too many things for this principal"), "{e}");
        let e = q.admit("b", 61).unwrap_err().to_string();
        assert!(e.contains("things hold too much memory"), "{e}");
        q.admit("b", 60).unwrap();
        let e = q.admit("c", 0).unwrap_err().to_string();
        assert!(e.contains("too many things;"), "{e}");
        assert_eq!((q.len(), q.held_bytes()), (2, 100));
        q.release("a", 40);
        assert!(!q.holds("a") && q.holds("b"));
        assert_eq!((q.len(), q.held_bytes()), (1, 60));
    }
}
