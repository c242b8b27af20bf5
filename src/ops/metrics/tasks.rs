//! The tasks' metrics: tasks on this instance by status, how long each lived to its end, and how
//! many times each asked the client for input.

use std::time::Duration;

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
}

impl Default for TaskMetrics {
    fn default() -> Self {
        Self {
            by_status: Family::default(),
            // 0.1 s … ~1.2 days.
            duration: Histogram::new(exponential_buckets(0.1, 4.0, 12)),
            input_rounds: Histogram::new([0.0, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0]),
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
