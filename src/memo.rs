//! What was read or compiled from a text, remembered by that text: a client's declared
//! capabilities and an upstream's `requestedSchema` come again and again. Bounded two ways: past
//! `max_entries` it starts over, and a text longer than `max_key` bytes is read each time, never
//! kept. Not an LRU and no expiry (a read is a pure function of its text); two threads missing
//! the same text at once both read it.

use std::convert::Infallible;
use std::sync::OnceLock;

use dashmap::DashMap;

/// Results of a pure read, by the text they were read from.
pub(crate) struct TextMemo<V> {
    map: OnceLock<DashMap<Box<str>, V>>,
    max_entries: usize,
    max_key: usize,
}

impl<V: Clone> TextMemo<V> {
    /// An empty memo (usable in a `static`).
    pub(crate) const fn new(max_entries: usize, max_key: usize) -> Self {
        Self {
            map: OnceLock::new(),
            max_entries,
            max_key,
        }
    }

    /// What `read` gives for `text`: remembered, or read now (and kept when `text` is short
    /// enough).
    ///
    /// # Errors
    /// What `read` returns when it fails; a failed read is not kept.
    pub(crate) fn get_or_try<E>(
        &self,
        text: &str,
        read: impl FnOnce() -> Result<V, E>,
    ) -> Result<V, E> {
        if text.len() > self.max_key {
            return read();
        }
        let map = self.map.get_or_init(DashMap::new);
        if let Some(hit) = map.get(text) {
            return Ok(hit.clone());
        }
        let value = read()?;
        if map.len() >= self.max_entries {
            map.clear();
        }
        map.insert(text.into(), value.clone());
        Ok(value)
    }

    /// What `read` gives for `text`, as [`Self::get_or_try`] for a read that cannot fail.
    pub(crate) fn get_or(&self, text: &str, read: impl FnOnce() -> V) -> V {
        let Ok(value) = self.get_or_try::<Infallible>(text, || Ok(read()));
        value
    }

    /// Whether `text` is remembered.
    #[cfg(test)]
    pub(crate) fn holds(&self, text: &str) -> bool {
        self.map.get().is_some_and(|m| m.contains_key(text))
    }

    /// How many texts are remembered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.get().map_or(0, DashMap::len)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    #[test]
    fn a_text_is_read_once_then_found() {
        let memo = TextMemo::new(4, 16);
        let reads = Cell::new(0);
        let read = || {
            reads.set(reads.get() + 1);
            7
        };
        assert_eq!(memo.get_or("a", read), 7);
        assert_eq!(memo.get_or("a", read), 7);
        assert_eq!(reads.get(), 1);
        assert!(memo.holds("a"));
    }

    #[test]
    fn a_failed_read_is_not_kept() {
        let memo = TextMemo::<u8>::new(4, 16);
        assert_eq!(memo.get_or_try("bad", || Err("no")), Err("no"));
        assert!(!memo.holds("bad"));
        assert_eq!(memo.get_or_try::<&str>("bad", || Ok(1)), Ok(1));
    }

    #[test]
    fn a_long_text_is_read_each_time_and_never_kept() {
        let memo = TextMemo::new(4, 3);
        let reads = Cell::new(0);
        for _ in 0..2 {
            memo.get_or("long", || reads.set(reads.get() + 1));
        }
        assert_eq!(reads.get(), 2);
        assert_eq!(memo.len(), 0);
    }

    #[test]
    fn past_its_bound_it_starts_over() {
        let memo = TextMemo::new(4, 16);
        for i in 0..10 {
            memo.get_or(&i.to_string(), || i);
            assert!(memo.len() <= 4);
        }
        assert!(memo.holds("9"));
        assert!(!memo.holds("0"));
    }
}
