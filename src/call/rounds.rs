//! Rounds: turning upstream server requests into `input_required` rounds (capability gating,
//! key minting, parking with a fresh token) and resuming a parked call with the client's answers.

use std::sync::Arc;

use bytes::Bytes;
use http::StatusCode;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{Call, LegEvent, Outcome, Step};
use crate::error::ProxyError;
use crate::input::{self, InputKind};
use crate::jsonrpc::{self, ErrorObject, Message};
use crate::metrics::Metrics;
use crate::parked::{ParkGuard, Resume};
use crate::state_token::random_id;

/// A server request waiting for the client's answer.
#[derive(Debug)]
pub(super) struct Pending {
    pub(super) key: String,
    pub(super) kind: InputKind,
    /// Raw JSON id of the upstream request; `None` for a synthetic request made from -32042.
    pub(super) upstream_id: Option<String>,
    pub(super) embedded: Value,
    /// URL-mode `elicitationId`: removed from what the client sees (2026-07-28 has none), kept
    /// here to recognise the upstream's `notifications/elicitation/complete`.
    pub(super) elicitation_id: Option<String>,
}

pub(super) struct Parking {
    pub(super) guard: ParkGuard,
    pub(super) commands: mpsc::Receiver<Resume>,
    pub(super) deadline: Instant,
    pub(super) round: u32,
}

impl Call {
    pub(super) async fn on_server_request(&mut self, msg: Message) -> Step {
        let Some(session) = self.lease.as_ref().map(|l| Arc::clone(l.session())) else {
            return Step::Continue;
        };
        let method = msg.method().to_owned();
        let kind = InputKind::from_method(&method);
        let Some(kind) = kind.filter(|_| self.spec.input_capable) else {
            session.answer_default(&msg).await;
            return Step::Continue;
        };
        let params = msg.params_value().ok().filter(|p| !p.is_null());
        if let Err(required) =
            input::check_capability(kind, params.as_ref(), &self.spec.capabilities)
        {
            let id = msg
                .id
                .as_ref()
                .map(|i| i.get().to_owned())
                .unwrap_or_default();
            let refusal = ErrorObject {
                code: jsonrpc::INVALID_PARAMS,
                message: "the client did not declare this capability".into(),
                data: None,
            };
            let _ = session.answer(&id, Err(&refusal)).await;
            self.cancel_upstream("the client lacks a required capability")
                .await;
            return self.fail(ProxyError::MissingCapability { required }).await;
        }
        let id = msg.id.as_ref().map(|i| i.get().to_owned());
        self.add_pending(kind, id, params.as_ref());
        if self.leg.is_some() && self.gather_until.is_none() {
            self.gather_until = Some(Instant::now() + self.app.config.gather_window);
        }
        Step::Continue
    }

    pub(super) fn add_pending(
        &mut self,
        kind: InputKind,
        upstream_id: Option<String>,
        params: Option<&Value>,
    ) {
        let (embedded, elicitation_id) = input::to_embedded(kind, params);
        self.key_counter += 1;
        let key = format!("{}-{}", kind.key_prefix(), self.key_counter);
        self.pending.push(Pending {
            key,
            kind,
            upstream_id,
            embedded,
            elicitation_id,
        });
    }

    pub(super) async fn park_round(&mut self) -> Step {
        let Some(leg) = self.leg.take() else {
            return Step::Continue;
        };
        if self.pending.is_empty() {
            self.leg = Some(leg);
            return Step::Continue;
        }
        if self.park.is_none() {
            let (tx, commands) = mpsc::channel(1);
            let handle = random_id(16);
            match self.app.parked.register(
                handle,
                &self.spec.principal,
                &self.spec.request_digest,
                tx,
            ) {
                Ok(guard) => {
                    self.park = Some(Parking {
                        guard,
                        commands,
                        deadline: Instant::now(),
                        round: 0,
                    })
                }
                Err(e) => {
                    self.leg = Some(leg);
                    self.cancel_upstream("the proxy is at its parked-call limit")
                        .await;
                    return self.fail(e).await;
                }
            }
        }
        let Some(park) = self.park.as_mut() else {
            return Step::Stop;
        };
        park.round += 1;
        let tokens = &self.app.tokens;
        let claims = tokens.claims(
            park.guard.handle(),
            &self.spec.principal,
            &self.spec.request_digest,
            park.round,
            tokens.now(),
        );
        let token = match tokens.sign(&claims) {
            Ok(t) => t,
            Err(e) => {
                self.leg = Some(leg);
                return self.fail(ProxyError::Internal(e.to_string())).await;
            }
        };
        park.guard.open_round(
            &claims.jti,
            self.pending
                .iter()
                .map(|p| (p.key.clone(), p.kind))
                .collect(),
        );
        park.deadline = Instant::now() + tokens.ttl();
        let requests: Map<String, Value> = self
            .pending
            .iter()
            .map(|p| (p.key.clone(), p.embedded.clone()))
            .collect();
        let mut result = json!({"resultType": "input_required", "inputRequests": requests, "requestState": token});
        // Every result SHOULD name the server in `_meta`, interim ones too.
        if let Some(info) = self
            .lease
            .as_ref()
            .and_then(|l| l.session().init_result().get("serverInfo"))
        {
            result["_meta"] = json!({ "io.modelcontextprotocol/serverInfo": info });
        }
        let body = jsonrpc::response_bytes(&leg.id, &result.to_string());
        tracing::debug!(round = park.round, keys = self.pending.len(), "parked call");
        Metrics::inc(&self.app.metrics.rounds);
        self.app.metrics.input_requests.fetch_add(
            self.pending.len() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        let _ = leg
            .tx
            .send(LegEvent::Done(Outcome {
                status: StatusCode::OK,
                body: Bytes::from(body),
                headers: http::HeaderMap::new(),
            }))
            .await;
        Step::Continue
    }

    pub(super) async fn resume(&mut self, r: Resume) -> Step {
        self.leg = Some(r.leg);
        if let Some(msg) = self.held_final.take() {
            let Some(leg) = self.leg.take() else {
                return Step::Stop;
            };
            let out = self.final_outcome(msg, &leg.id);
            let _ = leg.tx.send(LegEvent::Done(out)).await;
            return Step::Stop;
        }
        let Some(session) = self.lease.as_ref().map(|l| Arc::clone(l.session())) else {
            return Step::Stop;
        };
        let mut still = Vec::new();
        for p in std::mem::take(&mut self.pending) {
            let Some(answer) = r.answers.get(&p.key) else {
                still.push(p);
                continue;
            };
            if let Some(id) = &p.upstream_id {
                if let Err(e) = session.answer(id, Ok(&answer.to_string())).await {
                    self.pending = still;
                    return self.fail(e.into()).await;
                }
            }
        }
        self.pending = still;
        if self.reissue && self.pending.iter().all(|p| p.upstream_id.is_some()) {
            self.reissue = false;
            if let Err(e) = self.send_upstream_request().await {
                return self.fail(e).await;
            }
        }
        if self.pending.is_empty() {
            if let Some(p) = &self.park {
                p.guard.close_round();
            }
            return Step::Continue;
        }
        // Keys still unanswered: ask again for just those, same parked call, fresh token.
        self.park_round().await
    }
}
