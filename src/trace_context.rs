//! W3C trace context (SEP-414): `traceparent`, `tracestate` and `baggage`, reserved unprefixed
//! `_meta` keys of a modern request, or its HTTP headers of those names (the `_meta` wins), each
//! checked and bounded before anything of it is sent on (`received`, by the W3C formats: `w3c`).
//! The proxy carries a leg's context to everything it sends upstream for that leg: the legacy
//! request's `params._meta` (filled from the headers when the client put it only there) and, on
//! an HTTP upstream, the same-named headers of every request of the leg (the answers of a
//! resumed call included: a retry's own context). A relayed legacy request keeps its body as it
//! came; its headers are checked the same way ([`TraceContext::check_headers`]).
//!
//! With traces exported (`ops::telemetry`), each request is a server span named and attributed
//! by the MCP semantic conventions ([`TraceContext::describe`]); the upstream call, and the
//! answers each retry or `tasks/update` delivers, are client spans under it, and the upstream's
//! parent is that client span. What happens to a call between requests is events: `mrtr.park`,
//! `mrtr.resume`, `mrtr.forward`, `mrtr.replay` on the request's span, and the task's
//! transitions (`mrtr.task.*`) on the upstream call's span. A retry links to its call's first leg.

use std::borrow::Cow;

use http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TraceContextExt;
use opentelemetry::KeyValue;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use serde_json::{Map, Value};
use tracing_opentelemetry::OpenTelemetrySpanExt;

mod received;
mod w3c;

pub(crate) use received::{Carried, Dropped};

/// The three keys, as `_meta` keys and header names.
pub(crate) const KEYS: [&str; 3] = ["traceparent", "tracestate", "baggage"];

/// A leg's trace context: what is set of the three, each valid (see `received`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TraceContext {
    values: Vec<(&'static str, String)>,
}

/// Whether `value` may be sent on as `key` unchanged: a version-00 `traceparent`, or a
/// `tracestate` or `baggage` valid and within its bounds (`w3c`). What every value a
/// [`TraceContext`] holds passes (the fuzz targets check it).
pub(crate) fn is_sendable(key: &str, value: &str) -> bool {
    let whole = |c: w3c::Checked| c.kept == w3c::Kept::Whole && !c.invalid && !c.oversized;
    match key {
        "traceparent" => matches!(w3c::traceparent(value), Some(Cow::Borrowed(_))),
        "tracestate" => whole(w3c::tracestate(value)),
        "baggage" => whole(w3c::baggage(value)),
        _ => false,
    }
}

impl TraceContext {
    /// The context of a request whose `_meta` members are `meta` and whose headers are
    /// `headers`, checked (see the module doc), and what was dropped.
    pub(crate) fn of<'a, 'm: 'a>(
        meta: impl Fn(&'static str) -> Option<Carried<'m>>,
        headers: &'a HeaderMap,
    ) -> (Self, Dropped) {
        // Most requests carry no trace context: found absent by a look at the few header names
        // and `_meta` keys, not a lookup per field and source.
        let carried = KEYS.iter().any(|k| meta(k).is_some())
            || headers.keys().any(|k| received::HEADER_NAMES.contains(k));
        if !carried {
            return (Self::default(), Dropped::default());
        }
        let mut values = Vec::new();
        let get = |source, key| match source {
            received::Source::Meta => meta(key),
            received::Source::Headers => received::header(headers, key),
        };
        let dropped = received::choose(get, |key, value| values.push((key, value.into_owned())));
        (Self { values }, dropped)
    }

    /// Checks the trace-context headers of a request relayed as it came (a legacy client's: its
    /// body is not looked at), as [`Self::of`] checks them, in place: what does not validate is
    /// removed, what is past the bounds cut, the rest left as it came. What was dropped.
    pub(crate) fn check_headers(headers: &mut HeaderMap) -> Dropped {
        if !received::HEADER_NAMES
            .iter()
            .any(|k| headers.contains_key(k))
        {
            return Dropped::default();
        }
        // Each key's header: `None` removed, `Some(None)` left as it came, else rebuilt.
        let mut sent: [Option<Option<HeaderValue>>; 3] = Default::default();
        let dropped = {
            let get = |source, key| match source {
                received::Source::Meta => None,
                received::Source::Headers => received::header(headers, key),
            };
            received::choose(get, |key, value| {
                let Some(i) = KEYS.iter().position(|k| *k == key) else {
                    return;
                };
                sent[i] = match value {
                    Cow::Borrowed(_) => Some(None),
                    // Checked text is visible ASCII: a header value.
                    Cow::Owned(v) => HeaderValue::from_str(&v).ok().map(Some),
                };
            })
        };
        for (key, value) in received::HEADER_NAMES.iter().zip(sent) {
            match value {
                None => {
                    headers.remove(key);
                }
                Some(None) => {}
                Some(Some(v)) => {
                    headers.insert(key, v);
                }
            }
        }
        dropped
    }

    // Whether it names a parent: a `traceparent` (only a valid one is ever held).
    fn has_parent(&self) -> bool {
        self.get("traceparent").is_some()
    }

    /// The value of `key`, when set.
    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.values
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The context to send upstream for a request in `span` (a client span of the upstream
    /// request): that span as the parent (same trace) when traces are exported, else the
    /// client's context as it came.
    pub(crate) fn for_span(&self, span: &tracing::Span) -> Self {
        let Some(parent) = Self::traceparent(span) else {
            return self.clone();
        };
        let mut values = vec![("traceparent", parent)];
        values.extend(
            self.values
                .iter()
                .filter(|(k, _)| *k != "traceparent")
                .cloned(),
        );
        Self { values }
    }

    /// Describes a legacy client's request span, as [`Self::describe`] does a modern one: named
    /// by its JSON-RPC method (and target), else `unnamed` (a GET stream, a response), parented
    /// on the client's context (`params._meta`, else the headers), the version it spoke. Only
    /// when traces are exported (the body is parsed for it); what the client sent reaches the
    /// upstream untouched either way.
    pub(crate) fn describe_legacy(
        span: &tracing::Span,
        (headers, body): (&HeaderMap, &[u8]),
        unnamed: &str,
    ) {
        #[derive(serde::Deserialize)]
        struct Envelope {
            method: Option<String>,
            params: Option<Params>,
        }
        #[derive(serde::Deserialize)]
        struct Params {
            name: Option<String>,
            uri: Option<String>,
            #[serde(rename = "_meta")]
            meta: Option<Map<String, Value>>,
        }
        if !crate::ops::telemetry::exporting() {
            return;
        }
        let envelope = serde_json::from_slice::<Envelope>(body).ok();
        let method = envelope.as_ref().and_then(|e| e.method.as_deref());
        let params = envelope.as_ref().and_then(|e| e.params.as_ref());
        let target = params.and_then(|p| p.name.as_deref().or(p.uri.as_deref()));
        let meta = params.and_then(|p| p.meta.as_ref());
        let (trace, _) = Self::of(
            |k| {
                let v = meta?.get(k)?;
                Some(
                    v.as_str()
                        .map_or(Carried::Other, |s| Carried::Text(s.into())),
                )
            },
            headers,
        );
        span.record(
            "otel.name",
            span_name(method.unwrap_or(unnamed), target.unwrap_or("")),
        );
        if trace.has_parent() {
            let _ = span.set_parent(trace.context());
        }
        if let Some(method) = method {
            mcp_attributes(span, method, target.unwrap_or(""));
        }
        if let Some(v) = headers
            .get(crate::protocol::VERSION_HEADER)
            .and_then(|v| v.to_str().ok())
        {
            span.set_attribute("mcp.protocol.version", v.to_owned());
        }
    }

    // The OTel context this trace context names.
    fn context(&self) -> opentelemetry::Context {
        let carrier: std::collections::HashMap<String, String> = self
            .values
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect();
        TraceContextPropagator::new().extract(&carrier)
    }

    /// A client span for the upstream request `<method> <target>` (the call itself, or the
    /// answers a retry delivers), the child of the current span; none when traces are not
    /// exported. The upstream's parent is this span (see [`Self::for_span`]); it ends when
    /// dropped.
    pub(crate) fn client_span(method: &str, target: &str) -> tracing::Span {
        let span = client(|| span_name(method, target));
        if !span.is_none() {
            mcp_attributes(&span, method, target);
        }
        span
    }

    /// A client span for the client's answers a retry or a `tasks/update` delivers upstream
    /// (responses to the upstream's requests), as [`Self::client_span`].
    pub(crate) fn answers_span() -> tracing::Span {
        client(|| "inputResponses".to_owned())
    }

    /// With traces exported, `span`'s context as a `traceparent` (what the upstream's parent
    /// is, what a retry links to); `None` without a valid one.
    pub(crate) fn traceparent(span: &tracing::Span) -> Option<String> {
        if !crate::ops::telemetry::exporting() {
            return None;
        }
        let cx = span.context();
        let otel = cx.span();
        let sc = otel.span_context();
        if !sc.is_valid() {
            return None;
        }
        let flags = sc.trace_flags().to_u8();
        Some(format!("00-{}-{}-{flags:02x}", sc.trace_id(), sc.span_id()))
    }

    /// Marks `span` failed with the JSON-RPC error `code` (`error.type`, and an error status).
    pub(crate) fn failed(span: &tracing::Span, code: i64) {
        if crate::ops::telemetry::exporting() {
            span.set_attribute("error.type", code.to_string());
            span.set_status(opentelemetry::trace::Status::error(code.to_string()));
        }
    }

    /// Adds the event `name` to `span`, with the attributes `attributes` builds (only built,
    /// and only added, when traces are exported).
    pub(crate) fn event(
        span: &tracing::Span,
        name: &'static str,
        attributes: impl FnOnce() -> Vec<KeyValue>,
    ) {
        if crate::ops::telemetry::exporting() {
            span.add_event(name, attributes());
        }
    }

    /// Names the request's span `<method> <target>`, makes the client's context its parent and
    /// sets the MCP semantic-convention attributes (no-ops when traces are not exported).
    pub(crate) fn describe(&self, span: &tracing::Span, (method, target, id): (&str, &str, &str)) {
        if !crate::ops::telemetry::exporting() {
            return;
        }
        span.record("otel.name", span_name(method, target));
        if self.has_parent() {
            let _ = span.set_parent(self.context());
        }
        mcp_attributes(span, method, target);
        span.set_attribute("mcp.protocol.version", crate::protocol::MODERN_VERSION);
        // A string id as its text, a number as written.
        let id = serde_json::from_str::<String>(id).unwrap_or_else(|_| id.to_owned());
        if !bounded(&id).is_empty() {
            span.set_attribute("jsonrpc.request.id", id);
        }
    }

    /// Links `span` to the span `traceparent` names (a retry's span to its call's first leg).
    pub(crate) fn link(span: &tracing::Span, traceparent: &str) {
        if !crate::ops::telemetry::exporting() {
            return;
        }
        let carrier =
            std::collections::HashMap::from([("traceparent".to_owned(), traceparent.to_owned())]);
        let cx = TraceContextPropagator::new().extract(&carrier);
        span.add_link(cx.span().span_context().clone());
    }

    /// What is set, as `_meta` keys and values (what the upstream reads: a client may send it in
    /// headers only, and with traces exported the upstream's parent is the proxy's span).
    pub(crate) fn members(&self) -> impl Iterator<Item = (&'static str, &str)> + '_ {
        self.values.iter().map(|(k, v)| (*k, v.as_str()))
    }

    /// The same-named HTTP headers.
    pub(crate) fn headers(&self) -> impl Iterator<Item = (HeaderName, HeaderValue)> + '_ {
        self.values
            .iter()
            .filter_map(|(k, v)| Some((HeaderName::from_static(k), HeaderValue::from_str(v).ok()?)))
    }
}

// A client span named `name()`, the child of the current span (none when not exporting).
fn client(name: impl FnOnce() -> String) -> tracing::Span {
    if !crate::ops::telemetry::exporting() {
        return tracing::Span::none();
    }
    // Its OTel parent is the current span, but not its `tracing` parent: a `tracing` parent
    // stays open (and unexported) while a child is, and the call's span lives as long as the
    // call — a parked call's first leg would reach the collector only when the call ended, or
    // never, were the process killed meanwhile.
    let span = tracing::info_span!(
        parent: None,
        "upstream",
        otel.name = tracing::field::Empty,
        otel.kind = "client"
    );
    let _ = span.set_parent(tracing::Span::current().context());
    span.record("otel.name", name());
    span
}

/// Longest client-chosen value (a JSON-RPC id, a tool name or URI) put in a span: spans wait in
/// the export queue, and a request body may be megabytes.
const MAX_ATTRIBUTE_BYTES: usize = 256;

// A client-chosen value as a span may carry it: itself, or nothing when too long.
fn bounded(value: &str) -> &str {
    if value.len() <= MAX_ATTRIBUTE_BYTES {
        value
    } else {
        ""
    }
}

// A span's name by the MCP conventions: `<method> <target>`, or the method alone.
fn span_name(method: &str, target: &str) -> String {
    let (method, target) = match (bounded(method), bounded(target)) {
        ("", _) => ("mcp message", ""),
        known => known,
    };
    if target.is_empty() {
        method.to_owned()
    } else {
        format!("{method} {target}")
    }
}

// The method and its target, as the MCP conventions name them.
fn mcp_attributes(span: &tracing::Span, method: &str, target: &str) {
    let (method, target) = (bounded(method), bounded(target));
    span.set_attribute("mcp.method.name", method.to_owned());
    if target.is_empty() {
        return;
    }
    match method {
        "tools/call" => span.set_attribute("gen_ai.tool.name", target.to_owned()),
        "resources/read" => span.set_attribute("mcp.resource.uri", target.to_owned()),
        "prompts/get" => span.set_attribute("gen_ai.prompt.name", target.to_owned()),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_chosen_values_too_long_for_a_span_are_left_out() {
        let long = "x".repeat(MAX_ATTRIBUTE_BYTES + 1);
        assert_eq!(span_name("tools/call", &long), "tools/call");
        assert_eq!(span_name(&long, ""), "mcp message");
        assert_eq!(span_name("tools/call", "ask"), "tools/call ask");
    }
}
