//! Retries: a request carrying a `requestState`. The token is verified before anything else;
//! then the answers go to the parked call here, the request goes to the instance that holds
//! the call (`cluster`), or — that instance gone and the call replay-safe — the call runs again
//! here from its token. Also the peers' probe ("which instance are you?").

use std::sync::Arc;

use http::{HeaderMap, Response, StatusCode};
use serde_json::{Map, Value};
use tokio::sync::mpsc;

use super::approval::{self, Taken};
use super::start::{open_leg, start_call, task_after};
use super::validate::ModernRequest;
use crate::app::App;
use crate::auth::Principal;
use crate::body::Body;
use crate::call::{LegEvent, Retry, RetrySender};
use crate::cluster::{self, Inbound};
use crate::edge::{self, Settled};
use crate::error::ProxyError;
use crate::ops::metrics::{self, ForwardKind, RequestTimer, TokenRejection};
use crate::state::replay::Replayer;
use crate::state::{request_digest, Claims, TokenError};
use crate::trace_context::TraceContext;
use opentelemetry::KeyValue;

/// Where a retry went: to a call here (its leg), to the owner (its answer), or answered at
/// once (an approval declined or asked again).
pub(super) enum Resumed {
    Here(mpsc::Receiver<LegEvent>),
    Forwarded(Response<Body>),
    Answered(Response<Body>),
}

/// A retry of `req` by `who`; `inbound` is the request as it came, for a forward.
pub(super) async fn retry(
    app: &Arc<App>,
    req: ModernRequest,
    who: Principal,
    inbound: Inbound<'_>,
) -> Result<Resumed, ProxyError> {
    let Some(token) = req.params.string("requestState") else {
        return Err(ProxyError::BadRetry("requestState must be a string".into()));
    };
    let digest = request_digest(&req.method, req.target(), &req.arguments());
    let claims = app
        .tokens
        .verify(&token, &who.digest, &digest, app.tokens.now())?;
    if let Some(origin) = &claims.origin {
        TraceContext::link(&tracing::Span::current(), origin);
    }
    let answers = req
        .params
        .answers()
        .map_err(|why| ProxyError::BadRetry(why.into()))?;
    let lost = if claims.issuer == app.tokens.issuer() {
        if claims.approval.is_some() {
            return match approval::answered(app, req, who, (&claims, &answers))? {
                Taken::Started(rx) => Ok(Resumed::Here(rx)),
                Taken::Answered(resp) => Ok(Resumed::Answered(resp)),
            };
        }
        match app.calls.parked.claim(&claims, &answers) {
            Ok(tx) => return resume(app, &req, &who, (tx, answers)).await,
            Err(e @ ProxyError::CallLost(_)) => e,
            Err(e) => return Err(e),
        }
    } else {
        let forwarded = app
            .forward(&claims.issuer, inbound, ForwardKind::Retry)
            .await;
        TraceContext::event(&tracing::Span::current(), "mrtr.forward", || {
            vec![
                KeyValue::new("mrtr.peer", claims.issuer.clone()),
                KeyValue::new("mrtr.forwarded", forwarded.is_ok()),
            ]
        });
        match forwarded {
            Ok(resp) => return Ok(Resumed::Forwarded(resp)),
            // The instance that asked is gone: ask again here, never take its approval.
            Err(_) if claims.approval.is_some() => return ask_again(app, &req, &who),
            Err(reason) => ProxyError::CallLost(cluster::lost_because(reason)),
        }
    };
    replay_here(app, req, who, (claims, &answers), lost)
}

// Hands a claimed retry to its parked call: a new leg, the answers and what goes upstream
// with them (the retry's credentials and trace context, under a client span of the delivery).
async fn resume(
    app: &App,
    req: &ModernRequest,
    who: &Principal,
    (call, answers): (RetrySender, Map<String, Value>),
) -> Result<Resumed, ProxyError> {
    let (leg, rx) = open_leg(req);
    let span = TraceContext::answers_span();
    let trace = req.trace.for_span(&span);
    let retry = Retry {
        answers,
        leg,
        credentials: who.credentials.and(trace.headers()),
        span,
        task_after: task_after(app, req),
    };
    call.send(retry)
        .map_err(|_| TokenError::Gone("the call ended".into()))?;
    TraceContext::event(&tracing::Span::current(), "mrtr.resume", Vec::new);
    Ok(Resumed::Here(rx))
}

/// Runs a lost call again on this instance's upstream, answering from its token what the user
/// already answered; `lost` is the error when the token carries no journal (not replay-safe).
/// Each token is replayed at most once per process: the ledger is in memory, so an instance
/// restarted (under the same id or not) may replay it once more, as another replica may.
fn replay_here(
    app: &Arc<App>,
    req: ModernRequest,
    who: Principal,
    (claims, answers): (Claims, &Map<String, Value>),
    lost: ProxyError,
) -> Result<Resumed, ProxyError> {
    let Some(journal) = claims.replay else {
        return Err(lost);
    };
    if app.is_draining() {
        return Err(ProxyError::Overloaded("the proxy is shutting down".into()));
    }
    if !app.replays.first(&claims.token_id) {
        return Err(TokenError::AlreadyUsed.into());
    }
    app.metrics.cluster.call_replayed();
    TraceContext::event(&tracing::Span::current(), "mrtr.replay", || {
        vec![
            KeyValue::new("mrtr.owner", claims.issuer.clone()),
            KeyValue::new("mrtr.round", i64::from(claims.round)),
        ]
    });
    tracing::info!(owner = %claims.issuer, round = claims.round, "running a lost call again from its token");
    let replayer = Replayer::new(journal, answers);
    let rx = start_call(app, req, who, (true, Some((replayer, claims.origin))));
    Ok(Resumed::Here(rx))
}

// An approval whose asking instance is gone: the person is asked again (the tool may have
// stopped being gated on this instance's policy, then the call simply starts).
fn ask_again(app: &Arc<App>, req: &ModernRequest, who: &Principal) -> Result<Resumed, ProxyError> {
    match approval::rule(app, req) {
        Some(rule) => approval::ask(app, req, who, rule).map(Resumed::Answered),
        None => Err(ProxyError::CallLost("the instance that asked is gone")),
    }
}

/// Answers a peer's probe with this instance's id, when the probe is signed by the key set.
pub(super) fn identify(app: &App, headers: &HeaderMap, timer: RequestTimer) -> Response<Body> {
    let signed = headers
        .get(cluster::PEER_HEADER)
        .is_some_and(|sig| app.peers.verify(sig, b"", true));
    if !signed {
        return edge::fail(timer, &ProxyError::Forbidden, None);
    }
    edge::settle(timer, Settled::with(metrics::Outcome::Complete));
    edge::json(StatusCode::OK, HeaderMap::new(), app.peers.identity())
}

/// Why a retry was refused, when it was its requestState or the answers beside it.
pub(super) fn rejection(e: &ProxyError) -> Option<TokenRejection> {
    let reason = match e {
        ProxyError::State(TokenError::Invalid) => TokenRejection::Invalid,
        ProxyError::State(TokenError::Expired) => TokenRejection::Expired,
        ProxyError::State(TokenError::WrongPrincipal) => TokenRejection::WrongPrincipal,
        ProxyError::State(TokenError::WrongRequest) => TokenRejection::WrongRequest,
        ProxyError::State(TokenError::AlreadyUsed) => TokenRejection::AlreadyUsed,
        ProxyError::State(TokenError::Gone(_)) => TokenRejection::Gone,
        ProxyError::State(TokenError::NotYetValid) => TokenRejection::NotYetValid,
        ProxyError::BadRetry(_) => TokenRejection::Malformed,
        _ => return None,
    };
    Some(reason)
}
