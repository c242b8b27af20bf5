//! The real binary under a small descriptor limit: it raises its soft limit to the hard one, and
//! once out of descriptors its accept loop pauses instead of spinning (little CPU, a few log
//! lines), then serves an MRTR round as soon as descriptors come back.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use mrtr_proxy::demo::client::ModernClient;
use serde_json::json;

use crate::smoke::url_in;
use crate::support::mock::{Mock, Step};
use crate::support::{all_caps, first_round, retry};

const BIN: &str = env!("CARGO_BIN_EXE_mrtr-proxy");
/// The limits the proxy starts with: it raises the soft one to the hard one.
const SOFT_LIMIT: u64 = 32;
const HARD_LIMIT: u64 = 64;
/// Connections held open: well past the limit, and those not accepted wait in the listener's
/// backlog (128, as std and mio set it: past it, connecting stalls on SYN retransmits).
const CONNECTIONS: usize = 120;
/// How long the proxy is watched while out of descriptors.
const WINDOW: Duration = Duration::from_secs(2);
/// Log lines kept (and passed to `wait_for`) from the start; later ones are only counted.
const KEPT_LINES: usize = 200;
/// Bounds while out of descriptors: CPU as a share of the window, log growth. An accept loop
/// that retried at once spun a whole core here and wrote 400 000 lines (43 MB) in the window.
const MAX_CPU_SHARE: f64 = 0.25;
const MAX_LOG_LINES: u64 = 50;
const MAX_LOG_BYTES: u64 = 20 * 1024;

// Several threads: the scripted upstream keeps answering while the test blocks on the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_the_listener_pauses_quietly_and_recovers() {
    // This test holds over a hundred sockets itself.
    rlimit::increase_nofile_limit(4096).unwrap();
    let mock = Mock::start().await;
    mock.script("ask", vec![vec![Step::elicit(7), Step::Await(7), done()]]);
    let proxy = Proxy::start(&mock.url());
    let raised = proxy.log.wait_for("file-descriptor limit");
    assert!(
        raised.contains(&format!("before={SOFT_LIMIT}"))
            && raised.contains(&format!("descriptors={HARD_LIMIT}")),
        "{raised}"
    );
    // 64 descriptors leave no room past the reserve and the client connections' share: the
    // sized bound falls to one parked call (the round below still runs).
    let sized = proxy.log.wait_for("bounds sized");
    assert!(
        sized.contains("parked_calls_room=0") && sized.contains("max_parked=1"),
        "{sized}"
    );
    let url = url_in(&proxy.log.wait_for("listening on"));
    let addr = url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned();

    let held = connect(&addr, CONNECTIONS).await;
    proxy.log.wait_for("accept failed");
    let spent = proxy.watch(WINDOW).await;
    eprintln!(
        "out of descriptors for {:?}: {:?} CPU, {} log lines, {} log bytes",
        spent.elapsed, spent.cpu, spent.lines, spent.bytes
    );
    assert!(
        spent.cpu.as_secs_f64() < MAX_CPU_SHARE * spent.elapsed.as_secs_f64(),
        "the accept loop spins: {spent:?}"
    );
    assert!(
        spent.lines < MAX_LOG_LINES && spent.bytes < MAX_LOG_BYTES,
        "the log grows unbounded: {spent:?}\n{}",
        proxy.log.kept()
    );
    drop(held);

    // The first request waits in the backlog until the listener's pause ends.
    let base = format!("http://{addr}");
    assert_eq!(get_within(&format!("{base}/healthz")).await.0, 200);
    let client = ModernClient::new(&url, all_caps());
    let (_, state) = first_round(&client, "ask", json!({})).await;
    let answers = json!({"elicitation-1": {"action": "accept", "content": {}}});
    let done = retry(&client, "ask", json!({}), answers, &state).await;
    assert_eq!(done.result()["resultType"], "complete", "{:?}", done.last);
    let (status, metrics) = get_within(&format!("{base}/metrics")).await;
    assert_eq!(status, 200);
    let errors = r#"mrtr_accept_errors_total{kind="descriptors"}"#;
    assert!(crate::metrics::sample(&metrics, errors) >= 1.0, "{metrics}");
    let status = proxy.terminate().await;
    assert!(status.success(), "{status:?}");
}

fn done() -> Step {
    Step::Reply(json!({"content": [{"type": "text", "text": "done"}]}))
}

/// `n` connections to `addr`, each accepted or waiting in the backlog.
async fn connect(addr: &str, n: usize) -> Vec<tokio::net::TcpStream> {
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        let connect = tokio::net::TcpStream::connect(addr);
        let conn = tokio::time::timeout(Duration::from_secs(5), connect)
            .await
            .expect("connected within 5 s: the backlog has room")
            .unwrap();
        held.push(conn);
    }
    held
}

/// GETs `url` (status, body), trying again should the connection fail outright; panics after 20 s.
async fn get_within(url: &str) -> (u16, String) {
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<mrtr_proxy::body::Body>();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    for _ in 0..5 {
        let req = http::Request::get(url)
            .body(mrtr_proxy::body::empty())
            .unwrap();
        let resp = tokio::time::timeout_at(deadline, http.request(req))
            .await
            .expect("an answer within 20 s");
        match resp {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let body = resp.into_body().collect().await.unwrap().to_bytes();
                return (status, String::from_utf8_lossy(&body).into_owned());
            }
            Err(e) => eprintln!("GET {url} failed, trying again: {e}"),
        }
    }
    panic!("GET {url} failed five times");
}

/// What the proxy spent over a window.
#[derive(Debug)]
struct Spent {
    elapsed: Duration,
    cpu: Duration,
    lines: u64,
    bytes: u64,
}

/// The real binary under `ulimit`, its stderr read by a thread; killed on drop.
struct Proxy {
    child: Option<Child>,
    log: Log,
}

impl Proxy {
    fn start(upstream: &str) -> Self {
        // `ulimit` in a shell that then execs the proxy: no `unsafe` `pre_exec` needed. The
        // soft limit first, or the hard one would go below it.
        let script =
            format!(r#"ulimit -S -n {SOFT_LIMIT} && ulimit -H -n {HARD_LIMIT} && exec "$0" "$@""#);
        let mut child = Command::new("sh")
            .args(["-c", &script, BIN])
            .args(["--listen", "127.0.0.1:0", "--upstream", upstream])
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let log = Log::of(&mut child);
        Self {
            child: Some(child),
            log,
        }
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Waits out `window` (the measurement itself, not a synchronisation) and returns the
    /// CPU time and log growth of the proxy over it.
    async fn watch(&self, window: Duration) -> Spent {
        let (cpu, lines, bytes) = (cpu_time(self.pid()), self.log.lines(), self.log.bytes());
        let start = Instant::now();
        tokio::time::sleep(window).await;
        let elapsed = start.elapsed();
        Spent {
            elapsed,
            cpu: cpu_time(self.pid()).saturating_sub(cpu),
            lines: self.log.lines() - lines,
            bytes: self.log.bytes() - bytes,
        }
    }

    /// Sends SIGTERM and waits for the exit.
    async fn terminate(mut self) -> std::process::ExitStatus {
        crate::smoke::terminate(self.child.take().unwrap()).await
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// User plus system CPU time of process `pid` so far (all its threads).
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // After the command name, in parentheses: state, then utime and stime as the 12th and
    // 13th fields (proc(5)), in clock ticks.
    let (_, rest) = stat.rsplit_once(')').unwrap();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_secs_f64(ticks as f64 / clock_ticks_per_second())
}

fn clock_ticks_per_second() -> f64 {
    let out = Command::new("getconf").arg("CLK_TCK").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// The proxy's stderr: every line counted, the first `KEPT_LINES` kept and passed on.
struct Log {
    lines: Arc<AtomicU64>,
    bytes: Arc<AtomicU64>,
    kept: mpsc::Receiver<String>,
    seen: std::cell::RefCell<Vec<String>>,
}

impl Log {
    fn of(child: &mut Child) -> Self {
        let mut stderr = child.stderr.take().unwrap();
        let (tx, kept) = mpsc::channel();
        let lines = Arc::new(AtomicU64::new(0));
        let bytes = Arc::new(AtomicU64::new(0));
        let (l, b) = (Arc::clone(&lines), Arc::clone(&bytes));
        // Read in large chunks: a flood is counted as fast as the proxy writes it (a slow
        // reader would throttle the proxy through the pipe), and only its first lines are kept.
        std::thread::spawn(move || {
            let mut chunk = vec![0u8; 1 << 16];
            let (mut partial, mut sent) = (Vec::new(), 0);
            while let Ok(n @ 1..) = stderr.read(&mut chunk) {
                let chunk = &chunk[..n];
                b.fetch_add(n as u64, Ordering::Relaxed);
                let newlines = chunk.iter().filter(|&&c| c == b'\n').count();
                l.fetch_add(newlines as u64, Ordering::Relaxed);
                if sent < KEPT_LINES {
                    partial.extend_from_slice(chunk);
                }
                while let Some(end) = partial.iter().position(|&c| c == b'\n') {
                    let line: Vec<u8> = partial.drain(..=end).collect();
                    let _ = tx.send(String::from_utf8_lossy(&line).into_owned());
                    sent += 1;
                    if sent == KEPT_LINES {
                        partial.clear();
                    }
                }
            }
        });
        Self {
            lines,
            bytes,
            kept,
            seen: Default::default(),
        }
    }

    fn lines(&self) -> u64 {
        self.lines.load(Ordering::Relaxed)
    }

    fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// The next kept line containing `needle` (panics after 20 s).
    fn wait_for(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .kept
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no {needle:?} in:\n{}", self.kept()));
            self.seen.borrow_mut().push(line.clone());
            if line.contains(needle) {
                return line;
            }
        }
    }

    /// The kept lines read so far.
    fn kept(&self) -> String {
        let mut seen = self.seen.borrow_mut();
        seen.extend(self.kept.try_iter());
        seen.concat()
    }
}
