//! Where a call is, and the only code that moves it: one method per arrow of the diagram in
//! `call`'s module doc (`gather`, `park`, `hold`, `resume`, `run`, `detach`, `adopted`,
//! `finish`). Pure: no
//! IO, no clock but the moment of parking; what to say on the legs it hands back is the actor's
//! job.
//! A transition asked of a phase it does not leave is refused (the phase is left as it was).

use tokio::time::Instant;

use super::leg::Leg;
use crate::jsonrpc::Message;

/// The call's phase; `T` is what a call that became a task runs it with (the actor's
/// `TaskRun`: generic so that this file stays pure). Only the transitions below change it.
#[derive(Debug)]
pub(super) struct Phase<T>(State<T>);

#[derive(Debug)]
enum State<T> {
    /// A client exchange is open and the upstream is working.
    Running(Leg),
    /// Server requests came while an exchange was open; more may join the round until `until`
    /// (with `None`, only those already read: see `gather`).
    Gathering { leg: Leg, until: Option<Instant> },
    /// A round was answered `input_required`; no exchange is open until a retry or `deadline`.
    Parked {
        since: Instant,
        deadline: Instant,
        /// The upstream's final message, when it came while parked (sent on the next retry).
        held_final: Option<Message>,
    },
    /// A retry was claimed; its answers are on their way upstream.
    Resuming(Leg),
    /// Answered with a task (the tasks extension): no exchange is ever open again; the client
    /// polls the task, and its answers come through the task it runs with.
    Detached(T),
    /// Over.
    Done,
}

impl<T> Phase<T> {
    /// A fresh call: running, on the client's first exchange.
    pub(super) fn start(first: Leg) -> Self {
        Self(State::Running(first))
    }

    /// A task adopted from an instance that was lost, run again: detached from the start (no
    /// exchange is open; the client polls the task).
    pub(super) fn adopted(task: T) -> Self {
        Self(State::Detached(task))
    }

    /// The open client exchange; `None` while parked or done.
    pub(super) fn leg(&self) -> Option<&Leg> {
        match &self.0 {
            State::Running(leg) | State::Resuming(leg) | State::Gathering { leg, .. } => Some(leg),
            State::Parked { .. } | State::Detached(_) | State::Done => None,
        }
    }

    /// Whether the upstream works with an exchange open and no round gathering (only then is
    /// the call due to become a task).
    pub(super) fn is_running(&self) -> bool {
        matches!(self.0, State::Running(_))
    }

    /// Whether the call runs as a task.
    pub(super) fn is_detached(&self) -> bool {
        matches!(self.0, State::Detached(_))
    }

    /// The task the call runs as, once detached.
    pub(super) fn task(&self) -> Option<&T> {
        match &self.0 {
            State::Detached(task) => Some(task),
            _ => None,
        }
    }

    /// The task the call runs as, once detached, to write.
    pub(super) fn task_mut(&mut self) -> Option<&mut T> {
        match &mut self.0 {
            State::Detached(task) => Some(task),
            _ => None,
        }
    }

    /// What the actor waits on: the open exchange (closed by the client) or the task (its
    /// client messages); at most one of them.
    pub(super) fn waits_on(&mut self) -> (Option<&Leg>, Option<&mut T>) {
        match &mut self.0 {
            State::Detached(task) => (None, Some(task)),
            State::Running(leg) | State::Resuming(leg) | State::Gathering { leg, .. } => {
                (Some(leg), None)
            }
            State::Parked { .. } | State::Done => (None, None),
        }
    }

    /// Whether the call is over.
    pub(super) fn is_done(&self) -> bool {
        matches!(self.0, State::Done)
    }

    /// While gathering: when the window ends (`None` inside: the round takes only what was
    /// already read).
    pub(super) fn gathering(&self) -> Option<Option<Instant>> {
        match self.0 {
            State::Gathering { until, .. } => Some(until),
            _ => None,
        }
    }

    /// While parked: since when.
    pub(super) fn parked_since(&self) -> Option<Instant> {
        match self.0 {
            State::Parked { since, .. } => Some(since),
            _ => None,
        }
    }

    /// While parked: when the call expires without a retry.
    pub(super) fn deadline(&self) -> Option<Instant> {
        match self.0 {
            State::Parked { deadline, .. } => Some(deadline),
            _ => None,
        }
    }

    /// Whether a client waits on the upstream's answer (running or resuming): only then is the
    /// upstream's silence bounded (parked, the TTL bounds it; gathering, the window does).
    pub(super) fn awaits_upstream(&self) -> bool {
        matches!(self.0, State::Running(_) | State::Resuming(_))
    }

    /// Running → Gathering: the first server request of a round came; it gathers until
    /// `until()` (asked only then). Returns whether the call moved (from any other phase the
    /// request simply joins the round already gathering, or the next one).
    pub(super) fn gather(&mut self, until: impl FnOnce() -> Option<Instant>) -> bool {
        match std::mem::replace(&mut self.0, State::Done) {
            State::Running(leg) => {
                let until = until();
                self.0 = State::Gathering { leg, until };
                true
            }
            other => {
                self.0 = other;
                false
            }
        }
    }

    /// Running, Gathering or Resuming → Parked until `deadline`: returns the exchange, to be
    /// answered with the round. `None` (phase untouched) when no exchange is open.
    pub(super) fn park(&mut self, deadline: Instant) -> Option<Leg> {
        let leg = self.take_leg()?;
        self.0 = State::Parked {
            since: Instant::now(),
            deadline,
            held_final: None,
        };
        Some(leg)
    }

    /// Parked → Parked: keeps the upstream's final message for the next retry. In any other
    /// phase it gives `msg` back (it is the open exchange's answer).
    pub(super) fn hold(&mut self, msg: Message) -> Option<Message> {
        match &mut self.0 {
            State::Parked { held_final, .. } => {
                *held_final = Some(msg);
                None
            }
            _ => Some(msg),
        }
    }

    /// Parked → Resuming on the retry's exchange `leg`: returns the final message held while
    /// parked, if one came.
    ///
    /// # Errors
    /// Gives `leg` back (phase untouched) when the call is not parked: no retry was awaited.
    pub(super) fn resume(&mut self, leg: Leg) -> Result<Option<Message>, Leg> {
        match std::mem::replace(&mut self.0, State::Done) {
            State::Parked { held_final, .. } => {
                self.0 = State::Resuming(leg);
                Ok(held_final)
            }
            other => {
                self.0 = other;
                Err(leg)
            }
        }
    }

    /// Running → Detached: the call becomes `task`. Returns the open exchange, to be answered
    /// with the task.
    ///
    /// # Errors
    /// Gives `task` back (phase untouched) from any other phase: a call gathering a round
    /// answers it first (the MRTR rounds come before the task), and only a running one is due.
    pub(super) fn detach(&mut self, task: T) -> Result<Leg, T> {
        match std::mem::replace(&mut self.0, State::Done) {
            State::Running(leg) => {
                self.0 = State::Detached(task);
                Ok(leg)
            }
            other => {
                self.0 = other;
                Err(task)
            }
        }
    }

    /// Resuming → Running: every key was answered and the upstream works on. Returns whether
    /// the call moved.
    pub(super) fn run(&mut self) -> bool {
        match std::mem::replace(&mut self.0, State::Done) {
            State::Resuming(leg) => {
                self.0 = State::Running(leg);
                true
            }
            other => {
                self.0 = other;
                false
            }
        }
    }

    /// Any phase → Done: returns the open exchange, if any, for the call's last word (dropped,
    /// it tells a client that left nothing).
    pub(super) fn finish(&mut self) -> Option<Leg> {
        let leg = self.take_leg();
        self.0 = State::Done;
        leg
    }

    // The open exchange, leaving `Done` in its place; `None` (phase untouched) when none is open.
    fn take_leg(&mut self) -> Option<Leg> {
        match std::mem::replace(&mut self.0, State::Done) {
            State::Running(leg) | State::Resuming(leg) | State::Gathering { leg, .. } => Some(leg),
            other => {
                self.0 = other;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::value::RawValue;

    use super::*;

    /// A phase whose task is nothing: this file knows nothing of tasks.
    type Phase = super::Phase<()>;

    fn leg(id: &str) -> Leg {
        let id = RawValue::from_string(id.to_owned()).unwrap();
        Leg::open(id, None, None).0
    }

    fn id(leg: Option<&Leg>) -> Option<&str> {
        leg.map(|l| l.id.get())
    }

    fn final_message() -> Message {
        Message::parse(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#).unwrap()
    }

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    // Every phase, each with its own exchange where it has one.
    fn every_phase() -> Vec<Phase> {
        let mut gathering = Phase::start(leg("2"));
        gathering.gather(|| None);
        let mut parked = Phase::start(leg("3"));
        parked.park(later());
        let mut resuming = Phase::start(leg("4"));
        resuming.park(later());
        resuming.resume(leg("5")).unwrap();
        let mut done = Phase::start(leg("6"));
        done.finish();
        let mut detached = Phase::start(leg("7"));
        detached.detach(()).unwrap();
        vec![
            Phase::start(leg("1")),
            gathering,
            parked,
            resuming,
            done,
            detached,
        ]
    }

    #[test]
    fn only_a_running_call_becomes_a_task_and_never_goes_back() {
        let mut phase = Phase::start(leg("1"));
        assert_eq!(id(phase.detach(()).ok().as_ref()), Some("1"));
        assert!(phase.is_detached() && phase.task().is_some());
        assert!(phase.leg().is_none());
        assert!(
            !phase.awaits_upstream(),
            "a task's upstream may stay silent"
        );
        assert!(
            phase.park(later()).is_none(),
            "no round: nothing to answer it on"
        );
        assert!(phase.resume(leg("2")).is_err(), "no retry is awaited");
        assert!(!phase.gather(|| unreachable!()));
        assert!(phase.hold(final_message()).is_some(), "the task takes it");
        for mut phase in every_phase().into_iter().skip(1) {
            let before = format!("{phase:?}");
            assert!(phase.detach(()).is_err());
            assert_eq!(format!("{phase:?}"), before, "left as it was");
        }
        assert!(phase.finish().is_none());
        assert!(phase.is_done());
    }

    #[test]
    fn a_call_starts_running_on_its_first_exchange() {
        let phase = Phase::start(leg("1"));
        assert_eq!(id(phase.leg()), Some("1"));
        assert!(phase.awaits_upstream());
        assert!(!phase.is_done());
        assert_eq!(phase.gathering(), None);
        assert_eq!(phase.deadline(), None);
    }

    #[test]
    fn only_a_running_call_gathers() {
        let until = Some(later());
        let mut phase = Phase::start(leg("1"));
        assert!(phase.gather(|| until));
        assert_eq!(phase.gathering(), Some(until));
        assert_eq!(id(phase.leg()), Some("1"), "the exchange stays open");
        assert!(!phase.awaits_upstream());
        for mut phase in every_phase().into_iter().skip(1) {
            let before = format!("{phase:?}");
            assert!(!phase.gather(|| unreachable!("no window is asked for")));
            assert_eq!(format!("{phase:?}"), before, "left as it was");
        }
    }

    #[test]
    fn parking_hands_back_the_open_exchange() {
        let deadline = later();
        for (mut phase, open) in every_phase().into_iter().zip(["1", "2", "", "5", ""]) {
            let before = format!("{phase:?}");
            let leg = phase.park(deadline);
            if open.is_empty() {
                assert!(leg.is_none());
                assert_eq!(format!("{phase:?}"), before, "left as it was");
                continue;
            }
            assert_eq!(id(leg.as_ref()), Some(open));
            assert!(phase.leg().is_none(), "no exchange is open while parked");
            assert_eq!(phase.deadline(), Some(deadline));
            assert!(phase.parked_since().is_some());
        }
    }

    #[test]
    fn only_a_parked_call_holds_a_final_message() {
        for (mut phase, parked) in every_phase()
            .into_iter()
            .zip([false, false, true, false, false])
        {
            assert_eq!(phase.hold(final_message()).is_none(), parked);
        }
        let mut phase = Phase::start(leg("1"));
        phase.park(later());
        assert!(phase.hold(final_message()).is_none());
        assert!(phase.deadline().is_some(), "still parked");
        let held = phase.resume(leg("2")).unwrap();
        assert!(held.is_some(), "the retry gets the held message");
    }

    #[test]
    fn a_retry_resumes_only_a_parked_call() {
        let mut phase = Phase::start(leg("1"));
        phase.park(later());
        assert!(
            phase.resume(leg("2")).unwrap().is_none(),
            "nothing was held"
        );
        assert_eq!(id(phase.leg()), Some("2"), "the retry's exchange is open");
        assert!(phase.awaits_upstream());
        assert_eq!(phase.deadline(), None);
        for (mut phase, parked) in every_phase()
            .into_iter()
            .zip([false, false, true, false, false])
        {
            if parked {
                continue;
            }
            let before = format!("{phase:?}");
            let refused = phase.resume(leg("9")).unwrap_err();
            assert_eq!(refused.id.get(), "9", "the retry's exchange comes back");
            assert_eq!(format!("{phase:?}"), before, "left as it was");
        }
    }

    #[test]
    fn only_a_resuming_call_runs_on() {
        for (mut phase, resuming) in every_phase()
            .into_iter()
            .zip([false, false, false, true, false])
        {
            let before = id(phase.leg()).map(str::to_owned);
            assert_eq!(phase.run(), resuming);
            assert_eq!(id(phase.leg()).map(str::to_owned), before, "same exchange");
            if resuming {
                assert!(phase.awaits_upstream());
                assert!(
                    phase.gather(|| None),
                    "running again: the next round can gather"
                );
            }
        }
    }

    #[test]
    fn finishing_ends_every_phase_and_hands_back_its_exchange() {
        for (mut phase, open) in every_phase().into_iter().zip(["1", "2", "", "5", ""]) {
            let leg = phase.finish();
            assert_eq!(id(leg.as_ref()), Some(open).filter(|o| !o.is_empty()));
            assert!(phase.is_done());
            assert!(phase.leg().is_none());
            assert!(phase.finish().is_none(), "finishing twice is harmless");
        }
    }
}
