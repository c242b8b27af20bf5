//! What an accept loop does when `accept` fails. A failure of the one connection (gone before it
//! was taken) is retried at once; any other (out of descriptors, buffers or memory) would fail
//! again at once, so the loop pauses, 10 ms doubling to 1 s, back to 10 ms after a success. At
//! most one log line a second. Counting failures in metrics is the caller's.

use std::io;
use std::time::Duration;

use tokio::time::Instant;

use crate::ops::metrics::AcceptFailure;

/// The first pause after a failed accept.
const MIN_PAUSE: Duration = Duration::from_millis(10);
/// The longest pause: what axum's `serve` and hyper 0.14's `AddrIncoming` pause on every such
/// failure; the listener's backlog holds the clients meanwhile.
const MAX_PAUSE: Duration = Duration::from_secs(1);
/// At most one log line per this long; the next one counts the failures not logged.
const LOG_INTERVAL: Duration = Duration::from_secs(1);

/// The pause and the log budget of one accept loop.
#[derive(Debug)]
pub(crate) struct AcceptBackoff {
    pause: Duration,
    last_line: Option<Instant>,
    unlogged: u64,
}

impl AcceptBackoff {
    /// A loop that has not failed yet.
    pub(crate) fn new() -> Self {
        Self {
            pause: MIN_PAUSE,
            last_line: None,
            unlogged: 0,
        }
    }

    /// A connection was accepted: the next failure pauses the shortest time again, and failures
    /// not logged yet are counted in an "accepting again" line (within the log budget).
    pub(crate) fn accepted(&mut self) {
        self.pause = MIN_PAUSE;
        if self.unlogged > 0 && self.may_log(Instant::now()) {
            tracing::info!(
                unlogged_errors = self.unlogged,
                "accepting connections again"
            );
            self.unlogged = 0;
        }
    }

    /// Logs `error` (within the log budget) and waits as long as it warrants before the loop
    /// accepts again. Cancel-safe: an accept loop dropped on shutdown drops the wait with it.
    pub(crate) async fn failed(&mut self, error: &io::Error) {
        let pause = self.pause_after(error);
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }

    fn pause_after(&mut self, error: &io::Error) -> Duration {
        let kind = AcceptFailure::of(error);
        let pause = match kind {
            AcceptFailure::Connection => Duration::ZERO,
            AcceptFailure::Descriptors | AcceptFailure::Other => {
                let pause = self.pause;
                self.pause = (pause * 2).min(MAX_PAUSE);
                pause
            }
        };
        if !self.may_log(Instant::now()) {
            self.unlogged += 1;
            return pause;
        }
        let unlogged = std::mem::take(&mut self.unlogged);
        let kind = kind.as_str();
        if pause.is_zero() {
            tracing::debug!(error = %error, kind, unlogged_errors = unlogged, "accept failed");
        } else {
            tracing::warn!(error = %error, kind, unlogged_errors = unlogged, ?pause, "accept failed; pausing the listener");
        }
        pause
    }

    // Takes the log budget when a line may be written at `now`.
    fn may_log(&mut self, now: Instant) -> bool {
        let due = self
            .last_line
            .is_none_or(|t| now.duration_since(t) >= LOG_INTERVAL);
        if due {
            self.last_line = Some(now);
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    fn emfile() -> io::Error {
        io::Error::from_raw_os_error(libc::EMFILE)
    }

    /// Log output written while the guard lives (this thread only).
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        fn start(&self) -> tracing::subscriber::DefaultGuard {
            let out = self.clone();
            let subscriber = tracing_subscriber::fmt()
                .with_max_level(tracing::Level::DEBUG)
                .with_ansi(false)
                .with_writer(move || out.clone())
                .finish();
            tracing::subscriber::set_default(subscriber)
        }

        fn lines(&self) -> Vec<String> {
            let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
            text.lines().map(str::to_owned).collect()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn pauses_double_up_to_a_second_and_start_over_after_a_success() {
        let mut backoff = AcceptBackoff::new();
        let mut pauses = Vec::new();
        for _ in 0..9 {
            let start = Instant::now();
            backoff.failed(&emfile()).await;
            pauses.push(start.elapsed().as_millis());
        }
        assert_eq!(pauses, [10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        backoff.accepted();
        let start = Instant::now();
        backoff
            .failed(&io::Error::from_raw_os_error(libc::ENOBUFS))
            .await;
        assert_eq!(start.elapsed(), MIN_PAUSE);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_gone_before_its_accept_is_retried_at_once() {
        let mut backoff = AcceptBackoff::new();
        backoff.failed(&emfile()).await;
        let start = Instant::now();
        backoff
            .failed(&io::Error::from(io::ErrorKind::ConnectionAborted))
            .await;
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert_eq!(backoff.pause, MIN_PAUSE * 2, "and the backoff is kept");
    }

    #[tokio::test(start_paused = true)]
    async fn at_most_one_line_a_second_and_the_next_counts_the_rest() {
        let log = Captured::default();
        let _guard = log.start();
        let mut backoff = AcceptBackoff::new();
        // A failure every 10 ms for 2.5 s, whatever the pause: 250 failures.
        for _ in 0..250 {
            backoff.pause_after(&emfile());
            tokio::time::advance(Duration::from_millis(10)).await;
        }
        let lines = log.lines();
        assert_eq!(lines.len(), 3, "{lines:#?}");
        let counts: Vec<bool> = [0, 99, 99]
            .iter()
            .zip(&lines)
            .map(|(n, l)| l.contains(&format!("unlogged_errors={n} ")))
            .collect();
        assert_eq!(counts, [true; 3], "{lines:#?}");
        assert!(
            lines.iter().all(|l| l.contains("WARN")
                && l.contains("descriptors")
                && l.contains("Too many open files")),
            "{lines:#?}"
        );
        // Quiet since: the next success reports the failures not logged yet, once.
        tokio::time::advance(LOG_INTERVAL).await;
        backoff.accepted();
        backoff.accepted();
        let lines = log.lines();
        assert_eq!(lines.len(), 4, "{lines:#?}");
        assert!(
            lines[3].contains("accepting connections again")
                && lines[3].contains("unlogged_errors=49"),
            "{lines:#?}"
        );
    }
}
