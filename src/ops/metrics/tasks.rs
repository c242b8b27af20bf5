//! The tasks' metrics: tasks on this instance by status, how long each lived to its end, and how
//! many times each asked the client for input; and, with a shared store, the store's health,
//! round trips and errors, adoptions and lost leases.

use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

use super::labels::{TaskState, TaskStateLabel};

/// Tasks' metrics.
#[derive(Debug)]
pub(crate) struct TaskMetrics {
    by_status: Family<TaskStateLabel, Gauge>,
    duration: Histogram,
    input_rounds: Histogram,
    store_up: Gauge,
    store_seconds: Family<StoreOpLabel, Histogram, fn() -> Histogram>,
    store_errors: Family<StoreOpLabel, Counter>,
    not_created: Counter,
    adopted: Family<AdoptedLabel, Counter>,
    leases_lost: Counter,
}

/// A task store operation.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub(crate) enum StoreOp {
    Create,
    Get,
    Apply,
    Lease,
    Ping,
}

/// What became of a task another instance held when this one adopted it.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub(crate) enum Adopted {
    /// It was running, and its call is replay-safe: it runs again here.
    Replayed,
    /// It was running: failed (its call died with its holder).
    Failed,
    /// It had finished: only read.
    Finished,
}

impl EncodeLabelValue for StoreOp {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        let s = match self {
            Self::Create => "create",
            Self::Get => "get",
            Self::Apply => "apply",
            Self::Lease => "lease",
            Self::Ping => "ping",
        };
        std::fmt::Write::write_str(encoder, s)
    }
}

impl EncodeLabelValue for Adopted {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        let s = match self {
            Self::Replayed => "replayed",
            Self::Failed => "failed",
            Self::Finished => "finished",
        };
        std::fmt::Write::write_str(encoder, s)
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StoreOpLabel {
    op: StoreOp,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AdoptedLabel {
    outcome: Adopted,
}

// 0.1 ms … ~1.6 s: a store on the same network answers in well under a millisecond.
fn store_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.000_1, 2.5, 11))
}

impl Default for TaskMetrics {
    fn default() -> Self {
        Self {
            by_status: Family::default(),
            // 0.1 s … ~1.2 days.
            duration: Histogram::new(exponential_buckets(0.1, 4.0, 12)),
            input_rounds: Histogram::new([0.0, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0]),
            store_up: Gauge::default(),
            store_seconds: Family::new_with_constructor(store_buckets),
            store_errors: Family::default(),
            not_created: Counter::default(),
            adopted: Family::default(),
            leases_lost: Counter::default(),
        }
    }
}

impl TaskMetrics {
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "tasks",
            "Tasks held on this instance, by status (finished ones until their TTL)",
            self.by_status.clone(),
        );
        r.register_with_unit(
            "task_duration",
            "How long tasks ran, from creation to their final status",
            Unit::Seconds,
            self.duration.clone(),
        );
        r.register(
            "task_input_rounds",
            "Times a finished task asked the client for input",
            self.input_rounds.clone(),
        );
        self.register_store(r);
    }

    fn register_store(&self, r: &mut Registry) {
        r.register(
            "task_store_up",
            "Whether the shared task store answered when last asked (1; always 1 in memory)",
            self.store_up.clone(),
        );
        r.register_with_unit(
            "task_store_request",
            "Round trips to the shared task store, by operation",
            Unit::Seconds,
            self.store_seconds.clone(),
        );
        r.register(
            "task_store_errors",
            "Task store operations that failed or timed out, by operation",
            self.store_errors.clone(),
        );
        r.register(
            "tasks_not_created",
            "Calls due to become tasks that stayed ordinary calls because the store did not take them",
            self.not_created.clone(),
        );
        r.register(
            "tasks_adopted",
            "Tasks this instance took over from an instance that was gone, by what became of them",
            self.adopted.clone(),
        );
        r.register(
            "task_leases_lost",
            "Tasks this instance ran whose lease another instance took (its copy here stopped)",
            self.leases_lost.clone(),
        );
    }

    /// Whether the store answered.
    pub(crate) fn store_up(&self, up: bool) {
        self.store_up.set(i64::from(up));
    }

    /// A store operation took `took` (`ok`: it answered).
    pub(crate) fn store_op(&self, op: StoreOp, took: Duration, ok: bool) {
        let label = StoreOpLabel { op };
        self.store_seconds
            .get_or_create(&label)
            .observe(took.as_secs_f64());
        if !ok {
            self.store_errors.get_or_create(&label).inc();
        }
    }

    /// A call stayed an ordinary call: the store did not take its task.
    pub(crate) fn not_created(&self) {
        self.not_created.inc();
    }

    /// This instance adopted a task.
    pub(crate) fn adopted(&self, outcome: Adopted) {
        self.adopted.get_or_create(&AdoptedLabel { outcome }).inc();
    }

    /// Another instance took the lease of a task running here.
    pub(crate) fn lease_lost(&self) {
        self.leases_lost.inc();
    }

    /// A task moved from `from` (`None`: created) to `to` (`None`: dropped at its TTL).
    pub(crate) fn moved(&self, from: Option<TaskState>, to: Option<TaskState>) {
        if let Some(status) = from {
            self.by_status
                .get_or_create(&TaskStateLabel { status })
                .dec();
        }
        if let Some(status) = to {
            self.by_status
                .get_or_create(&TaskStateLabel { status })
                .inc();
        }
    }

    /// A task reached its final status after `lived`, having asked `rounds` times.
    pub(crate) fn ended(&self, lived: Duration, rounds: u32) {
        self.duration.observe(lived.as_secs_f64());
        self.input_rounds.observe(f64::from(rounds));
    }
}
