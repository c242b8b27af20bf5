//! What a call keeps of its replay, pure: whether it is replay-safe (decided once), the answers
//! delivered upstream so far (the journal its tokens carry) and, for a call run again from a
//! token, that token's answers not yet replayed. The actor's side is `replaying`; what a journal
//! is and how a token carries it, `state::replay`.

use serde_json::Value;

use crate::state::replay::{Journal, Replayer};

/// A call's replay: whether it is replay-safe, what it was answered so far, and, run again from
/// a token, what that token answered.
#[derive(Debug, Default)]
pub(super) struct ReplayState {
    /// Whether the call is replay-safe, once its first round decided it.
    safe: Option<bool>,
    /// Answers delivered upstream so far, by fingerprint (carried by replay-safe tokens).
    answered: Vec<(String, Value)>,
    /// Run again from a token: the answers it carried, not yet replayed.
    from: Option<Replayer>,
}

impl ReplayState {
    /// The state of a fresh call, or (`from` set) of one run again from a token.
    pub(super) fn new(from: Option<Replayer>) -> Self {
        Self {
            from,
            ..Self::default()
        }
    }

    /// Whether the call is replay-safe, once decided (at its first round).
    pub(super) fn decided(&self) -> Option<bool> {
        self.safe
    }

    /// Decides, once, whether the call is replay-safe.
    pub(super) fn decide(&mut self, safe: bool) {
        self.safe = Some(safe);
    }

    /// Whether the call runs again from a token (its result came from answers given in an
    /// earlier life).
    pub(super) fn is_rerun(&self) -> bool {
        self.from.is_some()
    }

    /// The answers delivered so far, each with the fingerprint of what it answers, in order.
    pub(super) fn answered(&self) -> &[(String, Value)] {
        &self.answered
    }

    /// Records answers delivered upstream, each with the fingerprint of what it answers.
    pub(super) fn delivered(&mut self, answers: impl IntoIterator<Item = (String, Value)>) {
        self.answered.extend(answers);
    }

    /// The journal of the answers so far and `pending` (this round's keys and fingerprints);
    /// `None` when it is over `max_bytes` encoded.
    pub(super) fn journal(
        &self,
        pending: Vec<(String, String)>,
        max_bytes: usize,
    ) -> Option<Journal> {
        let journal = Journal {
            answered: self.answered.clone(),
            pending,
        };
        if journal.encode(max_bytes).is_none() {
            tracing::debug!("the replay journal outgrew replay.max_state: no longer replayable");
            return None;
        }
        Some(journal)
    }

    /// Run again from a token: its answer for a request with fingerprint `fp` (each answer is
    /// replayed once).
    pub(super) fn replayed(&mut self, fp: &str) -> Option<Value> {
        self.from.as_mut()?.take(fp)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pending() -> Vec<(String, String)> {
        vec![("elicitation-2".into(), "f2".into())]
    }

    #[test]
    fn a_fresh_call_replays_nothing_and_journals_what_it_delivered() {
        let mut state = ReplayState::new(None);
        assert!(!state.is_rerun());
        assert_eq!(state.decided(), None, "undecided until the first round");
        state.decide(true);
        assert_eq!(state.decided(), Some(true));
        assert_eq!(state.replayed("f1"), None);
        state.delivered([("f1".to_owned(), json!({"action": "decline"}))]);
        let journal = state.journal(pending(), usize::MAX).unwrap();
        assert_eq!(
            journal.answered,
            [("f1".to_owned(), json!({"action": "decline"}))]
        );
        assert_eq!(journal.pending, pending());
    }

    #[test]
    fn a_journal_over_the_bound_is_none() {
        let mut state = ReplayState::new(None);
        state.delivered([("f1".to_owned(), json!("an answer"))]);
        let len = state
            .journal(pending(), usize::MAX)
            .unwrap()
            .encode(usize::MAX);
        let len = len.unwrap().len();
        assert!(state.journal(pending(), len).is_some());
        assert!(state.journal(pending(), len - 1).is_none());
    }

    #[test]
    fn a_rerun_replays_each_answer_of_its_token_once() {
        let journal = Journal {
            answered: vec![("f1".into(), json!("earlier"))],
            pending: pending(),
        };
        let answers = json!({"elicitation-2": "now"});
        let mut state =
            ReplayState::new(Some(Replayer::new(journal, answers.as_object().unwrap())));
        assert!(state.is_rerun());
        assert_eq!(state.replayed("f1"), Some(json!("earlier")));
        assert_eq!(state.replayed("f1"), None);
        assert_eq!(state.replayed("f2"), Some(json!("now")));
        assert!(
            state
                .journal(vec![], usize::MAX)
                .unwrap()
                .answered
                .is_empty(),
            "replayed is not delivered: the actor records what reached the upstream"
        );
    }
}
