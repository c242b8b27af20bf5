//! `tasks/get`, `tasks/update` and `tasks/cancel` (the tasks extension): only for a request that
//! declares the extension (else -32021); answered from the task's record when this instance owns
//! it, forwarded to the owner (the instance its id names, one hop) when another does, and
//! -32602 `task_lost` when the owner cannot be reached (with a shared store: 503, retry later,
//! as the task is adopted once its holder's lease lapses). The task's actor hears answers and
//! cancellations through the record (`tasks`).

use std::sync::Arc;

use http::{HeaderMap, Response, StatusCode};
use serde_json::{json, Map, Value};

use super::start::{declares_tasks, start_adopted};
use super::validate::ModernRequest;
use crate::app::App;
use crate::auth::Principal;
use crate::body::Body;
use crate::cluster::{self, Inbound};
use crate::config;
use crate::edge;
use crate::error::ProxyError;
use crate::jsonrpc;
use crate::ops::metrics::ForwardKind;
use crate::protocol::TASKS_EXTENSION;
use crate::tasks::Route;
use crate::trace_context::TraceContext;

/// Who answered a `tasks/*` request: this instance, or the task's owner.
pub(super) enum Served {
    Here(Response<Body>),
    ByOwner(Response<Body>),
}

/// Serves a `tasks/*` request of `principal`; `inbound` is the request as it came, for a
/// forward to the task's owner.
pub(super) async fn serve(
    app: &Arc<App>,
    req: &ModernRequest,
    who: &Principal,
    inbound: Inbound<'_>,
) -> Result<Served, ProxyError> {
    let principal = who.digest.as_str();
    if !app.config.tasks.enabled {
        return Err(ProxyError::MethodNotFound(req.method.clone()));
    }
    if !declares_tasks(&req.capabilities) {
        return Err(ProxyError::MissingCapability {
            required: json!({ "extensions": { TASKS_EXTENSION: {} } }),
        });
    }
    let id = req.target();
    let store = &app.calls.tasks;
    if let Some(forwarded) = route(app, req, who, inbound).await? {
        return Ok(forwarded);
    }
    let result = match req.method.as_str() {
        "tasks/get" => {
            let mut task = store.get(id, principal).await?;
            task["resultType"] = Value::from("complete");
            task
        }
        "tasks/update" => {
            let answers = req
                .params
                .answers()
                .map_err(|why| ProxyError::InvalidParams(why.into()))?;
            let span = TraceContext::answers_span();
            let credentials = who.credentials.and(req.trace.for_span(&span).headers());
            store
                .update(id, principal, &answers, (&credentials, span))
                .await?;
            json!({ "resultType": "complete" })
        }
        _ => {
            store.cancel(id, principal).await?;
            json!({ "resultType": "complete" })
        }
    };
    let body = jsonrpc::response_bytes(&req.id, &jsonrpc::text(&result));
    Ok(Served::Here(edge::json(
        StatusCode::OK,
        HeaderMap::new(),
        body,
    )))
}

// Where the request is served: `None` here (a task adopted just now runs again first), or the
// holder's answer to it, forwarded.
async fn route(
    app: &Arc<App>,
    req: &ModernRequest,
    who: &Principal,
    inbound: Inbound<'_>,
) -> Result<Option<Served>, ProxyError> {
    let read = req.method == "tasks/get";
    let answers = (req.method == "tasks/update")
        .then(|| req.params.get::<Map<String, Value>>("inputResponses"))
        .flatten();
    let routed = app
        .calls
        .tasks
        .route(req.target(), (read, answers.as_ref()), &who.digest);
    match routed.await? {
        Route::Here => Ok(None),
        Route::Holder(holder) => match app.forward(&holder, inbound, ForwardKind::Task).await {
            Ok(resp) => Ok(Some(Served::ByOwner(resp))),
            // In a shared store the task outlives its holder: once the holder's lease lapses,
            // the next request adopts it. Until then the client must retry, not give it up.
            Err(reason) if !matches!(app.config.tasks.store, config::Store::Memory) => {
                Err(ProxyError::Overloaded(format!(
                    "the instance running this task cannot be reached ({}); retry later: \
                     another instance takes the task over once its lease lapses",
                    cluster::lost_because(reason)
                )))
            }
            Err(reason) => Err(ProxyError::TaskLost(cluster::lost_because(reason))),
        },
        Route::Rerun(rerun) => {
            start_adopted(app, *rerun, who);
            Ok(None)
        }
    }
}
