//! Requests counted and timed by era, method and outcome, with each series kept once found:
//! `Family::get_or_create` hashes the labels (SipHash, under the family's lock) on every call,
//! and every request counts in both families.

use std::sync::OnceLock;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use super::labels::{Dense, Era, LatencyLabels, Method, Outcome, RequestLabels};

/// `requests` and `request_duration`, and their series by the dense index of their labels.
/// A series is found in its family the first time it is used, so the families show the series
/// used, as before.
#[derive(Debug)]
pub(super) struct Requests {
    counted: Family<RequestLabels, Counter>,
    timed: Family<LatencyLabels, Histogram, fn() -> Histogram>,
    counters: Box<[OnceLock<Counter>]>,
    histograms: Box<[OnceLock<Histogram>]>,
}

impl Requests {
    /// Both families, timed with `histogram`'s buckets.
    pub(super) fn new(histogram: fn() -> Histogram) -> Self {
        Self {
            counted: Family::default(),
            timed: Family::new_with_constructor(histogram),
            counters: slots(Era::COUNT * Method::COUNT * Outcome::COUNT),
            histograms: slots(Era::COUNT * Method::COUNT),
        }
    }

    /// Registers both families in `r`.
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "requests",
            "Requests answered, by era, method and outcome",
            self.counted.clone(),
        );
        r.register_with_unit("request_duration", "Time from a request to its last answered message (modern) or its response head (legacy relay)", Unit::Seconds, self.timed.clone());
    }

    /// A request ended with `outcome` after `elapsed`.
    pub(super) fn count(&self, era: Era, method: Method, outcome: Outcome, elapsed: Duration) {
        let by_method = era.index() * Method::COUNT + method.index();
        let counted = RequestLabels {
            era,
            method,
            outcome,
        };
        let timed = LatencyLabels { era, method };
        let index = by_method * Outcome::COUNT + outcome.index();
        series(&self.counters, index, || {
            self.counted.get_or_create(&counted).clone()
        })
        .inc();
        series(&self.histograms, by_method, || {
            self.timed.get_or_create(&timed).clone()
        })
        .observe(elapsed.as_secs_f64());
    }
}

fn slots<M>(len: usize) -> Box<[OnceLock<M>]> {
    (0..len).map(|_| OnceLock::new()).collect()
}

// The series at `index`, found with `find` the first time (and every time for an index past
// the slots, which a dense index never is).
fn series<M: Clone>(slots: &[OnceLock<M>], index: usize, find: impl FnOnce() -> M) -> M {
    match slots.get(index) {
        Some(slot) => slot.get_or_init(find).clone(),
        None => find(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_series_is_found_once_and_counts_where_its_family_does() {
        let requests = Requests::new(|| Histogram::new([1.0]));
        let mut found = 0;
        let count = || {
            requests.count(
                Era::Modern,
                Method::ToolsCall,
                Outcome::Complete,
                Duration::ZERO,
            );
        };
        count();
        count();
        let labels = RequestLabels {
            era: Era::Modern,
            method: Method::ToolsCall,
            outcome: Outcome::Complete,
        };
        assert_eq!(requests.counted.get_or_create(&labels).get(), 2);
        // Another outcome is another series.
        requests.count(
            Era::Modern,
            Method::ToolsCall,
            Outcome::Task,
            Duration::ZERO,
        );
        assert_eq!(requests.counted.get_or_create(&labels).get(), 2);
        let slots = [OnceLock::new()];
        for _ in 0..3 {
            series(&slots, 0, || {
                found += 1;
                Counter::<u64>::default()
            })
            .inc();
        }
        assert_eq!((found, slots[0].get().map(Counter::get)), (1, Some(3)));
        // Past the slots: found every time.
        series(&slots, 1, || {
            found += 1;
            Counter::<u64>::default()
        });
        assert_eq!(found, 2);
    }
}
