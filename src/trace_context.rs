//! W3C trace context (SEP-414): `traceparent`, `tracestate` and `baggage`, reserved unprefixed
//! `_meta` keys of a modern request, or its HTTP headers of those names (the `_meta` wins). The
//! proxy carries a leg's context to everything it sends upstream for that leg: the legacy
//! request's `params._meta` (filled from the headers when the client put it only there) and, on
//! an HTTP upstream, the same-named headers of every request of the leg (the answers of a
//! resumed call included: a retry's own context).
//!
//! With traces exported (`ops::telemetry`), each request is a server span named and attributed
//! by the MCP semantic conventions ([`TraceContext::describe`]); the upstream call, and the
//! answers each retry or `tasks/update` delivers, are client spans under it, and the upstream's
//! parent is that client span. What happens to a call between requests is events: `mrtr.park`,
//! `mrtr.resume`, `mrtr.forward`, `mrtr.replay` on the request's span, and the task's
//! transitions (`mrtr.task.*`) on the upstream call's span. A retry links to its call's first leg.

use http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TraceContextExt;
use opentelemetry::KeyValue;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use serde_json::{Map, Value};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The three keys, as `_meta` keys and header names.
const KEYS: [&str; 3] = ["traceparent", "tracestate", "baggage"];
/// Longest value carried (W3C: tracestate ≤ 512 bytes; baggage ≤ 8192).
const MAX_VALUE_BYTES: usize = 8192;

/// A leg's trace context: what is set of the three.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TraceContext {
    values: Vec<(&'static str, String)>,
}

impl TraceContext {
    /// The context of a request with `_meta` `meta` and `headers`: the `_meta`'s when it has a
    /// valid `traceparent`, else the headers'. A malformed `traceparent` is no context at all.
    pub(crate) fn of(meta: impl Fn(&str) -> Option<String>, headers: &HeaderMap) -> Self {
        let from_meta = Self::collect(meta);
        if from_meta.is_valid() {
            return from_meta;
        }
        let from_headers = Self::collect(|k| headers.get(k)?.to_str().ok().map(str::to_owned));
        if from_headers.is_valid() {
            return from_headers;
        }
        Self::default()
    }

    fn collect(get: impl Fn(&'static str) -> Option<String>) -> Self {
        let values = KEYS
            .iter()
            .filter_map(|k| get(k).map(|v| (*k, v)))
            .filter(|(_, v)| v.len() <= MAX_VALUE_BYTES && HeaderValue::from_str(v).is_ok())
            .collect();
        Self { values }
    }

    // A `traceparent` of the W3C form: version-traceid-parentid-flags, hex, ids not all zero.
    fn is_valid(&self) -> bool {
        let Some(tp) = self.get("traceparent") else {
            return false;
        };
        let parts: Vec<&str> = tp.split('-').collect();
        // Lowercase hex only (W3C); version 00 has exactly four fields, a later one may add.
        let hex = |s: &str, n: usize| {
            s.len() == n
                && s.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        let nonzero = |s: &str| s.bytes().any(|b| b != b'0');
        let fields = if parts.first() == Some(&"00") {
            parts.len() == 4
        } else {
            parts.len() >= 4
        };
        fields
            && hex(parts[0], 2)
            && parts[0] != "ff"
            && hex(parts[1], 32)
            && nonzero(parts[1])
            && hex(parts[2], 16)
            && nonzero(parts[2])
            && hex(parts[3], 2)
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
        let trace = Self::of(|k| meta?.get(k)?.as_str().map(str::to_owned), headers);
        span.record(
            "otel.name",
            span_name(method.unwrap_or(unnamed), target.unwrap_or("")),
        );
        if trace.is_valid() {
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
        if self.is_valid() {
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

    const TP: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    // A `_meta` lookup over `meta`'s string members.
    fn lookup(meta: serde_json::Value) -> impl Fn(&str) -> Option<String> {
        move |k| meta.get(k)?.as_str().map(str::to_owned)
    }

    #[test]
    fn meta_wins_over_headers_and_headers_fill_in() {
        let mut h = HeaderMap::new();
        h.insert(
            "traceparent",
            HeaderValue::from_static("00-11111111111111111111111111111111-2222222222222222-01"),
        );
        h.insert("baggage", HeaderValue::from_static("k=v"));
        let meta = || lookup(serde_json::json!({"traceparent": TP}));
        assert_eq!(TraceContext::of(meta(), &h).get("traceparent"), Some(TP));
        assert_eq!(TraceContext::of(meta(), &h).get("baggage"), None);
        let from_headers = TraceContext::of(|_| None, &h);
        assert_eq!(from_headers.get("baggage"), Some("k=v"));
        assert!(from_headers.members().any(|m| m == ("baggage", "k=v")));
    }

    #[test]
    fn a_malformed_traceparent_is_no_context() {
        for bad in [
            "",
            "00-zz-b7ad6b7169203331-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            // Uppercase hex, and a fifth field on version 00 (W3C: both invalid).
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
        ] {
            let meta = lookup(serde_json::json!({"traceparent": bad}));
            assert!(
                TraceContext::of(meta, &HeaderMap::new())
                    .members()
                    .next()
                    .is_none(),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_later_version_may_add_fields() {
        let tp = "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-what-comes-next";
        let meta = lookup(serde_json::json!({ "traceparent": tp }));
        assert!(TraceContext::of(meta, &HeaderMap::new())
            .members()
            .next()
            .is_some());
    }

    #[test]
    fn client_chosen_values_too_long_for_a_span_are_left_out() {
        let long = "x".repeat(MAX_ATTRIBUTE_BYTES + 1);
        assert_eq!(span_name("tools/call", &long), "tools/call");
        assert_eq!(span_name(&long, ""), "mcp message");
        assert_eq!(span_name("tools/call", "ask"), "tools/call ask");
    }
}
