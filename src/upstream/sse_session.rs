//! An HTTP+SSE upstream (the transport of 2024-11-05, still served by both 1.x SDKs): a session is
//! one open `GET` of the SSE URL, whose first event (`endpoint`) names where to POST messages;
//! every answer and server request then arrives on that one stream, and the POSTs get 202.
//!
//! The endpoint is treated as opaque, resolved against the SSE URL, and refused when it names
//! another origin (the proxy sends the principal's credentials there). The session dies with its
//! GET stream.

use std::sync::{Arc, Weak};

use bytes::Bytes;
use http::{header, Method, Request, Uri};
use http_body_util::BodyExt;

use super::client::{UpstreamClient, UpstreamError};
use super::credentials::LiveCredentials;
use super::link::{Link, Sink, SinkFuture};
use crate::body;
use crate::sse::{Event, SseDecoder};

/// Where an HTTP+SSE session's messages are POSTed.
#[derive(Debug)]
pub(crate) struct SseSink {
    client: UpstreamClient,
    endpoint: Uri,
    credentials: Arc<LiveCredentials>,
}

impl Sink for SseSink {
    fn send(&self, message: Vec<u8>) -> SinkFuture<'_, Result<(), UpstreamError>> {
        Box::pin(self.post(message))
    }

    // Dropping the link drops the GET stream, which ends the session upstream.
    fn stop(&self) -> SinkFuture<'_, ()> {
        Box::pin(async {})
    }
}

impl SseSink {
    // POSTs one message to the session's endpoint; the answer (202, no body) is drained.
    async fn post(&self, message: Vec<u8>) -> Result<(), UpstreamError> {
        let req = Request::builder()
            .method(Method::POST)
            .uri(self.endpoint.clone())
            .header(header::CONTENT_TYPE, "application/json");
        let req = self
            .credentials
            .current()
            .apply(req)
            .body(body::full(message))
            .map_err(|e| UpstreamError::Protocol(e.to_string()))?;
        let resp = self.client.send(req).await?;
        let outcome = if resp.status().is_success() {
            Ok(())
        } else if resp.status() == http::StatusCode::NOT_FOUND {
            Err(UpstreamError::SessionGone)
        } else {
            Err(UpstreamError::from_status(&resp))
        };
        let body = http_body_util::Limited::new(resp.into_body(), 64 * 1024).collect();
        let _ = tokio::time::timeout(self.client.timeout(), body).await;
        outcome
    }
}

/// Opens an HTTP+SSE session: GETs the SSE URL and waits (within the upstream timeout) for its
/// `endpoint` event.
///
/// # Errors
/// The status of a refused GET; [`UpstreamError::Protocol`] for a stream that is not SSE, ends
/// before its endpoint, or names an endpoint on another origin.
pub(crate) async fn open(
    client: &UpstreamClient,
    credentials: Arc<LiveCredentials>,
) -> Result<Arc<Link>, UpstreamError> {
    let req = Request::builder()
        .method(Method::GET)
        .uri(client.uri().clone())
        .header(header::ACCEPT, "text/event-stream");
    let req = credentials
        .current()
        .apply(req)
        .body(body::empty())
        .map_err(|e| UpstreamError::Protocol(e.to_string()))?;
    let resp = client.send(req).await?;
    if !resp.status().is_success() {
        return Err(UpstreamError::from_status(&resp));
    }
    let is_sse = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if !is_sse {
        return Err(UpstreamError::Protocol(
            "the SSE URL did not answer with an event stream".into(),
        ));
    }
    let mut reader = EventReader {
        body: resp.into_body(),
        decoder: SseDecoder::new(client.max_event_bytes()),
        queue: Default::default(),
    };
    let endpoint = tokio::time::timeout(client.timeout(), reader.endpoint())
        .await
        .map_err(|_| UpstreamError::Timeout)??;
    let endpoint = resolve_endpoint(client.uri(), &endpoint)?;
    let link = Link::new(Box::new(SseSink {
        client: client.clone(),
        endpoint,
        credentials,
    }));
    link.track(tokio::spawn(read_events(Arc::downgrade(&link), reader)));
    Ok(link)
}

struct EventReader {
    body: super::client::UpstreamBody,
    decoder: SseDecoder,
    queue: std::collections::VecDeque<Event>,
}

impl EventReader {
    // The next event; `None` at the end of the stream (or on an error, logged).
    async fn next(&mut self, link: Option<&Link>) -> Option<Event> {
        loop {
            if let Some(ev) = self.queue.pop_front() {
                return Some(ev);
            }
            let frame = match self.body.frame().await? {
                Ok(f) => f,
                Err(e) => {
                    tracing::debug!(error = %e, "the upstream SSE stream broke");
                    return None;
                }
            };
            if let Some(link) = link {
                link.touch();
            }
            let Ok(data) = frame.into_data() else {
                continue;
            };
            match self.decoder.feed(&data) {
                Ok(events) => self.queue.extend(events),
                Err(e) => {
                    tracing::warn!(error = %e, "closing an upstream SSE session");
                    return None;
                }
            }
        }
    }

    async fn endpoint(&mut self) -> Result<String, UpstreamError> {
        while let Some(ev) = self.next(None).await {
            if ev.event.as_deref() == Some("endpoint") {
                return Ok(ev.data);
            }
        }
        Err(UpstreamError::Protocol(
            "the SSE stream ended before its endpoint event".into(),
        ))
    }
}

// Every `message` event (or one with no type) is a JSON-RPC message; the session ends with
// the stream.
async fn read_events(link: Weak<Link>, mut reader: EventReader) {
    loop {
        let Some(l) = link.upgrade() else { return };
        let Some(ev) = reader.next(Some(&l)).await else {
            break;
        };
        if ev.event.as_deref().is_none_or(|e| e == "message") {
            l.dispatch(Bytes::from(ev.data)).await;
        }
    }
    tracing::debug!("the upstream SSE stream ended; its session is gone");
    if let Some(l) = link.upgrade() {
        l.on_closed();
    }
}

/// Resolves the `endpoint` event's URL against the SSE URL; it must stay on the same origin.
///
/// # Errors
/// [`UpstreamError::Protocol`] for another origin or an unusable reference.
pub(crate) fn resolve_endpoint(base: &Uri, endpoint: &str) -> Result<Uri, UpstreamError> {
    let endpoint = endpoint.trim();
    let bad = |why: &str| UpstreamError::Protocol(format!("SSE endpoint `{endpoint}`: {why}"));
    let scheme = base.scheme_str().unwrap_or("http");
    let authority = base.authority().map(|a| a.as_str()).unwrap_or_default();
    let uri: Uri = if endpoint.contains("://") || endpoint.starts_with("//") {
        let u: Uri = endpoint.parse().map_err(|_| bad("not a URL"))?;
        let same = u.scheme_str().is_none_or(|s| s == scheme)
            && u.authority().map(|a| a.as_str()) == Some(authority);
        if !same {
            return Err(bad("on another origin than the SSE URL"));
        }
        format!("{scheme}://{authority}{}", path_and_query(&u))
            .parse()
            .map_err(|_| bad("not a URL"))?
    } else if endpoint.starts_with('/') {
        format!("{scheme}://{authority}{endpoint}")
            .parse()
            .map_err(|_| bad("not a URL"))?
    } else {
        let dir = base.path().rsplit_once('/').map_or("", |(d, _)| d);
        format!("{scheme}://{authority}{dir}/{endpoint}")
            .parse()
            .map_err(|_| bad("not a URL"))?
    };
    Ok(uri)
}

fn path_and_query(u: &Uri) -> &str {
    u.path_and_query().map_or("/", |p| p.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_resolve_on_the_same_origin_only() {
        let base: Uri = "http://127.0.0.1:8000/sse".parse().unwrap();
        let r = |e| resolve_endpoint(&base, e).map(|u| u.to_string());
        assert_eq!(
            r("/messages/?session_id=ab").unwrap(),
            "http://127.0.0.1:8000/messages/?session_id=ab"
        );
        assert_eq!(
            r("messages?sessionId=1").unwrap(),
            "http://127.0.0.1:8000/messages?sessionId=1"
        );
        assert_eq!(
            r("http://127.0.0.1:8000/m?x=1").unwrap(),
            "http://127.0.0.1:8000/m?x=1"
        );
        assert!(r("http://evil.example:8000/m").is_err());
        assert!(r("http://127.0.0.1:9/m").is_err());
        assert!(r("//evil.example/m").is_err());
        assert!(r("https://127.0.0.1:8000/m").is_err());
    }
}
