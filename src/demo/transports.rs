//! The demo server on the other legacy transports: stdio (`mrtr-proxy demo-upstream`, which
//! `demo --upstream-transport stdio` runs as the proxy's child) and HTTP+SSE (`GET /sse`, then
//! POSTs to `/messages?session=…`, everything answered on the one stream, like the 1.x SDKs).

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use super::session::{self, Out, Sess};
use super::upstream::{self, DemoUpstream, State};
use crate::body::{Body, ChannelBody};

/// Serves one session on stdin / stdout until stdin ends.
///
/// # Errors
/// Reading stdin failed.
pub async fn serve_stdio() -> std::io::Result<()> {
    let st = State::default();
    let (tx, mut rx) = mpsc::channel::<Bytes>(64);
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(line) = rx.recv().await {
            if stdout.write_all(&line).await.is_err() || stdout.flush().await.is_err() {
                break;
            }
        }
    });
    let out = Out::Lines(tx);
    let (_, sess) = upstream::new_session(&st);
    if let Ok(mut g) = sess.get_tx.lock() {
        *g = Some(out.clone());
    }
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await? {
        let Ok(msg) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        on_message(&st, &sess, msg, &out).await;
    }
    writer.abort();
    Ok(())
}

/// Starts the HTTP+SSE flavour on `127.0.0.1:0`; its [`DemoUpstream::url`] is the SSE URL.
///
/// # Errors
/// If binding fails.
pub async fn start_sse() -> std::io::Result<DemoUpstream> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let state = Arc::new(State::default());
    let task = upstream::serve(listener, Arc::clone(&state), handle_sse);
    Ok(DemoUpstream::assemble(addr, "/sse", state, task))
}

// A message of the one-stream transports: `initialize` is answered on the stream, the rest is
// what a Streamable HTTP session does with it.
async fn on_message(st: &State, sess: &Arc<Sess>, msg: Value, out: &Out) {
    if let Ok(mut o) = st.observed.lock() {
        o.posted.push(msg.clone());
    }
    if msg["method"] == "initialize" {
        upstream::observe_initialize(st, &msg);
        out.send(&json!({"jsonrpc":"2.0","id":msg["id"],"result":session::init_result()}))
            .await;
        return;
    }
    session::dispatch(Arc::clone(sess), msg, out.clone());
}

async fn handle_sse(st: Arc<State>, req: Request<Incoming>) -> Response<Body> {
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/sse") => {
            let (tx, body) = ChannelBody::channel(64);
            let (id, sess) = upstream::new_session(&st);
            let endpoint = format!("event: endpoint\r\ndata: /messages?session={id}\r\n\r\n");
            let _ = tx.send(Bytes::from(endpoint)).await;
            if let Ok(mut g) = sess.get_tx.lock() {
                *g = Some(Out::Sse(tx));
            }
            upstream::sse_response(body)
        }
        (&Method::POST, "/messages") => {
            let id = req
                .uri()
                .query()
                .and_then(|q| q.strip_prefix("session="))
                .map(str::to_owned);
            let sess = id.and_then(|id| st.sessions.lock().ok()?.get(&id).cloned());
            let Some(sess) = sess else {
                return upstream::status(StatusCode::NOT_FOUND);
            };
            let Ok(bytes) = req.into_body().collect().await.map(|c| c.to_bytes()) else {
                return upstream::status(StatusCode::BAD_REQUEST);
            };
            let Ok(msg) = serde_json::from_slice::<Value>(&bytes) else {
                return upstream::status(StatusCode::BAD_REQUEST);
            };
            let out = sess.get_tx.lock().ok().and_then(|g| g.clone());
            if let Some(out) = out {
                on_message(&st, &sess, msg, &out).await;
            }
            upstream::status(StatusCode::ACCEPTED)
        }
        // What Python's SSE server answers a POSTed initialize: how `auto` finds it.
        (&Method::POST, "/sse") => upstream::status(StatusCode::METHOD_NOT_ALLOWED),
        _ => upstream::status(StatusCode::NOT_FOUND),
    }
}
