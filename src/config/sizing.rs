//! Bounds sized from memory and open files rather than counts: `state.max_parked`, when the file
//! does not set it, is what `state.max_parked_memory` pays for at [`PARKED_CALL_BYTES`] each,
//! and `pool.max_sessions`, when not set, is room for every parked call, a running request on
//! every client connection and every task. At start, once the open-file limit is raised, [`fit`] lowers a
//! sized `max_parked` to what the descriptors can hold. A replica given memory (and files) so
//! holds that many waiting calls without hand-tuning; a bound the file sets is kept as it is.
//!
//! The bounds on what one principal may hold of the upstream sessions follow the pool the same
//! way: `pool.max_listen_sessions_per_principal` and `server.max_legacy_sessions_per_principal`,
//! when not set, are [`principal_share`] of its sessions (`upstream.max_processes` for a stdio
//! upstream), so that no one principal can hold every session and leave the others 503.

use super::pool::Pool;
use super::state::HeldBounds;

/// What one parked call is charged against `state.max_parked_memory` besides its params: above
/// what one costs as measured (docs/BENCHMARKS.md: 38.8 KiB with a fast upstream, `cargo bench
/// --bench sidecar`'s capacity phase; 43 KiB of anonymous memory, 54 KiB with the program's
/// pages the first calls fault in, for 400 in front of the official Python server on a fresh
/// proxy, `cargo bench --bench parked_memory`).
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
    /// `pool.max_listen_sessions_per_principal`
    pub max_listen_sessions_per_principal: bool,
    /// `server.max_legacy_sessions_per_principal`
    pub max_legacy_sessions_per_principal: bool,
}

/// The most [`principal_share`] gives, however large the pool.
pub(super) const MAX_PRINCIPAL_SHARE: usize = 16;

/// One principal's share of `sessions` upstream sessions, for the per-principal bounds the file
/// does not set: a quarter, at least 1 and at most [`MAX_PRINCIPAL_SHARE`] (a stdio upstream's
/// default 16 children: 4).
pub(super) fn principal_share(sessions: usize) -> usize {
    (sessions / 4).clamp(1, MAX_PRINCIPAL_SHARE)
}

/// The share of the principal that names no one (every client without a principal header or
/// token: everyone's, not one client's), for the bounds the file does not set: the whole of
/// `sessions`, at most [`MAX_PRINCIPAL_SHARE`] (what the legacy sessions' bound always was).
pub(super) fn everyones_share(sessions: usize) -> usize {
    sessions.clamp(1, MAX_PRINCIPAL_SHARE)
}

/// The bounds sizing moves: the parked calls', the pool's, and what they follow from.
pub(super) struct Bounds<'a> {
    pub(super) parked: &'a mut HeldBounds,
    pub(super) pool: &'a mut Pool,
    pub(super) max_connections: usize,
    /// Tasks that may run at once (`tasks.max`; 0 with the extension off): each holds a session
    /// and its descriptors as a parked call does.
    pub(super) max_tasks: usize,
    /// A stdio upstream's `max_processes`: its sessions, in place of `pool.max_sessions`.
    pub(super) stdio_processes: Option<usize>,
    /// `server.max_legacy_sessions_per_principal` (`pool` holds the listen streams' bound).
    pub(super) legacy_share: &'a mut usize,
    pub(super) sized: Sized,
}

/// Fills in the bounds the file left to memory: `state.max_parked` from
/// `state.max_parked_memory`, `pool.max_sessions` from it, `server.max_connections` and
/// `tasks.max`.
pub(super) fn from_memory(b: Bounds<'_>) {
    if b.sized.max_parked {
        b.parked.total = memory_bound(b.parked);
    }
    sessions_follow(b);
}

/// Lowers a sized `state.max_parked` to what `descriptors` open files hold (and
/// `pool.max_sessions` with it, when sized too). Client connections and tasks take their share
/// first, but never more than half of what is left after the reserve: with few descriptors,
/// parked calls still get the other half. Returns the parked calls the descriptors hold.
pub(super) fn fit(b: Bounds<'_>, descriptors: u64) -> u64 {
    let usable = descriptors.saturating_sub(RESERVED_DESCRIPTORS);
    let others = (b.max_connections as u64)
        .saturating_mul(DESCRIPTORS_PER_CONNECTION)
        .saturating_add((b.max_tasks as u64).saturating_mul(DESCRIPTORS_PER_PARKED_CALL))
        .min(usable / 2);
    let room = (usable - others) / DESCRIPTORS_PER_PARKED_CALL;
    if b.sized.max_parked {
        let held = usize::try_from(room).unwrap_or(usize::MAX).max(1);
        b.parked.total = b.parked.total.min(held);
    }
    sessions_follow(b);
    room
}

/// What the bounds in force let through at most: `state.max_parked`, what
/// `state.max_parked_memory` pays for, and the pool's sessions, whichever is least (the gauge
/// alerts compare with).
pub(super) fn effective(parked: &HeldBounds, pool: &Pool) -> usize {
    parked
        .total
        .min(memory_bound(parked))
        .min(pool.max_sessions)
}

/// What an operator should hear at start: bounds that do not add up.
pub(super) fn warnings(
    (parked, pool, sized): (&HeldBounds, &Pool, Sized),
    room: u64,
) -> Vec<String> {
    let mut out = Vec::new();
    let memory = memory_bound(parked);
    if sized.max_parked && room < memory as u64 {
        out.push(format!(
            "the open-file limit holds {room} parked calls, fewer than state.max_parked_memory pays \
             for ({memory}): raise the hard limit (ulimit -Hn, the container runtime's nofile)"
        ));
    }
    if !sized.max_parked && parked.total > memory {
        out.push(format!(
            "state.max_parked ({}) is more than state.max_parked_memory pays for at 64 KiB a call \
             ({memory}): the memory bound stops it first",
            parked.total
        ));
    }
    if pool.max_sessions < parked.total {
        out.push(format!(
            "pool.max_sessions ({}) is below state.max_parked ({}): every parked call holds a \
             session, so the pool stops them first",
            pool.max_sessions, parked.total
        ));
    }
    out
}

fn memory_bound(parked: &HeldBounds) -> usize {
    (parked.bytes / PARKED_CALL_BYTES).max(1)
}

fn sessions_follow(b: Bounds<'_>) {
    if b.sized.max_sessions {
        b.pool.max_sessions = b
            .parked
            .total
            .saturating_add(b.max_connections)
            .saturating_add(b.max_tasks);
    }
    shares(b);
}

/// Sets the per-principal bounds the file left unset to [`principal_share`] of the upstream's
/// sessions as they are now (the pool sized, the transport final).
pub(super) fn shares(b: Bounds<'_>) {
    let share = principal_share(b.stdio_processes.unwrap_or(b.pool.max_sessions));
    if b.sized.max_listen_sessions_per_principal {
        b.pool.max_listen_sessions_per_principal = share;
    }
    if b.sized.max_legacy_sessions_per_principal {
        *b.legacy_share = share;
    }
}

/// Per-principal bounds the file sets that one principal's sessions could fill the upstream's
/// with: the other principals would then get 503.
pub(super) fn share_warnings(
    (pool, legacy_share, sized): (&Pool, usize, Sized),
    stdio_processes: Option<usize>,
) -> Vec<String> {
    let (sessions, key) = match stdio_processes {
        Some(n) => (n, "upstream.max_processes"),
        None => (pool.max_sessions, "pool.max_sessions"),
    };
    let set = [
        (
            "pool.max_listen_sessions_per_principal",
            pool.max_listen_sessions_per_principal,
            sized.max_listen_sessions_per_principal,
        ),
        (
            "server.max_legacy_sessions_per_principal",
            legacy_share,
            sized.max_legacy_sessions_per_principal,
        ),
    ];
    set.into_iter()
        .filter(|(_, bound, sized)| !sized && *bound >= sessions)
        .map(|(name, bound, _)| {
            format!(
                "{name} ({bound}) is not below {key} ({sessions}): one principal can hold every \
                 upstream session and the others get 503 (fine only when all clients are one \
                 principal)"
            )
        })
        .collect()
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
        assert_eq!(c.pool.max_sessions, c.state.parked.total + 1024 + 1000);
        let c = config(
            "[state]\nmax_parked_memory = \"1GiB\"\n[server]\nmax_connections = 100\n\
             [tasks]\nenabled = false\n",
        );
        assert_eq!(c.state.parked.total, 16_384);
        assert_eq!(c.pool.max_sessions, 16_484);
    }

    #[test]
    fn descriptors_lower_a_sized_bound_and_never_a_set_one() {
        let mut c = config("[state]\nmax_parked_memory = \"4GiB\"\n");
        let room = fit(&mut c, 20_000);
        assert_eq!(room, (20_000 - 256 - 3 * 1024 - 2 * 1000) / 2);
        assert_eq!(c.state.parked.total as u64, room);
        assert_eq!(c.pool.max_sessions as u64, room + 1024 + 1000);
        assert!(c.sizing_warnings(room)[0].contains("holds 7336 parked calls"));
        // The defaults fit in 20 000 descriptors: nothing to say.
        let mut c = config("");
        let room = fit(&mut c, 20_000);
        assert_eq!(c.state.parked.total, 4096);
        assert!(
            c.sizing_warnings(room).is_empty(),
            "{:?}",
            c.sizing_warnings(room)
        );
        let mut set = config("[state]\nmax_parked = 50000\n[pool]\nmax_sessions = 60000\n");
        fit(&mut set, 20_000);
        assert_eq!(
            (set.state.parked.total, set.pool.max_sessions),
            (50_000, 60_000)
        );
        // Few descriptors: half of what the reserve leaves goes to parked calls, and the
        // operator hears why the bound is low.
        let mut c = config("");
        let room = fit(&mut c, 3300);
        assert_eq!(room, (3300 - 256) / 2 / 2);
        assert_eq!(c.state.parked.total as u64, room);
        assert!(c.sizing_warnings(room)[0].contains("ulimit -Hn"));
        // Too few for any: still one.
        let mut c = config("");
        fit(&mut c, 64);
        assert_eq!(c.state.parked.total, 1);
    }

    #[test]
    fn unset_per_principal_session_bounds_are_a_share_of_the_upstreams_sessions() {
        let shares = |c: &Config| {
            (
                c.pool.max_listen_sessions_per_principal,
                c.server.max_legacy_sessions_per_principal,
            )
        };
        // A stdio upstream: a quarter of its children, at least one.
        let stdio = |n: usize| {
            config(&format!(
                "[upstream]\ncommand = [\"s\"]\nmax_processes = {n}\n"
            ))
        };
        assert_eq!(shares(&stdio(16)), (4, 4));
        assert_eq!(shares(&stdio(4)), (1, 1));
        assert_eq!(shares(&stdio(1)), (1, 1));
        // A network upstream: a quarter of pool.max_sessions, at most 16.
        assert_eq!(shares(&config("")), (16, 16));
        assert_eq!(shares(&config("[pool]\nmax_sessions = 20\n")), (5, 5));
        // Set in the file: kept, and told when one principal could fill the pool with it.
        let set = config(
            "[upstream]\ncommand = [\"s\"]\nmax_processes = 4\n\
             [pool]\nmax_listen_sessions_per_principal = 4\n\
             [server]\nmax_legacy_sessions_per_principal = 2\n",
        );
        assert_eq!(shares(&set), (4, 2));
        let said = set.sizing_warnings(u64::MAX);
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(said[0].starts_with("pool.max_listen_sessions_per_principal (4) is not below upstream.max_processes (4)"), "{said:?}");
        assert!(stdio(4).sizing_warnings(u64::MAX).is_empty());
        // The transport given after the file was read (`mrtr-proxy -- COMMAND`): the share follows.
        let mut c = config("");
        c.upstream.transport = crate::config::UpstreamTransport::Stdio(
            crate::config::StdioCommand::new(vec!["s".into()]).unwrap(),
        );
        c.share_sessions();
        assert_eq!(shares(&c), (4, 4));
    }

    #[test]
    fn bounds_that_do_not_add_up_are_told_and_the_least_is_in_force() {
        let c = config("[state]\nmax_parked = 10000\n[pool]\nmax_sessions = 512\n");
        let said = c.sizing_warnings(u64::MAX);
        assert_eq!(said.len(), 2, "{said:?}");
        assert_eq!(c.parked_limit(), 512);
        assert_eq!(config("").parked_limit(), 4096);
        // A stdio upstream: one child per session.
        let stdio = config("[upstream]\ncommand = [\"server\"]\nmax_processes = 8\n");
        assert_eq!(stdio.parked_limit(), 8);
    }
}
