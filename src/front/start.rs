//! A fresh call: the actor's spec from the validated request and its principal, the first leg
//! opened, the actor spawned. The front starts one for a new request, and for a lost call
//! replayed from its token.

use std::sync::{Arc, OnceLock};

use std::time::Duration;

use tokio::sync::mpsc;

use super::validate::ModernRequest;
use crate::app::App;
use crate::auth::Principal;
use crate::call::{self, AdoptedTask, CallSpec, Leg, LegEvent};
use crate::config::TaskMode;
use crate::protocol::TASKS_EXTENSION;
use crate::state::replay::{Journal, Replayer};
use crate::tasks::Rerun;
use crate::trace_context::TraceContext;
use crate::upstream::Declared;

/// Starts the actor for `req`; it answers on the returned leg. `input_capable`: the call may
/// park; `replay_from`: the answers a lost call's token carried, and its first leg's span (what
/// the replay's retries link to).
pub(super) fn start_call(
    app: &Arc<App>,
    req: ModernRequest,
    who: Principal,
    (input_capable, replay_from): (bool, Option<(Replayer, Option<String>)>),
) -> mpsc::Receiver<LegEvent> {
    let (leg, rx) = open_leg(&req);
    let gated = req.method == "tools/call" && app.config.approval.rule_for(req.target()).is_some();
    let task_after = task_after(app, &req);
    // The upstream call is a client span of this request's; the upstream's parent is it.
    let upstream_span = TraceContext::client_span(&req.method, req.target());
    let trace = req.trace.for_span(&upstream_span);
    let spec = CallSpec {
        request_digest: OnceLock::new(),
        upstream_params: req.params.upstream(&trace),
        target: req.target().to_owned(),
        method: req.method,
        capabilities: req.capabilities,
        declared: req.declared,
        input_capable,
        principal: who.digest,
        credentials: who.credentials.and(trace.headers()),
        origin: replay_from.as_ref().and_then(|(_, origin)| origin.clone()),
        upstream_span,
        replay_from: replay_from.map(|(replayer, _)| replayer),
        gated,
        task_after,
    };
    call::spawn(Arc::clone(&app.calls), spec, leg);
    rx
}

/// Runs again, here, the call of a replay-safe task this instance adopted (its holder was
/// lost), on behalf of `who` (the task's own principal, whose request found it orphaned): from
/// the task's journal, as the task it is.
pub(super) fn start_adopted(app: &Arc<App>, rerun: Rerun, who: &Principal) {
    let call = rerun.call;
    let upstream_span = TraceContext::client_span(&call.method, &call.target);
    // Checked when the task was created; a declaration past today's bound declares nothing.
    let declared = Declared::of(&call.capabilities, app.config.pool.max_extensions_bytes)
        .unwrap_or_else(|_| Declared::nothing());
    let journal = Journal {
        answered: call.answered,
        pending: Vec::new(),
    };
    let spec = CallSpec {
        request_digest: OnceLock::new(),
        upstream_params: call.params.map(Box::<str>::from),
        target: call.target,
        method: call.method,
        capabilities: Arc::new(call.capabilities),
        declared,
        input_capable: true,
        principal: rerun.principal,
        credentials: who.credentials.clone(),
        origin: None,
        upstream_span,
        replay_from: Some(Replayer::new(journal, &serde_json::Map::new())),
        gated: false,
        task_after: None,
    };
    let adopted = AdoptedTask {
        guard: rerun.guard,
        mailbox: rerun.mailbox,
        keys_minted: rerun.keys_minted,
    };
    call::spawn_adopted(Arc::clone(&app.calls), spec, adopted);
}

/// How long `req` may run before it becomes a task: only a `tools/call` of a client that
/// declared the tasks extension, as `[tasks]` says for its tool.
pub(super) fn task_after(app: &App, req: &ModernRequest) -> Option<Duration> {
    let tasks = &app.config.tasks;
    if !tasks.enabled || req.method != "tools/call" || !declares_tasks(&req.capabilities) {
        return None;
    }
    match tasks.mode_for(req.target()) {
        TaskMode::Always => Some(Duration::ZERO),
        TaskMode::After => Some(tasks.after),
        TaskMode::Never => None,
    }
}

/// Whether declared client capabilities include the tasks extension.
pub(super) fn declares_tasks(capabilities: &serde_json::Value) -> bool {
    capabilities
        .get("extensions")
        .and_then(|e| e.get(TASKS_EXTENSION))
        .is_some_and(serde_json::Value::is_object)
}

/// A leg (one client exchange) for `req`: its id, progress token and log level.
pub(super) fn open_leg(req: &ModernRequest) -> (Leg, mpsc::Receiver<LegEvent>) {
    Leg::open(
        req.id.clone(),
        req.progress_token.clone(),
        req.log_level.clone(),
    )
}
