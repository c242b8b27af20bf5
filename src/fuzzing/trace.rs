//! The trace-context target: `traceparent`, `tracestate` and `baggage` as a request carries them
//! (`_meta` and headers), checked by `trace_context`.

use std::collections::BTreeMap;

use http::{HeaderMap, HeaderName, HeaderValue};
use serde_json::value::RawValue;

use crate::trace_context::{is_sendable, Carried, TraceContext, KEYS};

/// W3C Trace Context §3.3.1.1 and W3C Baggage §3.3.1: the most a sent value holds.
const MAX_TRACESTATE_MEMBERS: usize = 32;
const MAX_TRACESTATE_BYTES: usize = 512;
const MAX_BAGGAGE_MEMBERS: usize = 180;
const MAX_BAGGAGE_BYTES: usize = 8192;

/// Trace context. The input is header lines (`name: value`), a blank line, then `_meta` as JSON
/// text (an object; its members are read as `front::validate` reads them). Never a panic; every
/// value sent on (in `_meta` and as a header) is one `trace_context` would send unchanged, within
/// the W3C bounds (a `traceparent` of version 00 in 55 characters; a `tracestate` of at most 32
/// members and 512 characters; a `baggage` of at most 180 members and 8192 bytes) and a valid
/// header value; a `tracestate` goes only with a `traceparent`. A relayed request's headers
/// checked in place (`check_headers`) keep exactly what the same headers give as a context, with
/// the same drops counted, and checking them again changes nothing.
pub fn trace_context(data: &[u8]) {
    let (head, body) = split_head(data);
    let headers = header_lines(head);
    let meta = serde_json::from_slice::<BTreeMap<String, Box<RawValue>>>(body).ok();
    let lookup = |k: &'static str| Some(Carried::of_json(meta.as_ref()?.get(k)?.get()));
    let (ctx, _) = TraceContext::of(lookup, &headers);
    sent_within_bounds(&ctx);
    let (from_headers, dropped) = TraceContext::of(|_| None, &headers);
    sent_within_bounds(&from_headers);
    let mut checked = headers.clone();
    assert_eq!(TraceContext::check_headers(&mut checked), dropped);
    for key in KEYS {
        let fields: Vec<&HeaderValue> = checked.get_all(key).iter().collect();
        let kept = fields.first().and_then(|v| v.to_str().ok());
        assert!(fields.len() <= 1, "{key} is one field once checked");
        assert_eq!(kept, from_headers.get(key), "{key} checked in place");
    }
    for (name, value) in &headers {
        if !KEYS.contains(&name.as_str()) {
            assert_eq!(
                checked.get_all(name).iter().count(),
                headers.get_all(name).iter().count()
            );
            assert!(
                checked.get_all(name).iter().any(|v| v == value),
                "{name} untouched"
            );
        }
    }
    let mut again = checked.clone();
    assert!(
        TraceContext::check_headers(&mut again).is_empty(),
        "checked twice"
    );
    assert_eq!(again, checked, "checking again changed the headers");
}

/// Header lines and what follows the first blank line.
pub(super) fn split_head(data: &[u8]) -> (&[u8], &[u8]) {
    match data.windows(2).position(|w| w == b"\n\n") {
        Some(i) => (&data[..i], &data[i + 2..]),
        None => (data, &[][..]),
    }
}

/// The `name: value` lines of `head`, as a name and a raw value each.
pub(super) fn header_fields(head: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    head.split(|b| *b == b'\n').filter_map(|line| {
        let colon = line.iter().position(|b| *b == b':')?;
        Some((&line[..colon], &line[colon + 1..]))
    })
}

/// The header lines of `head` that are valid headers (values trimmed).
pub(super) fn header_lines(head: &[u8]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in header_fields(head) {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name),
            HeaderValue::from_bytes(value.trim_ascii()),
        ) {
            headers.append(n, v);
        }
    }
    headers
}

// Every value of `ctx` is sendable, bounded, and a header value.
fn sent_within_bounds(ctx: &TraceContext) {
    for (key, value) in ctx.members() {
        assert!(
            is_sendable(key, value),
            "{key} sent as it is not valid: {value:?}"
        );
        let members = value
            .split(',')
            .filter(|m| !m.trim_matches([' ', '\t']).is_empty())
            .count();
        let bounded = match key {
            "traceparent" => value.len() == 55 && value.starts_with("00-"),
            "tracestate" => {
                members <= MAX_TRACESTATE_MEMBERS && value.len() <= MAX_TRACESTATE_BYTES
            }
            _ => members <= MAX_BAGGAGE_MEMBERS && value.len() <= MAX_BAGGAGE_BYTES,
        };
        assert!(
            bounded,
            "{key} past its bounds: {} bytes, {members} members",
            value.len()
        );
    }
    assert!(
        ctx.get("tracestate").is_none() || ctx.get("traceparent").is_some(),
        "a tracestate without its traceparent"
    );
    assert_eq!(
        ctx.headers().count(),
        ctx.members().count(),
        "a value that is not a header value"
    );
}
