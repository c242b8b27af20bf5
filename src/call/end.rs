//! How a call ends, on every path: its final message (the result or error, rewritten for modern
//! clients, on the exchange or the task), failing on the open exchange (or, parked, retiring the
//! registry entry so that a late retry learns why), abandoning the upstream call (cancel answers,
//! then `notifications/cancelled`), expiry, shutdown, and turning away retries that raced the
//! end (or came when no retry was awaited). The phase ends through `Phase::finish`; the lease and
//! the registry guard are dropped with the actor.

use serde_json::value::RawValue;
use serde_json::Value;

use super::leg::{Leg, Outcome};
use super::{legacy_task, Call, Upstream};
use crate::config::CacheScope;
use crate::error::{Failure, ProxyError};
use crate::input::{self, InputKind};
use crate::jsonrpc::{self, ErrorObject, Message};
use crate::protocol::{INTERNAL_ERROR, LEGACY_URL_ELICITATION_REQUIRED};
use crate::rewrite::{self, RewriteCtx};
use crate::state::TokenError;
use crate::trace_context::TraceContext;
use crate::upstream::UpstreamError;

impl Call {
    /// The upstream's final message for the call: a round for -32042's URL elicitations, a
    /// task's status, held while parked, or the open exchange's answer.
    pub(super) async fn on_final(&mut self, msg: Message) {
        if self.run_as_legacy_task(&msg).await {
            return;
        }
        let msg = self.legacy_task_ending(msg).await;
        if let Some(elicitations) = self.url_elicitations_required(&msg) {
            let caps = &self.spec.capabilities;
            if let Some(required) = elicitations
                .iter()
                .find_map(|e| input::check_capability(InputKind::Elicitation, Some(e), caps).err())
            {
                // The upstream call is over (it answered with the error): nothing to cancel.
                // Boxed, as the park below: rare paths, kept out of every answer's future.
                return Box::pin(self.fail(ProxyError::MissingCapability { required })).await;
            }
            self.rounds.ask_url_elicitations(&elicitations);
            if self.rounds.has_pending() {
                // A task lists them; a call answers them as a round.
                self.list_inputs().await;
                // A round (parked already, the elicitations join the next one).
                return Box::pin(self.park()).await;
            }
        }
        // A task: its final status.
        let Some(msg) = self.finish_task(msg).await else {
            return;
        };
        // Parked: held for the next retry.
        let Some(msg) = self.phase.hold(msg) else {
            return;
        };
        if let Some(leg) = self.phase.finish() {
            let outcome = self.final_outcome(msg, &leg.id);
            leg.finish(outcome).await;
        }
    }

    // A legacy -32042 ("URL elicitation required") to an input-capable call: its elicitations.
    fn url_elicitations_required(&self, msg: &Message) -> Option<Vec<Value>> {
        let err = msg.error.as_ref()?;
        if err.code != LEGACY_URL_ELICITATION_REQUIRED || !self.spec.input_capable {
            return None;
        }
        err.data.as_ref()?.get("elicitations")?.as_array().cloned()
    }

    pub(super) fn final_outcome(&self, msg: Message, id: &RawValue) -> Outcome {
        // The response is written around the result as it is rewritten: one buffer, one copy.
        let raw = msg.result.as_ref().map_or(0, |r| r.get().len());
        let mut out = String::with_capacity(raw + id.get().len() + 200);
        out.push_str(r#"{"jsonrpc":"2.0","id":"#);
        out.push_str(id.get());
        out.push_str(r#","result":"#);
        match self.write_final(msg, &mut out) {
            Ok(()) => {
                out.push('}');
                Outcome::result(out.into_bytes(), self.upstream_status)
            }
            Err(err) => Outcome::error(&ProxyError::Rpc(err), id),
        }
    }

    /// The upstream's final message for a modern client: the result as JSON text, or the error.
    pub(super) fn final_result(&self, msg: Message) -> Result<String, jsonrpc::ErrorObject> {
        let mut out = String::new();
        self.write_final(msg, &mut out).map(|()| out)
    }

    // `final_result`, written at the end of `out`.
    fn write_final(&self, msg: Message, out: &mut String) -> Result<(), jsonrpc::ErrorObject> {
        if let Some(err) = msg.error {
            TraceContext::failed(&self.spec.upstream_span, err.code);
            return Err(rewrite::rewrite_error(err));
        }
        // The result of a retry that carried inputResponses must not be cached (caching26).
        // A replayed call's result came from answers too, given in an earlier life.
        let answered = self.rounds.had_rounds() || self.replay.is_rerun();
        let (ttl_ms, scope) = if answered {
            (0, CacheScope::Private)
        } else {
            (self.ctx.results.ttl_ms, self.ctx.results.scope)
        };
        let ctx = RewriteCtx {
            server_info: self.server_info(),
            ttl_ms,
            scope,
        };
        let raw = msg.result.as_ref().map_or("{}", |r| r.get());
        if self.legacy_task.is_some() {
            let raw = legacy_task::without_related_task(raw);
            rewrite::write_result(out, &self.spec.method, &raw, ctx);
        } else {
            rewrite::write_result(out, &self.spec.method, raw, ctx);
        }
        Ok(())
    }

    /// Ends the call with `err`: on the open exchange, or as a task's final status, or, parked
    /// (the upstream died meanwhile), by retiring the entry so that a late retry learns why. The
    /// session is not reused.
    pub(super) async fn fail(&mut self, err: ProxyError) {
        TraceContext::failed(&self.spec.upstream_span, err.to_error_object().code);
        // A task's failure is its final status; then, as for a parked call, there is no
        // exchange to carry it.
        self.fail_task(&err).await;
        if let Some(leg) = self.phase.finish() {
            let outcome = Outcome::error(&err, &leg.id);
            leg.finish(outcome).await;
            self.poison_lease();
            return;
        }
        // No exchange to carry it: this is the failure's one log line.
        let failure = Failure::of(&err);
        failure.log();
        if let Some(kind) = failure.upstream {
            self.ctx.metrics.upstream_failed(kind);
        }
        if let Some(p) = &mut self.parking {
            p.guard.retire(format!("the upstream call failed ({err})"));
        }
        self.poison_lease();
    }

    /// The parked call's deadline passed without a retry.
    pub(super) async fn expire(&mut self) {
        self.ctx.metrics.call_expired();
        tracing::debug!("a parked call expired");
        if let Some(p) = &mut self.parking {
            p.guard
                .retire("the call expired before the client answered");
        }
        self.cancel_upstream("the client did not answer in time")
            .await;
        self.phase.finish();
    }

    /// The upstream response of a running call may have been silent for
    /// `upstream.sse_idle_timeout`: if it was, cancel it upstream and answer 504.
    pub(super) async fn on_quiet_upstream(&mut self) {
        let Upstream::InFlight { stream, .. } = &self.upstream else {
            return;
        };
        let idle = self.ctx.sse_idle_timeout;
        if stream.last_activity().is_none_or(|t| t.elapsed() < idle) {
            return;
        }
        tracing::debug!(?idle, "the upstream response stayed silent too long");
        self.cancel_upstream("the upstream stayed silent too long")
            .await;
        self.fail(UpstreamError::Timeout.into()).await;
    }

    /// The proxy shuts down: cancel upstream, answer an open exchange 503.
    pub(super) async fn shut_down(&mut self) {
        if let Some(p) = &mut self.parking {
            p.guard.retire("the proxy shut down");
        }
        self.cancel_upstream("the proxy is shutting down").await;
        let why = if self.phase.is_detached() {
            "the proxy shut down before the task finished; call the tool again"
        } else {
            "the proxy is shutting down"
        };
        self.fail(ProxyError::Overloaded(why.into())).await;
    }

    /// Abandons the upstream call: pending server requests get a cancel answer, then the request
    /// in flight gets `notifications/cancelled`; the session is not reused.
    pub(super) async fn cancel_upstream(&mut self, reason: &str) {
        let Some(session) = self.session() else {
            return;
        };
        self.poison_lease();
        for (id, kind) in self.rounds.abandon() {
            let res = match input::cancel_answer(kind) {
                Some(a) => session.answer(&id, Ok(&crate::jsonrpc::text(&a))).await,
                None => {
                    let e = ErrorObject {
                        code: INTERNAL_ERROR,
                        message: reason.to_owned(),
                        data: None,
                    };
                    session.answer(&id, Err(&e)).await
                }
            };
            if let Err(e) = res {
                tracing::debug!(error = %e, "could not cancel a pending server request");
            }
        }
        if let Upstream::InFlight { id, .. } = std::mem::replace(&mut self.upstream, Upstream::Idle)
        {
            session.cancel(id, reason).await;
        }
        self.cancel_legacy_task(&session).await;
    }

    /// The call is over: a retry that claimed it but was not served yet (it raced the end) is
    /// told why, instead of finding its response channel closed.
    pub(super) async fn turn_away_queued_retries(&mut self) {
        let Some(park) = self.parking.as_mut() else {
            return;
        };
        park.guard.retire("the call ended");
        park.retries.close();
        let reason = park
            .guard
            .retired_because()
            .unwrap_or("the call ended")
            .to_owned();
        while let Ok(r) = park.retries.try_recv() {
            turn_away(r.leg, &reason).await;
        }
    }

    // The upstream call may still run: close the session instead of reusing it.
    fn poison_lease(&mut self) {
        if let Some(l) = self.lease.as_mut() {
            l.poison();
        }
    }
}

/// Answers a retry's exchange that found no parked call to take it: gone, and why.
pub(super) async fn turn_away(leg: Leg, reason: &str) {
    let err = ProxyError::from(TokenError::Gone(reason.to_owned()));
    let outcome = Outcome::error(&err, &leg.id);
    leg.finish(outcome).await;
}
