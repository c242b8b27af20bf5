//! The approval gate's metric: its decisions, by kind (never by tool or principal).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::labels::{Decision, DecisionLabel};

/// Approval decisions.
#[derive(Debug, Default)]
pub(crate) struct ApprovalMetrics {
    decisions: Family<DecisionLabel, Counter>,
}

impl ApprovalMetrics {
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "approvals",
            "Calls of gated tools, by what the approval gate decided",
            self.decisions.clone(),
        );
    }

    /// The gate decided `decision` for one call.
    pub(crate) fn decided(&self, decision: Decision) {
        self.decisions
            .get_or_create(&DecisionLabel { decision })
            .inc();
    }
}
