//! The scale-out metrics: retries forwarded to the instance holding their call, and lost calls
//! run again here from their token.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::labels::{Forward, ForwardKind, ForwardLabel};

/// Forwards and replays.
#[derive(Debug, Default)]
pub(crate) struct ClusterMetrics {
    forwards: Family<ForwardLabel, Counter>,
    replays: Counter,
    replayed_answers: Counter,
}

impl ClusterMetrics {
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "forwarded_retries",
            "Retries and tasks/* requests for another instance, by kind and what became of them",
            self.forwards.clone(),
        );
        r.register(
            "replayed_calls",
            "Calls run again here from their token because the instance that held them is gone",
            self.replays.clone(),
        );
        r.register(
            "replayed_answers",
            "Server requests of replayed calls answered from the token (the user not asked again)",
            self.replayed_answers.clone(),
        );
    }

    /// A retry or a `tasks/*` request (`kind`) for another instance was forwarded, or could
    /// not be.
    pub(crate) fn forwarded(&self, kind: ForwardKind, result: Forward) {
        self.forwards
            .get_or_create(&ForwardLabel { kind, result })
            .inc();
    }

    /// A lost call is run again here from its token.
    pub(crate) fn call_replayed(&self) {
        self.replays.inc();
    }

    /// A server request of a replayed call was answered from its token.
    pub(crate) fn answer_replayed(&self) {
        self.replayed_answers.inc();
    }
}
