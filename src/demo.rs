//! `mrtr-proxy demo`: a built-in legacy server, the proxy in front of it, and a scripted modern
//! client walking through discover, list, a plain call, an elicitation round, a sampling round
//! and a task; then (without `--once`) it keeps serving and says how to point a client at it.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;

use serde_json::{json, Value};
use tokio::net::TcpListener;

use crate::app::App;
use crate::cli::DemoTransport;
use crate::config::{Config, StdioCommand, UpstreamTransport};
use crate::server;

pub mod client;
mod session;
pub mod transports;
pub mod upstream;

use client::{Exchange, ModernClient};

/// The log filter of `demo` unless `RUST_LOG` sets one: warnings and errors only, so that the
/// proxy's log (stderr) does not interleave with the walkthrough (stdout).
pub const LOG_LEVEL: &str = "warn";
use upstream::DemoUpstream;

/// How the demo runs.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Where the proxy listens (default: loopback, a free port).
    pub listen: Option<SocketAddr>,
    /// Exit after the walkthrough.
    pub once: bool,
    /// The built-in server's legacy transport.
    pub transport: DemoTransport,
}

/// Runs the demo. With `once`, exits after the walkthrough; else serves until `shutdown`.
///
/// # Errors
/// A message saying which step of the walkthrough failed.
pub async fn run(
    mut config: Config,
    options: Options,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), String> {
    let (up, described) = start_upstream(&mut config, options.transport).await?;
    // The walkthrough's slow tool becomes a task at once, whatever `[tasks] after` says.
    config
        .tasks
        .set_mode("provision", crate::config::TaskMode::Always);
    let Options { listen, once, .. } = options;
    let addr = listen.unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| format!("bind {addr}: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let app = App::new(config).map_err(|e| e.to_string())?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(server::run(listener, Arc::clone(&app), async move {
        let _ = stop_rx.await;
    }));
    let url = format!("http://{addr}{}", app.config.server.mcp_path);
    let sse_url = format!("http://{addr}{}", app.config.server.sse_path);
    say(&format!(
        "legacy demo server (2025-11-25) {described}\nmrtr-proxy (2026-07-28 front) at {url}\n"
    ));
    // Polled first, the shutdown future installs its signal handlers before anything is said: a
    // signal that comes as soon as the demo says where it serves ends it cleanly, and Ctrl-C
    // during the walkthrough ends that too.
    let mut shutdown = std::pin::pin!(shutdown);
    let outcome = tokio::select! {
        biased;
        () = &mut shutdown => Err("interrupted".to_owned()),
        outcome = walkthrough(&url) => outcome,
    };
    match &outcome {
        Ok(()) => say("walkthrough complete: every step passed\n"),
        Err(e) => say(&format!("walkthrough FAILED: {e}\n")),
    }
    if !once && outcome.is_ok() {
        say(&how_to_connect(&url, &sse_url));
        shutdown.as_mut().await;
    }
    let _ = stop_tx.send(());
    let _ = server.await;
    drop(up);
    outcome
}

/// What the still-running demo says last: where it serves, and how to point a real client at
/// it (the MCP Inspector starts in the legacy era, which the proxy relays to the built-in server;
/// the bridge shows in the 2026-07-28 era).
pub fn how_to_connect(url: &str, sse_url: &str) -> String {
    format!(
        "\nserving on {url} until Ctrl-C; point a client at it:\n\
         \x20 a 2026-07-28 client: {url} (the bridge: input_required rounds, tasks)\n\
         \x20 a legacy 2025-11-25 client: the same URL; a 2024-11-05 HTTP+SSE client: {sse_url}\n\
         \x20 the MCP Inspector, in the 2026-07-28 era (in its default legacy era it talks to the\n\
         \x20 built-in server as a legacy client, and the bridge does not show):\n\
         \x20   npx @modelcontextprotocol/inspector --cli {url} --protocol-era modern --method tools/list\n\
         \x20   npx @modelcontextprotocol/inspector --web --server-url {url} --protocol-era modern\n\
         \x20   (or, in the web UI, the server's Settings → Protocol Era → Modern)\n"
    )
}

// The built-in server on `transport`, and the config pointed at it: a URL, or (stdio) this
// binary's hidden `demo-upstream` command as the proxy's child. Returns what keeps it running
// and how to describe it.
async fn start_upstream(
    config: &mut Config,
    transport: DemoTransport,
) -> Result<(Option<DemoUpstream>, String), String> {
    let up = match transport {
        DemoTransport::Http => DemoUpstream::start().await,
        DemoTransport::Sse => transports::start_sse().await,
        DemoTransport::Stdio => {
            let exe = std::env::current_exe().map_err(|e| format!("demo upstream: {e}"))?;
            let argv = vec![exe.display().to_string(), "demo-upstream".to_owned()];
            let cmd = StdioCommand::new(argv).map_err(|e| e.to_string())?;
            let described = format!("over stdio: `{} demo-upstream`", cmd.program);
            config.upstream.transport = UpstreamTransport::Stdio(cmd);
            return Ok((None, described));
        }
    }
    .map_err(|e| format!("demo upstream: {e}"))?;
    config.upstream.url = crate::config::parse_upstream(&up.url()).map_err(|e| e.to_string())?;
    config.upstream.transport = UpstreamTransport::Auto;
    let described = match transport {
        DemoTransport::Sse => format!("over HTTP+SSE at {}", up.url()),
        _ => format!("over Streamable HTTP at {}", up.url()),
    };
    Ok((Some(up), described))
}

fn say(s: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(s.as_bytes());
    let _ = out.flush();
}

fn show(dir: &str, v: &Value) {
    let text = crate::jsonrpc::text(v);
    let short = if text.len() > 400 {
        format!(
            "{}…",
            &text[..text.char_indices().take(400).last().map_or(0, |(i, _)| i)]
        )
    } else {
        text
    };
    say(&format!("  {dir} {short}\n"));
}

async fn step(
    client: &ModernClient,
    title: &str,
    method: &str,
    params: Value,
) -> Result<Exchange, String> {
    say(&format!("\n== {title}\n"));
    show("→", &json!({"method": method, "params": params}));
    let ex = client
        .request(method, params)
        .await
        .map_err(|e| format!("{title}: {e}"))?;
    for n in &ex.notifications {
        show("← (notification)", n);
    }
    show(
        &format!("← [{} {}]", ex.status.as_u16(), ex.content_type),
        &ex.last,
    );
    if ex.last.get("error").is_some() {
        return Err(format!("{title}: got an error"));
    }
    Ok(ex)
}

async fn walkthrough(url: &str) -> Result<(), String> {
    let client = ModernClient::new(
        url,
        json!({"elicitation": {"form": {}}, "sampling": {}, "roots": {}}),
    );
    let d = step(&client, "server/discover", "server/discover", json!({})).await?;
    if !d.result()["supportedVersions"]
        .as_array()
        .is_some_and(|v| v.iter().any(|x| x == "2026-07-28"))
    {
        return Err("discover does not list 2026-07-28".into());
    }
    step(&client, "tools/list", "tools/list", json!({})).await?;
    let e = step(
        &client,
        "a plain call",
        "tools/call",
        json!({"name":"echo","arguments":{"text":"hello"}}),
    )
    .await?;
    expect_text(&e, "hello")?;
    let mut p = json!({"name":"progress","arguments":{"steps":3}});
    p["_meta"] = json!({"progressToken": "p1"});
    step(&client, "a call with progress", "tools/call", p).await?;

    let params = json!({"name":"ask_name","arguments":{}});
    let r1 = step(
        &client,
        "an elicitation round: the upstream asks mid-call",
        "tools/call",
        params.clone(),
    )
    .await?;
    let (key, state) = first_round(&r1)?;
    let mut retry = params.clone();
    retry["inputResponses"] = json!({ key.clone(): {"action":"accept","content":{"name":"Ada"}} });
    retry["requestState"] = Value::String(state);
    let r2 = step(
        &client,
        "the retry answers it; the parked upstream call resumes",
        "tools/call",
        retry,
    )
    .await?;
    expect_text(&r2, "Hello, Ada!")?;

    let params = json!({"name":"summarize","arguments":{"text":"a long story"}});
    let r1 = step(&client, "a sampling round", "tools/call", params.clone()).await?;
    let (key, state) = first_round(&r1)?;
    let mut retry = params.clone();
    retry["inputResponses"] = json!({ key: {"role":"assistant","content":{"type":"text","text":"short story"},"model":"demo-model"} });
    retry["requestState"] = Value::String(state);
    let r2 = step(
        &client,
        "the retry carries the sampled message",
        "tools/call",
        retry,
    )
    .await?;
    expect_text(&r2, "Summary: short story")?;
    task(url).await
}

// The persistent workflow: a slow tool becomes a task, is polled, asks half way, is answered
// through the task, and completes.
async fn task(url: &str) -> Result<(), String> {
    let client = ModernClient::new(
        url,
        json!({"elicitation": {"form": {}}, "extensions": {"io.modelcontextprotocol/tasks": {}}}),
    );
    // The progress token makes the upstream report progress: the task's `statusMessage`.
    let params = json!({"name":"provision","arguments":{"vm":"vm-7"},"_meta":{"progressToken":"provision-1"}});
    let t = step(
        &client,
        "a slow tool becomes a task (tasks extension)",
        "tools/call",
        params,
    )
    .await?;
    let id = t.result()["taskId"].as_str().ok_or("no taskId")?.to_owned();
    let asking = poll(&client, &id, "input_required").await?;
    let key = asking.result()["inputRequests"]
        .as_object()
        .and_then(|m| m.keys().next().cloned())
        .ok_or("no inputRequests")?;
    let answer = json!({"taskId": id, "inputResponses": { key: {"action":"accept","content":{"name":"Ada"}} }});
    step(&client, "tasks/update answers it", "tasks/update", answer).await?;
    let done = poll(&client, &id, "completed").await?;
    let got = done.result()["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or("");
    if got == "vm-7 is up (approved by Ada)" {
        Ok(())
    } else {
        Err(format!("unexpected task result `{got}`"))
    }
}

// Polls `tasks/get` (at most 100 times, 100 ms apart) until the task is `status`; shows each
// status it passes.
async fn poll(client: &ModernClient, id: &str, status: &str) -> Result<Exchange, String> {
    let mut seen = String::new();
    for _ in 0..100 {
        let ex = client
            .request("tasks/get", json!({"taskId": id}))
            .await
            .map_err(|e| format!("tasks/get: {e}"))?;
        let now = ex.result()["status"].as_str().unwrap_or("").to_owned();
        if now != seen {
            say(&format!("\n== tasks/get: {now}\n"));
            show(&format!("← [{}]", ex.status.as_u16()), &ex.last);
            seen = now;
        }
        if seen == status {
            return Ok(ex);
        }
        if ex.last.get("error").is_some()
            || ["failed", "cancelled", "completed"].contains(&seen.as_str())
        {
            return Err(format!("the task ended {seen}, not {status}"));
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    Err(format!("the task never reached {status}"))
}

fn first_round(ex: &Exchange) -> Result<(String, String), String> {
    let r = ex.result();
    if r["resultType"] != "input_required" {
        return Err("expected input_required".into());
    }
    let key = r["inputRequests"]
        .as_object()
        .and_then(|m| m.keys().next().cloned())
        .ok_or("no inputRequests")?;
    let state = r["requestState"]
        .as_str()
        .ok_or("no requestState")?
        .to_owned();
    Ok((key, state))
}

fn expect_text(ex: &Exchange, want: &str) -> Result<(), String> {
    let got = ex.result()["content"][0]["text"].as_str().unwrap_or("");
    if got == want && ex.result()["resultType"] == "complete" {
        Ok(())
    } else {
        Err(format!("expected `{want}`, got `{got}`"))
    }
}
