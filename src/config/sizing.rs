//! Bounds sized from memory and open files rather than counts: `state.max_parked`, when the file
//! does not set it, is what `state.max_parked_memory` pays for at [`PARKED_CALL_BYTES`] each,
//! and `pool.max_sessions`, when not set, is room for every parked call plus a running request
//! on every client connection. At start, once the open-file limit is raised, [`fit`] lowers a
//! sized `max_parked` to what the descriptors can hold. A replica given memory (and files) so
//! holds that many waiting calls without hand-tuning; a bound the file sets is kept as it is.

use super::pool::Pool;
use super::state::HeldBounds;

/// What one parked call costs the proxy, measured (`cargo bench --bench sidecar`, capacity:
/// 63 KiB with a fast upstream; docs/BENCHMARKS.md), and what it is charged against
/// `state.max_parked_memory` besides its params.
pub const PARKED_CALL_BYTES: usize = 64 * 1024;
/// Descriptors kept for all but calls: listeners, the admin port, files, stdio pipes.
const RESERVED_DESCRIPTORS: u64 = 256;
/// Descriptors a client connection may hold while its request runs: its own, the upstream
/// call's stream and its session's GET stream.
const DESCRIPTORS_PER_CONNECTION: u64 = 3;
/// Descriptors a parked call holds: its upstream call's stream and its session's GET stream.
const DESCRIPTORS_PER_PARKED_CALL: u64 = 2;

/// Which bounds follow from the others (the file does not set them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sized {
    /// `state.max_parked`
    pub max_parked: bool,
    /// `pool.max_sessions`
    pub max_sessions: bool,
}

/// The bounds sizing moves: the parked calls', the pool's, and what they follow from.
pub(super) struct Bounds<'a> {
    pub(super) parked: &'a mut HeldBounds,
    pub(super) pool: &'a mut Pool,
    pub(super) max_connections: usize,
    pub(super) sized: Sized,
}

/// Fills in the bounds the file left to memory: `state.max_parked` from
/// `state.max_parked_memory`, `pool.max_sessions` from it and `server.max_connections`.
pub(super) fn from_memory(b: Bounds<'_>) {
    if b.sized.max_parked {
        b.parked.total = (b.parked.bytes / PARKED_CALL_BYTES).max(1);
    }
    sessions_follow(b);
}

/// Lowers a sized `state.max_parked` to what `descriptors` open files hold once every client
/// connection has its share (and `pool.max_sessions` with it, when sized too). Returns the
/// parked calls the descriptors hold, for the start-up log.
pub(super) fn fit(b: Bounds<'_>, descriptors: u64) -> u64 {
    let connections = b.max_connections as u64;
    let room = descriptors
        .saturating_sub(RESERVED_DESCRIPTORS)
        .saturating_sub(connections.saturating_mul(DESCRIPTORS_PER_CONNECTION))
        / DESCRIPTORS_PER_PARKED_CALL;
    if b.sized.max_parked {
        let held = usize::try_from(room).unwrap_or(usize::MAX).max(1);
        b.parked.total = b.parked.total.min(held);
    }
    sessions_follow(b);
    room
}

fn sessions_follow(b: Bounds<'_>) {
    if b.sized.max_sessions {
        b.pool.max_sessions = b.parked.total.saturating_add(b.max_connections);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn config(text: &str) -> Config {
        Config::from_toml_str(text).unwrap()
    }

    fn fit(c: &mut Config, descriptors: u64) -> u64 {
        c.fit_descriptors(descriptors)
    }

    #[test]
    fn unset_bounds_follow_memory() {
        let c = config("");
        assert_eq!(c.state.parked.total, 256 * 1024 * 1024 / PARKED_CALL_BYTES);
        assert_eq!(c.pool.max_sessions, c.state.parked.total + 1024);
        let c = config("[state]\nmax_parked_memory = \"1GiB\"\n[server]\nmax_connections = 100\n");
        assert_eq!(c.state.parked.total, 16_384);
        assert_eq!(c.pool.max_sessions, 16_484);
    }

    #[test]
    fn descriptors_lower_a_sized_bound_and_never_a_set_one() {
        let mut c = config("[state]\nmax_parked_memory = \"4GiB\"\n");
        let room = fit(&mut c, 20_000);
        assert_eq!(room, (20_000 - 256 - 3 * 1024) / 2);
        assert_eq!(c.state.parked.total as u64, room);
        assert_eq!(c.pool.max_sessions as u64, room + 1024);
        let mut set = config("[state]\nmax_parked = 50000\n[pool]\nmax_sessions = 60000\n");
        fit(&mut set, 20_000);
        assert_eq!(
            (set.state.parked.total, set.pool.max_sessions),
            (50_000, 60_000)
        );
        // Too few descriptors for any: still one.
        let mut c = config("");
        fit(&mut c, 1024);
        assert_eq!(c.state.parked.total, 1);
    }
}
