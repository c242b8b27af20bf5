//! A stdio upstream: the server runs as a child process speaking newline-delimited JSON-RPC on
//! stdin / stdout, its stderr going to the proxy's log. One child is one session.
//!
//! The child gets a clean environment (a few basics such as `PATH` and `HOME`, plus
//! `upstream.env`), never the proxy's own (which may hold `MRTR_STATE_SECRET`). It is stopped by
//! closing its stdin (what the spec asks a stdio server to take as the end), then killed if it does
//! not exit in time, and always reaped. Should the proxy itself die, the closed stdin tells the
//! child to exit.

use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, ChildStdin, Command};
use tokio_util::codec::{FramedRead, LinesCodec, LinesCodecError};

use super::client::UpstreamError;
use super::link::{Link, Sink, SinkFuture};
use crate::config::StdioCommand;

/// Variables passed on from the proxy's environment to the child (when set).
const PASSED_ENV: [&str; 8] = [
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "TMPDIR",
];

/// How long a child gets to exit after its stdin is closed, before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(2);

/// Longest stderr line logged as it is (longer ones are cut).
const MAX_STDERR_LINE: usize = 8 * 1024;

/// A child's stdin, and the child itself (killed if still running when dropped).
#[derive(Debug)]
pub(crate) struct StdioSink {
    stdin: tokio::sync::Mutex<Option<ChildStdin>>,
    child: tokio::sync::Mutex<Option<Child>>,
    write_timeout: Duration,
}

impl Sink for StdioSink {
    fn send(&self, message: Vec<u8>) -> SinkFuture<'_, Result<(), UpstreamError>> {
        Box::pin(self.write_line(message))
    }

    fn stop(&self) -> SinkFuture<'_, ()> {
        Box::pin(self.stop_child())
    }
}

impl StdioSink {
    // Writes one message as one line. A message never holds a raw line break outside a string
    // (JSON escapes them inside strings), so any in the whitespace between tokens becomes a space.
    async fn write_line(&self, mut message: Vec<u8>) -> Result<(), UpstreamError> {
        for b in &mut message {
            if *b == b'\n' || *b == b'\r' {
                *b = b' ';
            }
        }
        message.push(b'\n');
        let mut stdin = self.stdin.lock().await;
        let Some(pipe) = stdin.as_mut() else {
            return Err(UpstreamError::Closed);
        };
        // A child that stops reading fills the pipe: that is a dead session, not a hung proxy.
        match tokio::time::timeout(self.write_timeout, pipe.write_all(&message)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(UpstreamError::Connect(format!(
                "stdin of the upstream: {e}"
            ))),
            Err(_) => Err(UpstreamError::Timeout),
        }
    }

    // Closes stdin, waits a little for the child to exit, kills it if it did not, and reaps it.
    async fn stop_child(&self) {
        self.stdin.lock().await.take();
        let Some(mut child) = self.child.lock().await.take() else {
            return;
        };
        if tokio::time::timeout(EXIT_GRACE, child.wait())
            .await
            .is_err()
        {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }
}

/// Starts the child and its readers; the link is ready for the handshake.
///
/// # Errors
/// [`UpstreamError::Connect`] when the command cannot be started.
pub(crate) fn spawn(
    cmd: &StdioCommand,
    max_line: usize,
    write_timeout: Duration,
) -> Result<Arc<Link>, UpstreamError> {
    let mut c = Command::new(&cmd.program);
    c.args(&cmd.args)
        .env_clear()
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    for key in PASSED_ENV {
        if let Some(v) = std::env::var_os(key) {
            c.env(key, v);
        }
    }
    c.envs(&cmd.env);
    if let Some(dir) = &cmd.cwd {
        c.current_dir(dir);
    }
    let mut child = c
        .spawn()
        .map_err(|e| UpstreamError::Connect(format!("cannot start `{}`: {e}", cmd.program)))?;
    let pid = child.id().unwrap_or(0);
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(UpstreamError::Protocol("child pipes missing".into()));
    };
    tracing::debug!(pid, program = %cmd.program, "started the upstream process");
    let link = Link::new(Box::new(StdioSink {
        stdin: tokio::sync::Mutex::new(Some(stdin)),
        child: tokio::sync::Mutex::new(Some(child)),
        write_timeout,
    }));
    let weak = Arc::downgrade(&link);
    link.track(tokio::spawn(read_stdout(weak, stdout, max_line, pid)));
    // Not tracked: it ends with the pipe, after the child's last line, however the child ends.
    tokio::spawn(log_stderr(stderr, pid));
    Ok(link)
}

// Each stdout line is one message. A line that is not JSON (a server printing to stdout by
// mistake) is skipped; so is one longer than `max_line`, the rest of which is discarded.
async fn read_stdout(
    link: Weak<Link>,
    stdout: tokio::process::ChildStdout,
    max_line: usize,
    pid: u32,
) {
    let mut lines = FramedRead::new(stdout, LinesCodec::new_with_max_length(max_line));
    while let Some(line) = lines.next().await {
        let Some(l) = link.upgrade() else { return };
        l.touch();
        match line {
            Ok(line) if line.trim().is_empty() => {}
            Ok(line) if !line.trim_start().starts_with('{') => {
                tracing::warn!(
                    pid,
                    "ignoring a line on the upstream's stdout that is not JSON-RPC"
                );
            }
            Ok(line) => l.dispatch(Bytes::from(line.into_bytes())).await,
            Err(LinesCodecError::MaxLineLengthExceeded) => {
                tracing::warn!(
                    pid,
                    limit = max_line,
                    "ignoring an upstream message over upstream.max_sse_event"
                );
            }
            Err(LinesCodecError::Io(e)) => {
                tracing::debug!(pid, error = %e, "reading the upstream's stdout failed");
                break;
            }
        }
    }
    tracing::debug!(pid, "the upstream process closed its stdout");
    if let Some(l) = link.upgrade() {
        l.on_closed();
    }
}

// The child's stderr, line by line, into the proxy's log.
async fn log_stderr(stderr: tokio::process::ChildStderr, pid: u32) {
    let mut lines = FramedRead::new(stderr, LinesCodec::new_with_max_length(MAX_STDERR_LINE));
    while let Some(line) = lines.next().await {
        match line {
            Ok(line) => tracing::info!(upstream_pid = pid, "upstream: {line}"),
            Err(LinesCodecError::MaxLineLengthExceeded) => {
                tracing::info!(
                    upstream_pid = pid,
                    "upstream: (a stderr line over 8 KiB, not shown)"
                );
            }
            Err(LinesCodecError::Io(_)) => break,
        }
    }
}
