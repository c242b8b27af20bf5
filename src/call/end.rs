//! How a call ends, on every path: failing on the current leg (or retiring a parked entry),
//! abandoning the upstream call (cancel answers, then `notifications/cancelled`), shutting down,
//! and turning away retries that raced the end. The lease and the registry guard are dropped with
//! the actor.

use std::sync::Arc;

use super::{Call, LegEvent, Outcome, Step};
use crate::error::ProxyError;
use crate::input;
use crate::jsonrpc::{self, ErrorObject};
use crate::state_token::TokenError;

impl Call {
    /// The call is over: a retry that claimed it but was not served yet (it raced the end) is
    /// told why, instead of finding its response channel closed.
    pub(super) async fn turn_away_queued_retries(&mut self) {
        let Some(park) = self.park.as_mut() else {
            return;
        };
        park.guard.retire("the call ended");
        park.commands.close();
        let reason = park
            .guard
            .retired_because()
            .unwrap_or("the call ended")
            .to_owned();
        while let Ok(r) = park.commands.try_recv() {
            let err = ProxyError::from(TokenError::Gone(reason.clone()));
            let _ = r
                .leg
                .tx
                .send(LegEvent::Done(Outcome::error(&err, &r.leg.id)))
                .await;
        }
    }

    pub(super) async fn shut_down(&mut self) -> Step {
        if let Some(p) = &mut self.park {
            p.guard.retire("the proxy shut down");
        }
        self.cancel_upstream("the proxy is shutting down").await;
        self.fail(ProxyError::Overloaded("the proxy is shutting down".into()))
            .await
    }

    /// Ends the call with `err` on the current leg, or, parked (the upstream died meanwhile),
    /// retires the entry so that a late retry learns why. The session is not reused.
    pub(super) async fn fail(&mut self, err: ProxyError) -> Step {
        match self.leg.take() {
            Some(leg) => {
                let _ = leg
                    .tx
                    .send(LegEvent::Done(Outcome::error(&err, &leg.id)))
                    .await;
            }
            None => {
                if let Some(p) = &mut self.park {
                    p.guard.retire(format!("the upstream call failed ({err})"));
                }
            }
        }
        if let Some(l) = self.lease.as_mut() {
            l.poison();
        }
        Step::Stop
    }

    /// Abandons the upstream call: pending server requests get a cancel answer, then
    /// `notifications/cancelled`; the session is not reused.
    pub(super) async fn cancel_upstream(&mut self, reason: &str) {
        let Some(lease) = self.lease.as_mut() else {
            return;
        };
        lease.poison();
        let session = Arc::clone(lease.session());
        for p in std::mem::take(&mut self.pending) {
            let Some(id) = p.upstream_id else { continue };
            let res = match input::cancel_answer(p.kind) {
                Some(a) => session.answer(&id, Ok(&a.to_string())).await,
                None => {
                    let e = ErrorObject {
                        code: jsonrpc::INTERNAL_ERROR,
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
        if self.stream.is_some() || self.upstream_id != 0 {
            session.cancel(self.upstream_id, reason).await;
        }
        self.stream = None;
    }
}
