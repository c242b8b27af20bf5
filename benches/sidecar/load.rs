//! Load loops, each bounded in count and in time: one worker timing exchanges back to back, and
//! many workers (one connection each) running them at once.

use std::time::{Duration, Instant};

use super::wire::{Client, Endpoint, Exchange};

/// Latencies of one sequential run, sorted.
pub(crate) async fn sequential(
    client: &mut Client,
    ex: Exchange,
    warmup: usize,
    n: usize,
) -> Vec<Duration> {
    for _ in 0..warmup {
        client.run(ex).await;
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        client.run(ex).await;
        out.push(t.elapsed());
    }
    out.sort();
    out
}

/// What many workers did in one timed run.
pub(crate) struct Run {
    /// Every exchange's latency, sorted.
    pub(crate) latencies: Vec<Duration>,
    /// Wall time of the run.
    pub(crate) elapsed: Duration,
}

impl Run {
    /// Completed exchanges per second.
    pub(crate) fn rate(&self) -> f64 {
        self.latencies.len() as f64 / self.elapsed.as_secs_f64()
    }
}

/// Opens `n` clients for `ex` on `ep` (legacy exchanges share `session`).
pub(crate) async fn clients(
    ep: &Endpoint,
    ex: Exchange,
    session: Option<&str>,
    n: usize,
) -> Vec<Client> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(Client::open(ep, ex, session.map(str::to_owned)).await);
    }
    out
}

/// Every client runs `ex` back to back for `time` (and at most `max_each` times); returns the
/// clients for the next run.
pub(crate) async fn concurrent(
    clients: Vec<Client>,
    ex: Exchange,
    time: Duration,
    max_each: usize,
) -> (Run, Vec<Client>) {
    let start = Instant::now();
    let until = start + time;
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|mut c| {
            tokio::spawn(async move {
                let mut lat = Vec::new();
                while Instant::now() < until && lat.len() < max_each {
                    let t = Instant::now();
                    c.run(ex).await;
                    lat.push(t.elapsed());
                }
                (lat, c)
            })
        })
        .collect();
    let mut latencies = Vec::new();
    let mut back = Vec::with_capacity(tasks.len());
    for t in tasks {
        let (lat, c) = t.await.expect("worker");
        latencies.extend(lat);
        back.push(c);
    }
    let elapsed = start.elapsed();
    latencies.sort();
    (Run { latencies, elapsed }, back)
}

/// Every client runs `ex` exactly `n` times, all at once (a warm-up); returns the clients.
pub(crate) async fn each(clients: Vec<Client>, ex: Exchange, n: usize) -> Vec<Client> {
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|mut c| {
            tokio::spawn(async move {
                for _ in 0..n {
                    c.run(ex).await;
                }
                c
            })
        })
        .collect();
    let mut back = Vec::with_capacity(tasks.len());
    for t in tasks {
        back.push(t.await.expect("worker"));
    }
    back
}

/// The `q` quantile (0..=1) of sorted durations.
pub(crate) fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The median of unsorted values.
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// `items` in a random order (Fisher–Yates over the OS's randomness).
pub(crate) fn shuffled<T>(mut items: Vec<T>) -> Vec<T> {
    for i in (1..items.len()).rev() {
        let mut b = [0u8; 4];
        getrandom::getrandom(&mut b).expect("randomness");
        let j = u32::from_le_bytes(b) as usize % (i + 1);
        items.swap(i, j);
    }
    items
}
