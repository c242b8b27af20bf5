//! The approval gate: a `tools/call` of a tool `[approval.tools]` names is answered, before the
//! upstream sees anything, with an `input_required` round of one form elicitation (the policy's
//! message, a required `approve` boolean, the policy's extra fields) behind a requestState bound
//! like any other (principal, tool, canonical arguments) and to the policy's version. Its retry
//! is taken once, by the process that asked (a peer forwards it there; that instance gone, or
//! restarted under the same id, the person is asked again): approved, the call starts as any
//! other; declined, it ends as an error result the upstream never saw. Legacy clients are asked
//! inline on their call's stream (`legacy`); the form itself is `form`.

use std::sync::Arc;

use http::{HeaderMap, Response, StatusCode};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use super::start::start_call;
use super::validate::ModernRequest;
use crate::app::App;
use crate::auth::Principal;
use crate::body::Body;
use crate::call::LegEvent;
use crate::config::ApprovalRule;
use crate::edge;
use crate::error::ProxyError;
use crate::input::{self, InputKind};
use crate::jsonrpc;
use crate::ops::metrics::Decision;
use crate::state::{random_id, request_digest, Claims, TokenError};

mod form;
mod legacy;

use form::{audit, form, verdict, Verdict, APPROVAL_KEY};
pub(super) use legacy::{
    asked, decided, forget_session, observe_initialize, on_mcp, refusal, Question,
};

/// Bytes of randomness in an approval token's handle (it names no parked call).
const HANDLE_BYTES: usize = 16;

/// What became of an approval's retry: the call started (its leg), or an answer now (declined,
/// or asked again).
pub(super) enum Taken {
    Started(mpsc::Receiver<LegEvent>),
    Answered(Response<Body>),
}

/// What `answer` (the `inputResponses["approval"]` of a retry, or the `result` of a legacy
/// client's response) decides about a call gated by `rule`: `Ok(None)` unanswered,
/// `Ok(Some(true))` approved, `Ok(Some(false))` declined; `Err` the error object (JSON text) a
/// malformed answer gets. Pure: what the fuzz targets drive.
pub(crate) fn verdict_of(
    rule: &ApprovalRule,
    answer: Option<&Value>,
) -> Result<Option<bool>, String> {
    match verdict(rule, answer) {
        Ok(Verdict::Unanswered) => Ok(None),
        Ok(Verdict::Approved) => Ok(Some(true)),
        Ok(Verdict::Declined) => Ok(Some(false)),
        Err(e) => Err(jsonrpc::text(&json!(e.to_error_object()))),
    }
}

/// The rule gating `req`, when it calls a gated tool.
pub(super) fn rule<'a>(app: &'a App, req: &ModernRequest) -> Option<&'a ApprovalRule> {
    (req.method == "tools/call")
        .then(|| app.config.approval.rule_for(req.target()))
        .flatten()
}

/// Asks the person: an `input_required` round, or -32021 when the client declared no form
/// elicitation (it cannot ask anyone).
///
/// # Errors
/// [`ProxyError::MissingCapability`]; [`ProxyError::Internal`] if the token cannot be signed.
pub(super) fn ask(
    app: &App,
    req: &ModernRequest,
    who: &Principal,
    rule: &ApprovalRule,
) -> Result<Response<Body>, ProxyError> {
    let arguments = req.arguments();
    if let Err(required) = input::check_capability(InputKind::Elicitation, None, &req.capabilities)
    {
        audit(
            app,
            (&who.digest, req.target(), &arguments),
            rule,
            Decision::Unaskable,
        );
        return Err(ProxyError::MissingCapability { required });
    }
    let tokens = &app.tokens;
    let digest = request_digest(&req.method, req.target(), &arguments);
    let handle = random_id(HANDLE_BYTES);
    let mut claims = tokens.claims(&handle, &who.digest, &digest, 1, tokens.now());
    claims.approval = Some(rule.version.clone());
    let token = tokens
        .sign(&claims)
        .map_err(|e| ProxyError::Internal(e.to_string()))?;
    let request = json!({"method": "elicitation/create", "params": form(rule, &arguments)});
    let result = json!({
        "resultType": "input_required",
        "inputRequests": {APPROVAL_KEY: request},
        "requestState": token,
    });
    audit(
        app,
        (&who.digest, req.target(), &arguments),
        rule,
        Decision::Asked,
    );
    let body = jsonrpc::response_bytes(&req.id, &jsonrpc::text(&result));
    Ok(edge::json(StatusCode::OK, HeaderMap::new(), body))
}

/// The retry of an approval this instance asked for: approved, the call starts; declined, an
/// error result; unanswered, asked under another policy, or asked before this process started
/// (an instance restarted under the same id), the person is asked again. The token is spent
/// here once, after its answer was found well-formed: the ledger is this process's, so only a
/// token this process signed is ever taken.
///
/// # Errors
/// [`ProxyError::BadRetry`] for a malformed answer (the token stays unspent);
/// [`TokenError::AlreadyUsed`] for a second retry with the same token.
pub(super) fn answered(
    app: &Arc<App>,
    req: ModernRequest,
    who: Principal,
    (claims, answers): (&Claims, &Map<String, Value>),
) -> Result<Taken, ProxyError> {
    if app.is_draining() {
        // Checked before the token is spent: the client may take it to another replica.
        return Err(ProxyError::Overloaded("the proxy is shutting down".into()));
    }
    let Some(rule) = rule(app, &req) else {
        // Not gated (any more): the approval is not needed.
        return Ok(Taken::Started(start_call(app, req, who, (true, None))));
    };
    if claims.approval.as_deref() != Some(rule.version.as_str()) {
        return ask(app, &req, &who, rule).map(Taken::Answered);
    }
    if !app.tokens.signed_since_start(claims) {
        // Asked by an earlier process under this instance id (a restart with a fixed
        // `state.instance_id`): whether that process took it died with its ledger.
        tracing::info!(
            tool = req.target(),
            "an approval asked before this instance restarted: asking again"
        );
        return ask(app, &req, &who, rule).map(Taken::Answered);
    }
    let verdict = verdict(rule, answers.get(APPROVAL_KEY))?;
    if !app.approvals.first(&claims.token_id) {
        return Err(TokenError::AlreadyUsed.into());
    }
    match verdict {
        Verdict::Unanswered => ask(app, &req, &who, rule).map(Taken::Answered),
        Verdict::Declined => {
            audit(
                app,
                (&who.digest, req.target(), &req.arguments()),
                rule,
                Decision::Declined,
            );
            let result = json!({
                "resultType": "complete",
                "content": [{"type": "text", "text": rule.on_decline}],
                "isError": true,
            });
            let body = jsonrpc::response_bytes(&req.id, &jsonrpc::text(&result));
            let resp = edge::json(StatusCode::OK, HeaderMap::new(), body);
            Ok(Taken::Answered(resp))
        }
        Verdict::Approved => {
            audit(
                app,
                (&who.digest, req.target(), &req.arguments()),
                rule,
                Decision::Approved,
            );
            Ok(Taken::Started(start_call(app, req, who, (true, None))))
        }
    }
}
