//! How long a round waits for more server requests before it is answered `input_required`.
//!
//! A legacy tool that asks for several inputs at once (`asyncio.gather` of an elicitation, a
//! sampling and a roots request) sends them back to back, and they must form one round; a tool
//! that asks one thing at a time must not wait for company that never comes. The upstream does
//! not say which it is, so the proxy learns it, per method + target (tool or prompt name,
//! resource URI) + the client's declared capabilities (tools often ask more of a client that
//! can give more):
//!
//! - unknown, or seen asking together: the round waits `state.gather_window` for more;
//! - seen asking one at a time (a whole window passed with one request pending, and it never
//!   asked while another was unanswered): the round takes only what has already arrived (the
//!   actor drains every message already read, yields once so that connection tasks can hand
//!   over what the socket holds, then answers) and adds no wait at all;
//! - a request that comes while another of the same call is unanswered (parked, or in the
//!   window) marks its target as asking together from then on; the call it happened to is not
//!   lost, it only takes one more round.
//!
//! `state.gather = "always"` is the fixed window on every round, `"never"` never waits. What is
//! learned is per instance, bounded by `state.gather_max_targets` (beyond it, new targets keep the
//! window), and forgotten on restart.

use std::hash::{Hash, Hasher};
use std::time::Duration;

use dashmap::DashMap;
use serde_json::Value;

use crate::config::{GatherMode, Gathering};

/// The gather policy and what it learned.
#[derive(Debug)]
pub(crate) struct Gather {
    mode: GatherMode,
    window: Duration,
    habits: DashMap<u64, Habit>,
    max_targets: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Habit {
    OneAtATime,
    Together,
}

impl Gather {
    /// The policy; its window is what unknown and together-asking targets wait.
    pub(crate) fn new(config: Gathering) -> Self {
        Self {
            mode: config.mode,
            window: config.window,
            habits: DashMap::new(),
            max_targets: config.max_targets,
        }
    }

    /// How long a round of a call keyed `key` waits for more requests; `None`: it takes only
    /// what has already arrived.
    pub(crate) fn window(&self, key: u64) -> Option<Duration> {
        let wait = match self.mode {
            GatherMode::Always => true,
            GatherMode::Never => false,
            GatherMode::Learn => self.habit(key) != Some(Habit::OneAtATime),
        };
        Some(self.window).filter(|w| wait && !w.is_zero())
    }

    /// The upstream asked while an earlier request of the same call was unanswered.
    pub(crate) fn saw_together(&self, key: u64) {
        self.learn(key, Habit::Together, true);
    }

    /// A whole window passed with a single request pending (kept only for a target not yet
    /// seen asking together).
    pub(crate) fn saw_one(&self, key: u64) {
        self.learn(key, Habit::OneAtATime, false);
    }

    fn habit(&self, key: u64) -> Option<Habit> {
        self.habits.get(&key).map(|h| *h)
    }

    fn learn(&self, key: u64, habit: Habit, overwrite: bool) {
        if self.mode != GatherMode::Learn {
            return;
        }
        if let Some(mut known) = self.habits.get_mut(&key) {
            if overwrite {
                *known = habit;
            }
            return;
        }
        if self.habits.len() < self.max_targets {
            self.habits.insert(key, habit);
        }
    }
}

/// What a call's habit is learned under: method, target and the declared capabilities.
pub(crate) fn key(method: &str, target: &str, capabilities: &Value) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    method.hash(&mut h);
    target.hash(&mut h);
    // Object keys come out sorted, so equal declarations hash alike.
    crate::jsonrpc::text(capabilities).hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const WINDOW: Duration = Duration::from_millis(10);

    fn gather(mode: GatherMode, window: Duration, max_targets: usize) -> Gather {
        Gather::new(Gathering {
            mode,
            window,
            max_targets,
        })
    }

    #[test]
    fn unknown_targets_wait_one_at_a_time_targets_do_not() {
        let g = gather(GatherMode::Learn, WINDOW, 8);
        let k = key("tools/call", "ask", &json!({}));
        assert_eq!(g.window(k), Some(WINDOW));
        g.saw_one(k);
        assert_eq!(g.window(k), None);
        g.saw_together(k);
        assert_eq!(g.window(k), Some(WINDOW), "asking together is learned back");
        g.saw_one(k);
        assert_eq!(g.window(k), Some(WINDOW), "and it sticks");
    }

    #[test]
    fn the_capabilities_are_part_of_the_target() {
        let g = gather(GatherMode::Learn, WINDOW, 8);
        let elicit = key("tools/call", "t", &json!({"elicitation": {}}));
        let all = key(
            "tools/call",
            "t",
            &json!({"elicitation": {}, "sampling": {}}),
        );
        g.saw_one(elicit);
        assert_eq!(g.window(elicit), None);
        assert_eq!(g.window(all), Some(WINDOW));
        assert_ne!(
            key("prompts/get", "t", &json!({})),
            key("tools/call", "t", &json!({}))
        );
    }

    #[test]
    fn what_is_learned_is_bounded() {
        let g = gather(GatherMode::Learn, WINDOW, 1);
        g.saw_one(1);
        g.saw_one(2);
        assert_eq!(g.window(1), None);
        assert_eq!(
            g.window(2),
            Some(WINDOW),
            "past the bound a target keeps the window"
        );
    }

    #[test]
    fn fixed_modes_do_not_learn() {
        let always = gather(GatherMode::Always, WINDOW, 8);
        always.saw_one(1);
        assert_eq!(always.window(1), Some(WINDOW));
        let never = gather(GatherMode::Never, WINDOW, 8);
        never.saw_together(1);
        assert_eq!(never.window(1), None);
        let zero = gather(GatherMode::Always, Duration::ZERO, 8);
        assert_eq!(zero.window(1), None);
    }
}
