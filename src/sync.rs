//! The one way this crate takes a `std::sync::Mutex`.
//!
//! A lock is poisoned only when a thread panicked while holding it. Every mutex here guards data
//! that each critical section leaves whole (no section breaks an invariant half way and then
//! calls out), so a poisoned lock is taken as it is: refusing it would turn one panic into a
//! call that fails (or hangs until its TTL) on every later use, which is worse than the panic.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, taking a poisoned lock as it is (see the module doc).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
