//! What trace export costs: the OTLP/HTTP sink the harness runs itself (every POST read, counted
//! and answered 200 with an empty body), the two dead collectors (a closed port; a listener
//! that never answers) and a proxy exporting to each. The sink counts spans by walking the
//! protobuf's framing; it decodes nothing else.

use std::convert::Infallible;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use super::peers::{self, Server};
use super::phases::Target;
use super::report;
use super::wire::{Endpoint, Exchange};

/// The wrapper variable for the exporting proxies (`MRTR_BENCH_PROXY_WRAPPER` stays the plain
/// proxy's, so that a profile of it is not mixed with theirs).
const WRAPPER: &str = "MRTR_BENCH_TRACING_WRAPPER";
/// Connections the sink accepts in a run at most (the proxy's exporter keeps one alive).
const MAX_SINK_CONNECTIONS: usize = 10_000;
/// The largest export the sink reads.
const MAX_EXPORT_BYTES: usize = 64 << 20;
/// How long [`Traced::check`] waits for the first export.
const FIRST_EXPORT_WAIT: Duration = Duration::from_secs(5);

/// What the sink has received: exports (POSTs), bytes of their bodies, spans in them.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Exported {
    pub(crate) requests: u64,
    pub(crate) bytes: u64,
    pub(crate) spans: u64,
}

impl Exported {
    /// What arrived between `before` and `self`.
    pub(crate) fn since(self, before: Self) -> Self {
        Self {
            requests: self.requests - before.requests,
            bytes: self.bytes - before.bytes,
            spans: self.spans - before.spans,
        }
    }

    /// `self` plus `other`.
    pub(crate) fn plus(self, other: Self) -> Self {
        Self {
            requests: self.requests + other.requests,
            bytes: self.bytes + other.bytes,
            spans: self.spans + other.spans,
        }
    }
}

/// The sink's counters, shared with its connections.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    requests: AtomicU64,
    bytes: AtomicU64,
    spans: AtomicU64,
}

impl Counts {
    /// What has arrived so far.
    pub(crate) fn now(&self) -> Exported {
        Exported {
            requests: self.requests.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            spans: self.spans.load(Ordering::Relaxed),
        }
    }

    fn add(&self, body: &[u8]) {
        self.spans.fetch_add(count_spans(body), Ordering::Relaxed);
        self.bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
        self.requests.fetch_add(1, Ordering::Relaxed);
    }
}

/// An OTLP/HTTP collector that keeps nothing, on this process's runtime; stops when dropped.
pub(crate) struct Sink {
    pub(crate) url: String,
    pub(crate) counts: Arc<Counts>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Sink {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("sink port");
        let url = format!("http://{}", listener.local_addr().expect("sink address"));
        let counts = Arc::new(Counts::default());
        let shared = Arc::clone(&counts);
        let task = tokio::spawn(async move {
            for _ in 0..MAX_SINK_CONNECTIONS {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let counts = Arc::clone(&shared);
                let service = hyper::service::service_fn(move |req| {
                    let counts = Arc::clone(&counts);
                    async move { Ok::<_, Infallible>(receive(&counts, req).await) }
                });
                tokio::spawn(async move {
                    let conn = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service);
                    let _ = conn.await;
                });
            }
        });
        Self { url, counts, task }
    }
}

// One export: read whole (bounded), counted, answered 200 with an empty
// `ExportTraceServiceResponse`.
async fn receive(counts: &Counts, req: http::Request<Incoming>) -> http::Response<Full<Bytes>> {
    if let Ok(body) = Limited::new(req.into_body(), MAX_EXPORT_BYTES)
        .collect()
        .await
    {
        counts.add(&body.to_bytes());
    }
    http::Response::builder()
        .header("content-type", "application/x-protobuf")
        .body(Full::new(Bytes::new()))
        .expect("response")
}

/// The proxies that export traces, each in front of the same upstream, and their collectors.
pub(crate) struct Traced {
    pub(crate) sink: Sink,
    /// Exporting to the sink, every span sampled.
    pub(crate) on: Server,
    /// Exporting to a closed port: every export refused at once.
    pub(crate) down: Server,
    /// Exporting to a listener that never answers: every export waits out `export_timeout`.
    pub(crate) hung: Server,
    // Kept open (and never accepted on) for as long as `hung` runs.
    _silent: std::net::TcpListener,
}

impl Traced {
    /// Starts the sink and the three proxies, each with `config` plus its `[telemetry]`.
    pub(crate) async fn start(upstream: &str, config: &str, dir: &Path) -> Self {
        let sink = Sink::start().await;
        let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("a silent port");
        let silent_url = format!("http://{}", silent.local_addr().expect("address"));
        let start = |endpoint: &str| {
            peers::start_proxy_under(upstream, &with_telemetry(config, endpoint), dir, WRAPPER)
        };
        Self {
            on: start(&sink.url),
            down: start(&closed_port()),
            hung: start(&silent_url),
            sink,
            _silent: silent,
        }
    }

    /// The latency targets: the modern call and the MRTR round on each proxy.
    pub(crate) fn latency_targets(&self) -> Vec<Target> {
        let mut out = Vec::new();
        for (server, call, round, sink) in [
            (
                &self.on,
                report::TRACED_CALL,
                report::TRACED_ROUND,
                Some(&self.sink.counts),
            ),
            (&self.down, report::DOWN_CALL, report::DOWN_ROUND, None),
            (&self.hung, report::HUNG_CALL, report::HUNG_ROUND, None),
        ] {
            for (label, ex) in [(call, Exchange::ModernCall), (round, Exchange::MrtrRound)] {
                out.push(Target {
                    label,
                    ep: Endpoint::parse(&server.url),
                    ex,
                    session: None,
                    pid: Some(server.pid()),
                    exports: true,
                    sink: sink.cloned(),
                });
            }
        }
        out
    }

    /// Waits (bounded) for the sink's first export and for spans in it: a run whose exporting
    /// proxy exported nothing measured nothing.
    pub(crate) async fn check(&self) -> Exported {
        let until = Instant::now() + FIRST_EXPORT_WAIT;
        while self.sink.counts.now().requests == 0 && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let got = self.sink.counts.now();
        assert!(
            got.requests > 0,
            "the exporting proxy sent the sink nothing"
        );
        assert!(got.spans > 0, "the sink found no span in {got:?}");
        got
    }
}

/// `config` with `[telemetry]` exporting to `endpoint`, every trace sampled, the other keys at
/// their defaults (written out).
pub(crate) fn with_telemetry(config: &str, endpoint: &str) -> String {
    format!(
        "{config}[telemetry]\notlp_endpoint = \"{endpoint}\"\nservice_name = \"mrtr-proxy\"\n\
         sample_ratio = 1.0\nmax_queue = 2048\nexport_timeout = \"5s\"\n"
    )
}

// A collector that is down: a port bound, then closed, so that connections are refused.
fn closed_port() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let addr = listener.local_addr().expect("address");
    drop(listener);
    format!("http://{addr}")
}

/// Spans in an OTLP `ExportTraceServiceRequest`: `resource_spans` (field 1) → `scope_spans` (2)
/// → `spans` (2), all length-delimited.
fn count_spans(msg: &[u8]) -> u64 {
    fields(msg, 1)
        .map(|resource| {
            fields(resource, 2)
                .map(|scope| fields(scope, 2).count() as u64)
                .sum::<u64>()
        })
        .sum()
}

// The length-delimited fields numbered `number` of the protobuf message `msg`, others skipped;
// ends at the message's end or at anything malformed. Each step consumes input.
fn fields(msg: &[u8], number: u64) -> impl Iterator<Item = &[u8]> {
    let mut rest = msg;
    std::iter::from_fn(move || loop {
        let key = varint(&mut rest)?;
        let value = match key & 7 {
            0 => varint(&mut rest).map(|_| None)?,
            1 => skip(&mut rest, 8)?,
            2 => {
                let len = usize::try_from(varint(&mut rest)?).ok()?;
                let (value, after) = (rest.get(..len)?, rest.get(len..)?);
                rest = after;
                Some(value)
            }
            5 => skip(&mut rest, 4)?,
            _ => return None,
        };
        if let Some(v) = value.filter(|_| key >> 3 == number) {
            return Some(v);
        }
    })
}

// Skips `n` bytes of `buf`: `Some(None)`, or `None` when there are fewer.
fn skip<'a>(buf: &mut &'a [u8], n: usize) -> Option<Option<&'a [u8]>> {
    *buf = buf.get(n..)?;
    Some(None)
}

// A protobuf varint off the front of `buf` (at most 10 bytes).
fn varint(buf: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in 0..10 {
        let (&byte, rest) = buf.split_first()?;
        *buf = rest;
        value |= u64::from(byte & 0x7f) << (7 * shift);
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}
