//! One session of the built-in legacy server: what it answers (`initialize`, the lists, its
//! tools, prompt, resources and resource template, `logging/setLevel`: everything its
//! capabilities declare) and what it asks mid-call (elicitation, sampling, roots), whichever
//! transport carries it (`upstream`: Streamable HTTP; `transports`: HTTP+SSE and stdio).

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use crate::sse;

/// One session of the demo server: its server requests waiting for answers, and the stream
/// that carries what belongs to no call.
#[derive(Debug)]
pub(super) struct Sess {
    next_id: AtomicI64,
    waiting: Mutex<HashMap<i64, oneshot::Sender<Value>>>,
    /// The GET stream (Streamable HTTP), or the session's one stream (HTTP+SSE, stdio).
    pub(super) get_tx: Mutex<Option<Out>>,
}

/// Where a message to the client goes: an SSE stream (events) or stdout (lines).
#[derive(Debug, Clone)]
pub(super) enum Out {
    Sse(mpsc::Sender<Bytes>),
    Lines(mpsc::Sender<Bytes>),
}

impl Sess {
    pub(super) fn new() -> Self {
        Self {
            next_id: AtomicI64::new(0),
            waiting: Mutex::new(HashMap::new()),
            get_tx: Mutex::new(None),
        }
    }
}

impl Out {
    pub(super) async fn send(&self, msg: &Value) {
        let json = crate::jsonrpc::text(msg);
        let _ = match self {
            Self::Sse(tx) => tx.send(sse::encode_message(json.as_bytes())).await,
            Self::Lines(tx) => tx.send(Bytes::from(json + "\n")).await,
        };
    }
}

/// The `InitializeResult` of the demo server.
pub(super) fn init_result() -> Value {
    json!({
        "protocolVersion": "2025-11-25",
        "capabilities": {"tools": {"listChanged": true}, "prompts": {}, "resources": {}, "logging": {}},
        "serverInfo": {"name": "mrtr-demo-upstream", "version": env!("CARGO_PKG_VERSION")},
        "instructions": "A demo legacy server that asks for input mid-call.",
    })
}

/// One message of an open session: an answer to one of our server requests wakes its waiter; a
/// request runs in a task of its own and is answered on `out`; a notification is dropped.
pub(super) fn dispatch(sess: Arc<Sess>, msg: Value, out: Out) {
    let method = msg.get("method").and_then(Value::as_str).unwrap_or("");
    let id = msg.get("id").cloned();
    if method.is_empty() {
        if let Some(n) = id.as_ref().and_then(Value::as_i64) {
            let waiter = sess.waiting.lock().ok().and_then(|mut w| w.remove(&n));
            if let Some(w) = waiter {
                let _ = w.send(
                    msg.get("result")
                        .cloned()
                        .unwrap_or_else(|| json!({"error": msg.get("error")})),
                );
            }
        }
        return;
    }
    let Some(id) = id else { return };
    let method = method.to_owned();
    let params = msg.get("params").cloned().unwrap_or(Value::Null);
    tokio::spawn(async move {
        let call = CallCtx {
            sess,
            tx: out.clone(),
            params,
        };
        let outcome = match method.as_str() {
            "tools/list" => Ok(json!({"tools": tools()})),
            "tools/call" => run_tool(&call).await,
            "prompts/list" => {
                Ok(json!({"prompts": [{"name": "greeting", "description": "Asks who to greet"}]}))
            }
            "prompts/get" => prompt(&call).await,
            "resources/list" => Ok(json!({"resources": [{"uri": "demo://motd", "name": "motd"}]})),
            "resources/templates/list" => Ok(json!({"resourceTemplates": [
                {"uriTemplate": "demo://echo/{text}", "name": "echo", "description": "Reads back {text}", "mimeType": "text/plain"}
            ]})),
            "resources/read" => read(&call).await,
            "logging/setLevel" => set_level(&call.params),
            "ping" => Ok(json!({})),
            other => Err(json!({"code": -32601, "message": format!("Method not found: {other}")})),
        };
        let msg = match outcome {
            Ok(result) => json!({"jsonrpc":"2.0","id":id,"result":result}),
            Err(error) => json!({"jsonrpc":"2.0","id":id,"error":error}),
        };
        out.send(&msg).await;
    });
}

struct CallCtx {
    sess: Arc<Sess>,
    tx: Out,
    params: Value,
}

impl CallCtx {
    fn arg(&self, k: &str) -> Option<&Value> {
        self.params.get("arguments").and_then(|a| a.get(k))
    }

    async fn notify(&self, method: &str, params: Value) {
        let m = json!({"jsonrpc":"2.0","method":method,"params":params});
        self.tx.send(&m).await;
    }

    // Progress under the request's own `progressToken`, and none when it set no token (the
    // client asked for none).
    async fn progress(&self, progress: u64, total: u64, message: &str) {
        let Some(token) = self
            .params
            .get("_meta")
            .and_then(|m| m.get("progressToken"))
        else {
            return;
        };
        let mut params = json!({"progressToken": token, "progress": progress, "total": total});
        if !message.is_empty() {
            params["message"] = json!(message);
        }
        self.notify("notifications/progress", params).await;
    }

    // Sends a server request on the call stream (or the GET stream) and waits for the answer.
    async fn ask(&self, method: &str, params: Value, on_get_stream: bool) -> Result<Value, Value> {
        let id = self.sess.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        if let Ok(mut w) = self.sess.waiting.lock() {
            w.insert(id, tx);
        }
        let m = json!({"jsonrpc":"2.0","id":id,"method":method,"params":params});
        let sender = if on_get_stream {
            self.sess.get_tx.lock().ok().and_then(|g| g.clone())
        } else {
            Some(self.tx.clone())
        };
        let Some(sender) = sender else {
            return Err(json!({"code": -32603, "message": "no GET stream open"}));
        };
        sender.send(&m).await;
        match tokio::time::timeout(Duration::from_secs(300), rx).await {
            Ok(Ok(v)) if v.get("error").is_none() => Ok(v),
            Ok(Ok(v)) => Err(v["error"].clone()),
            _ => Err(json!({"code": -32603, "message": "no answer"})),
        }
    }

    async fn elicit_name(&self, message: &str) -> Result<String, Value> {
        let schema =
            json!({"type":"object","properties":{"name":{"type":"string"}},"required":["name"]});
        let r = self
            .ask(
                "elicitation/create",
                json!({"mode":"form","message":message,"requestedSchema":schema}),
                false,
            )
            .await?;
        Ok(match r["action"].as_str() {
            Some("accept") => r["content"]["name"].as_str().unwrap_or("?").to_owned(),
            Some(other) => format!("<{other}>"),
            None => "<invalid>".to_owned(),
        })
    }

    async fn sample(&self, text: &str) -> Result<String, Value> {
        let p = json!({"messages":[{"role":"user","content":{"type":"text","text":format!("Summarize: {text}")}}],"maxTokens":100});
        let r = self.ask("sampling/createMessage", p, false).await?;
        Ok(r["content"]["text"].as_str().unwrap_or("").to_owned())
    }

    async fn roots(&self) -> Result<String, Value> {
        let r = self.ask("roots/list", json!({}), true).await?;
        let uris: Vec<&str> = r["roots"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|x| x["uri"].as_str())
            .collect();
        Ok(uris.join(", "))
    }
}

fn tools() -> Value {
    let obj = |props: Value| json!({"type":"object","properties":props});
    json!([
        {"name":"echo","description":"Echoes text","inputSchema":obj(json!({"text":{"type":"string"}})),"execution":{"taskSupport":"forbidden"}},
        {"name":"progress","description":"Reports progress","inputSchema":obj(json!({"steps":{"type":"integer"}}))},
        {"name":"ask_name","description":"Elicits a name","inputSchema":obj(json!({}))},
        {"name":"summarize","description":"Samples a summary","inputSchema":obj(json!({"text":{"type":"string"}}))},
        {"name":"list_roots","description":"Lists client roots (on the GET stream)","inputSchema":obj(json!({}))},
        {"name":"everything","description":"Elicit + sample + roots at once","inputSchema":obj(json!({}))},
        {"name":"twice","description":"Elicits twice in sequence","inputSchema":obj(json!({}))},
        {"name":"provision","description":"A slow job that asks for approval half way","inputSchema":obj(json!({"vm":{"type":"string"}}))},
    ])
}

fn text(t: String) -> Value {
    json!({"content":[{"type":"text","text":t}]})
}

async fn run_tool(c: &CallCtx) -> Result<Value, Value> {
    let name = c.params.get("name").and_then(Value::as_str).unwrap_or("");
    match name {
        "echo" => Ok(text(
            c.arg("text")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
        )),
        "progress" => {
            let steps = c.arg("steps").and_then(Value::as_u64).unwrap_or(3);
            for i in 1..=steps {
                c.progress(i, steps, "").await;
            }
            Ok(text(format!("done after {steps} steps")))
        }
        "ask_name" => Ok(text(format!(
            "Hello, {}!",
            c.elicit_name("What is your name?").await?
        ))),
        "summarize" => {
            let input = c.arg("text").and_then(Value::as_str).unwrap_or("");
            Ok(text(format!("Summary: {}", c.sample(input).await?)))
        }
        "list_roots" => Ok(text(format!("Roots: {}", c.roots().await?))),
        "everything" => {
            let (n, s, r) = tokio::join!(c.elicit_name("Name?"), c.sample("everything"), c.roots());
            Ok(text(format!("name={} sample={} roots={}", n?, s?, r?)))
        }
        "provision" => {
            let vm = c.arg("vm").and_then(Value::as_str).unwrap_or("vm-1");
            c.progress(1, 3, "reserving capacity").await;
            tokio::time::sleep(Duration::from_millis(200)).await;
            let who = c
                .elicit_name(&format!("Approve provisioning {vm}? Sign with your name"))
                .await?;
            c.progress(2, 3, "booting").await;
            tokio::time::sleep(Duration::from_millis(200)).await;
            Ok(text(format!("{vm} is up (approved by {who})")))
        }
        "twice" => {
            let a = c.elicit_name("First name?").await?;
            let b = c.elicit_name("Second name?").await?;
            Ok(text(format!("{a} and {b}")))
        }
        other => Err(json!({"code": -32602, "message": format!("Unknown tool: {other}")})),
    }
}

async fn prompt(c: &CallCtx) -> Result<Value, Value> {
    match c.params.get("name").and_then(Value::as_str) {
        Some("greeting") => {
            let name = c.elicit_name("Who should be greeted?").await?;
            Ok(
                json!({"messages":[{"role":"user","content":{"type":"text","text":format!("Please greet {name}.")}}]}),
            )
        }
        _ => Err(json!({"code": -32602, "message": "Unknown prompt"})),
    }
}

// `logging/setLevel`: a level of RFC 5424's names is taken (the demo logs nothing of its own
// yet, so it needs no keeping); another is -32602.
fn set_level(params: &Value) -> Result<Value, Value> {
    const LEVELS: [&str; 8] = [
        "debug",
        "info",
        "notice",
        "warning",
        "error",
        "critical",
        "alert",
        "emergency",
    ];
    match params.get("level").and_then(Value::as_str) {
        Some(level) if LEVELS.contains(&level) => Ok(json!({})),
        _ => Err(
            json!({"code": -32602, "message": "level must be one of debug, info, notice, warning, error, critical, alert, emergency"}),
        ),
    }
}

async fn read(c: &CallCtx) -> Result<Value, Value> {
    match c.params.get("uri").and_then(Value::as_str) {
        Some("demo://motd") => Ok(
            json!({"contents":[{"uri":"demo://motd","mimeType":"text/plain","text":"Have a nice day"}]}),
        ),
        Some(uri) if uri.starts_with("demo://echo/") => Ok(
            json!({"contents":[{"uri":uri,"mimeType":"text/plain","text":&uri["demo://echo/".len()..]}]}),
        ),
        Some("demo://secret") => {
            let name = c.elicit_name("Who is asking?").await?;
            Ok(
                json!({"contents":[{"uri":"demo://secret","mimeType":"text/plain","text":format!("secret for {name}")}]}),
            )
        }
        Some(uri) => Err(json!({"code": -32002, "message": format!("Resource not found: {uri}")})),
        None => Err(json!({"code": -32602, "message": "missing uri"})),
    }
}
