//! The MRTR transitions of the actor: a server request joins the round (or is refused for a
//! capability the request did not declare, or answered by default), the gathered round is parked
//! behind a fresh requestState, and a claimed retry delivers its answers upstream.

use std::sync::Arc;

use tokio::time::Instant;

use super::end::turn_away;
use super::leg::Outcome;
use super::registry::{Retry, RetrySender};
use super::rounds::Answered;
use super::{Call, Parking};
use crate::error::ProxyError;
use crate::input::{self, InputKind};
use crate::jsonrpc::{self, ErrorObject, Message};
use crate::ops::metrics::Limit;
use crate::protocol::{INTERNAL_ERROR, INVALID_PARAMS};
use crate::state::random_id;
use crate::trace_context::TraceContext;
use crate::upstream::{Credentials, Session, UpstreamError};
use opentelemetry::KeyValue;

/// Bytes of randomness in a parked call's handle.
const HANDLE_BYTES: usize = 16;

impl Call {
    /// A server request from the call's stream or the session's GET stream.
    pub(super) async fn on_server_request(&mut self, msg: Message) {
        let Some(session) = self.session() else {
            return;
        };
        let kind = InputKind::from_method(msg.method()).filter(|_| self.spec.input_capable);
        let Some(kind) = kind else {
            session.answer_default(&msg).await;
            return;
        };
        let params = msg.params_value().ok().filter(|p| !p.is_null());
        if let Err(required) =
            input::check_capability(kind, params.as_ref(), &self.spec.capabilities)
        {
            return self.refuse(&session, &msg, required).await;
        }
        let id = msg.id.as_ref().map(|i| i.get().to_owned());
        if let Some(dup) = id.as_deref().filter(|i| self.rounds.is_pending(i)) {
            // The first request with this id is the one the client will answer.
            tracing::debug!(id = dup, "ignoring a duplicate upstream request id");
            return;
        }
        if self
            .answered_from_journal(&session, &msg, (kind, params.as_ref()))
            .await
        {
            return;
        }
        if self.rounds.pending() >= self.ctx.max_input_requests {
            return refuse_excess(&session, &msg).await;
        }
        if self.rounds.has_pending() {
            // Asked before an earlier request was answered: this target asks together.
            self.ctx.gather.saw_together(self.spec.gather_key());
        }
        let journaled = self.journaled().await;
        self.rounds.ask(kind, id, params, journaled);
        if self.phase.is_detached() {
            // A task lists it at once: the client polls for it.
            return self.list_inputs().await;
        }
        // The first request of a round opens the gather (a window, or only what already came,
        // as learned for the target); while parked, requests simply join the next round.
        self.phase.gather(|| {
            let window = self.ctx.gather.window(self.spec.gather_key());
            window.map(|w| Instant::now() + w)
        });
    }

    // The request needs a capability the client did not declare: refuse it upstream, cancel the
    // call, and tell the client which capability (-32021).
    async fn refuse(&mut self, session: &Session, msg: &Message, required: serde_json::Value) {
        let why = "the client did not declare this capability";
        answer_error(session, msg, INVALID_PARAMS, why).await;
        self.cancel_upstream("the client lacks a required capability")
            .await;
        self.ctx
            .metrics
            .capability_rejected(input::missing_label(&required));
        self.fail(ProxyError::MissingCapability { required }).await;
    }

    /// Answers the open exchange with the pending requests as a round behind a fresh
    /// requestState; the call is then parked until a retry or the deadline. Without an open
    /// exchange (parked already) the requests wait for the next round.
    pub(super) async fn park(&mut self) {
        if self.phase.leg().is_none() {
            return;
        }
        let handle = match self.registered() {
            Ok(h) => h,
            Err(e) => {
                self.ctx.metrics.limit_hit(Limit::Parked);
                self.cancel_upstream("the proxy is at its parked-call limit")
                    .await;
                return self.fail(e).await;
            }
        };
        let journal = self.journal().await;
        if self.spec.origin.is_none() {
            // The first round is answered on the first leg.
            self.spec.origin = self
                .phase
                .leg()
                .and_then(|l| TraceContext::traceparent(&l.span));
        }
        let round = self.rounds.open();
        let tokens = &self.ctx.tokens;
        let spec = &self.spec;
        let mut claims = tokens.claims(
            &handle,
            &spec.principal,
            spec.request_digest(),
            round.number,
            tokens.now(),
        );
        claims.replay = journal;
        claims.origin.clone_from(&spec.origin);
        let token = match tokens.sign(&claims) {
            Ok(t) => t,
            Err(e) => return self.fail(ProxyError::Internal(e.to_string())).await,
        };
        if let Some(p) = &self.parking {
            p.guard.open_round(&claims.token_id, round.keys.clone());
        }
        let deadline = Instant::now() + tokens.ttl();
        let result = self.rounds.input_required(&token, self.server_info());
        tracing::debug!(round = round.number, keys = round.keys.len(), "parked call");
        self.ctx.metrics.round_sent(round.keys.len());
        // Open since the check above: nothing in between finishes the call.
        let Some(leg) = self.phase.park(deadline) else {
            return;
        };
        TraceContext::event(&leg.span, "mrtr.park", || {
            vec![
                KeyValue::new("mrtr.round", i64::from(round.number)),
                KeyValue::new("mrtr.input_requests", round.keys.len() as i64),
            ]
        });
        let body = jsonrpc::response_bytes(&leg.id, &result);
        leg.finish(Outcome::round(body, round.number)).await;
    }

    // The call's registry handle, registering it on its first round.
    fn registered(&mut self) -> Result<String, ProxyError> {
        if let Some(p) = &self.parking {
            return Ok(p.guard.handle().to_owned());
        }
        let (tx, retries) = RetrySender::channel();
        let spec = &self.spec;
        let held = spec.upstream_params.as_ref().map_or(0, |p| p.len());
        let guard = self.ctx.parked.register(
            random_id(HANDLE_BYTES),
            (&spec.principal, spec.request_digest()),
            held,
            tx,
        )?;
        let handle = guard.handle().to_owned();
        self.parking = Some(Parking { guard, retries });
        Ok(handle)
    }

    /// A retry whose token the front verified and the registry claimed: deliver its answers,
    /// then run on (every key answered) or ask again for the missing keys.
    pub(super) async fn on_retry(&mut self, retry: Box<Retry>) {
        let claimed = Instant::now();
        self.leg_opened = claimed;
        self.spec.task_after = retry.task_after;
        let held = match self.phase.resume(retry.leg) {
            Ok(held) => held,
            // Retries are read only while parked (see `next_event`).
            Err(leg) => return turn_away(leg, "the call was not waiting for a retry").await,
        };
        if let Some(msg) = held {
            if let Some(leg) = self.phase.finish() {
                let outcome = self.final_outcome(msg, &leg.id);
                leg.finish(outcome).await;
            }
            return;
        }
        let delivered = self
            .deliver_answers(retry.answers, &retry.credentials)
            .await;
        // The delivery's client span ends here.
        drop(retry.span);
        if let Err(e) = delivered {
            return self.fail(e).await;
        }
        self.ctx.metrics.resumed(claimed.elapsed());
        if self.rounds.has_pending() {
            // Keys still unanswered: ask again for just those, same parked call, fresh token.
            return self.park().await;
        }
        // Not when the client left while the call was sent again (the call is over).
        if self.phase.run() {
            if let Some(p) = &self.parking {
                p.guard.close_round();
            }
        }
    }

    /// The client's answers (a retry's, or a task's `tasks/update`): those of pending requests
    /// go upstream in order, and the call is sent again once the URL elicitations of a -32042
    /// are all answered. They go with the credentials of the request that brought them (a
    /// token refreshed since the first leg), as does all that follows.
    pub(super) async fn deliver_answers(
        &mut self,
        answers: serde_json::Map<String, serde_json::Value>,
        credentials: &Credentials,
    ) -> Result<(), ProxyError> {
        self.spec.credentials = credentials.clone();
        if let Some(session) = self.session() {
            session.renew_credentials(credentials);
        }
        let Answered {
            deliveries,
            reissue,
            journal,
        } = self.rounds.answer(answers);
        self.replay.delivered(journal);
        deliver(self.session(), deliveries).await?;
        if reissue {
            self.send_request().await?;
        }
        Ok(())
    }
}

// Sends the client's answers upstream, in order.
async fn deliver(
    session: Option<Arc<Session>>,
    deliveries: Vec<(String, serde_json::Value)>,
) -> Result<(), UpstreamError> {
    let Some(session) = session else {
        return Err(UpstreamError::Closed);
    };
    for (id, answer) in deliveries {
        session.answer(&id, Ok(&jsonrpc::text(&answer))).await?;
    }
    Ok(())
}

// Past `state.max_input_requests` pending at once, further server requests are answered
// with an error at once: the round, and what a TTL or shutdown would have to cancel, stay
// bounded.
async fn refuse_excess(session: &Session, msg: &Message) {
    let why = "too many input requests pending for this call";
    answer_error(session, msg, INTERNAL_ERROR, why).await;
}

// Answers the upstream's request `msg` with a JSON-RPC error.
async fn answer_error(session: &Session, msg: &Message, code: i64, message: &str) {
    let id = msg.id.as_ref().map(|i| i.get()).unwrap_or("null");
    let refusal = ErrorObject {
        code,
        message: message.to_owned(),
        data: None,
    };
    if let Err(e) = session.answer(id, Err(&refusal)).await {
        tracing::debug!(error = %e, "could not refuse an upstream request");
    }
}
