//! Sending the call upstream: leasing a session (abandoned if the client leaves meanwhile), the
//! request, and the wait for its response headers beside the GET stream and the client.

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt;

use super::{or_pending, Call, Leg, Upstream};
use crate::error::ProxyError;
use crate::upstream::{MessageStream, ResponseStream, Session, UpstreamError};

/// How the wait for a request's response headers ended.
#[expect(
    clippy::large_enum_variant,
    reason = "returned once per request and matched at once, never stored: a box would only add an allocation"
)]
enum BeforeHeaders {
    Arrived(Result<MessageStream, UpstreamError>),
    /// The upstream asked for input on the GET stream first (a JSON-mode upstream sends headers
    /// only when done).
    AskedFirst(Bytes),
    ClientLeft,
    /// The call is due to become a task: the event loop waits for the headers from now on.
    TaskDue,
}

impl Call {
    /// Sends the call upstream (again, after a -32042), on the leased session; a session the
    /// upstream forgot before seeing the request is replaced once.
    pub(super) async fn send_request(&mut self) -> Result<(), ProxyError> {
        for attempt in 0..2 {
            let Some(session) = self.leased_session().await? else {
                // The client left: its exchange goes with it.
                self.phase.finish();
                return Ok(());
            };
            // A tool the upstream runs only as a task: its result comes from `tasks/result`.
            let (id, headers) = match &self.legacy_task {
                Some(task) => session.start_request("tasks/result", Some(task.result_params.get())),
                None => {
                    session.start_request(&self.spec.method, self.spec.upstream_params.as_deref())
                }
            };
            let mut headers = Box::pin(headers);
            let stream = match self.wait_for_headers(&mut headers).await {
                BeforeHeaders::Arrived(Ok(stream)) => ResponseStream::Ready(stream),
                BeforeHeaders::Arrived(Err(UpstreamError::SessionGone)) if attempt == 0 => {
                    if let Some(mut lease) = self.lease.take() {
                        lease.poison();
                    }
                    continue;
                }
                BeforeHeaders::Arrived(Err(e)) => return Err(e.into()),
                // The upstream has the request; keep waiting for the headers in the event loop,
                // next to everything else.
                BeforeHeaders::AskedFirst(first) => {
                    self.early_inbox = Some(first);
                    ResponseStream::Pending(headers)
                }
                BeforeHeaders::ClientLeft | BeforeHeaders::TaskDue => {
                    ResponseStream::Pending(headers)
                }
            };
            self.upstream = Upstream::InFlight { id, stream };
            return Ok(());
        }
        Err(UpstreamError::SessionGone.into())
    }

    // The leased session, leasing one first if needed. `None`: the client left meanwhile (a
    // handshake it no longer waits for is abandoned, and its pool permit with it).
    async fn leased_session(&mut self) -> Result<Option<Arc<Session>>, ProxyError> {
        if let Some(lease) = &self.lease {
            return Ok(Some(Arc::clone(lease.session())));
        }
        let spec = &self.spec;
        let leasing = self
            .ctx
            .pool
            .lease(&spec.principal, &spec.declared, &spec.credentials);
        let lease = tokio::select! {
            lease = leasing => lease?,
            () = or_pending(self.phase.leg().map(Leg::closed)) => return Ok(None),
        };
        let session = Arc::clone(lease.session());
        session.set_inbox(Some(self.inbox_tx.clone()));
        self.lease = Some(lease);
        Ok(Some(session))
    }

    async fn wait_for_headers(
        &mut self,
        headers: &mut (impl Future<Output = Result<MessageStream, UpstreamError>> + Unpin),
    ) -> BeforeHeaders {
        let task_due = self.task_due();
        let Self {
            ctx,
            phase,
            inbox_rx,
            ..
        } = self;
        let timeout = ctx.pool.client().timeout();
        let leg = phase.leg();
        let task_due = task_due.map(tokio::time::sleep_until);
        tokio::select! {
            r = headers => BeforeHeaders::Arrived(r),
            () = tokio::time::sleep(timeout) => BeforeHeaders::Arrived(Err(UpstreamError::Timeout)),
            Some(b) = inbox_rx.next() => BeforeHeaders::AskedFirst(b),
            () = or_pending(leg.map(Leg::closed)) => BeforeHeaders::ClientLeft,
            () = or_pending(task_due) => BeforeHeaders::TaskDue,
        }
    }
}
