//! What a request carried, checked before anything of it goes upstream: the trace
//! (`traceparent` and its `tracestate`) from `_meta` when `_meta` has a valid `traceparent`, else
//! from the headers; `baggage` from `_meta` when anything of it is valid, else from the headers.
//! Each value is checked and bounded (`w3c`); what is dropped, whole or in part, is noted for
//! `mrtr_trace_context_dropped_total`. A value left unsent because a same-named `_meta` one won
//! is not a drop.

use std::borrow::Cow;

use http::{HeaderMap, HeaderName};

use super::w3c::{self, Kept};
use crate::ops::metrics::{Metrics, TraceDrop, TraceField};

/// A value as a request carried it.
#[derive(Debug)]
pub(crate) enum Carried<'a> {
    /// Text: a `_meta` string, or the fields of a header of that name joined by commas.
    Text(Cow<'a, str>),
    /// A `_meta` member that is not a string, or a header that is not visible ASCII.
    Other,
}

/// What of a request's trace context was not sent on, and why (each field and reason once).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Dropped(u8);

/// Where a value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    /// `params._meta`.
    Meta,
    /// The HTTP headers.
    Headers,
}

impl Carried<'_> {
    /// A `_meta` member, as JSON text.
    pub(crate) fn of_json(raw: &str) -> Self {
        serde_json::from_str::<String>(raw).map_or(Self::Other, |s| Self::Text(s.into()))
    }
}

impl Dropped {
    /// Whether nothing was dropped.
    pub(crate) fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Whether `field` was dropped (whole or in part) for `reason`.
    pub(crate) fn has(self, field: TraceField, reason: TraceDrop) -> bool {
        self.0 & bit(field, reason) != 0
    }

    /// Counts what was dropped in `mrtr_trace_context_dropped_total`.
    pub(crate) fn count(self, metrics: &Metrics) {
        if self.is_empty() {
            return;
        }
        for field in [
            TraceField::Traceparent,
            TraceField::Tracestate,
            TraceField::Baggage,
        ] {
            for reason in [TraceDrop::Invalid, TraceDrop::Oversized] {
                if self.has(field, reason) {
                    metrics.trace_context.dropped(field, reason);
                }
            }
        }
    }

    pub(super) fn add(&mut self, field: TraceField, reason: TraceDrop) {
        self.0 |= bit(field, reason);
    }
}

/// The values to send, handed to `keep` (borrowed: as they came; owned: rebuilt), and what was
/// dropped; `get` reads a value of a source.
pub(super) fn choose<'a>(
    get: impl Fn(Source, &'static str) -> Option<Carried<'a>>,
    mut keep: impl FnMut(&'static str, Cow<'a, str>),
) -> Dropped {
    let mut dropped = Dropped::default();
    let trace = traceparent(&get, &mut keep, &mut dropped);
    tracestate(trace, &get, &mut keep, &mut dropped);
    baggage(&get, &mut keep, &mut dropped);
    dropped
}

// W3C: a `traceparent` that does not parse is not sent on (no trace, or the proxy's own).
// Where the one sent came from.
fn traceparent<'a>(
    get: &impl Fn(Source, &'static str) -> Option<Carried<'a>>,
    keep: &mut impl FnMut(&'static str, Cow<'a, str>),
    dropped: &mut Dropped,
) -> Option<Source> {
    for source in [Source::Meta, Source::Headers] {
        let sent = match get(source, "traceparent") {
            None => continue,
            Some(Carried::Text(tp)) => {
                // Rebuilt only for a later version (sent as 00); else the text as it came.
                let rebuilt = w3c::traceparent(&tp).map(|v| match v {
                    Cow::Borrowed(_) => None,
                    Cow::Owned(v) => Some(v),
                });
                rebuilt.map(|v| v.map_or(tp, Cow::Owned))
            }
            Some(Carried::Other) => None,
        };
        match sent {
            Some(tp) => {
                keep("traceparent", tp);
                return Some(source);
            }
            None => dropped.add(TraceField::Traceparent, TraceDrop::Invalid),
        }
    }
    None
}

// A `tracestate` goes with its `traceparent` (W3C: not parsed without a valid one); the
// headers' is not read when `_meta`'s trace won.
fn tracestate<'a>(
    trace: Option<Source>,
    get: &impl Fn(Source, &'static str) -> Option<Carried<'a>>,
    keep: &mut impl FnMut(&'static str, Cow<'a, str>),
    dropped: &mut Dropped,
) {
    for source in [Source::Meta, Source::Headers] {
        if trace == Some(Source::Meta) && source == Source::Headers {
            break;
        }
        let Some(carried) = get(source, "tracestate") else {
            continue;
        };
        match carried {
            Carried::Text(ts) if trace == Some(source) => {
                let checked = w3c::tracestate(&ts);
                note(dropped, TraceField::Tracestate, &checked);
                if let Some(v) = kept(ts, checked.kept) {
                    keep("tracestate", v);
                }
            }
            _ => dropped.add(TraceField::Tracestate, TraceDrop::Invalid),
        }
    }
}

// `baggage` on its own: `_meta`'s when anything of it is valid, else the headers'.
fn baggage<'a>(
    get: &impl Fn(Source, &'static str) -> Option<Carried<'a>>,
    keep: &mut impl FnMut(&'static str, Cow<'a, str>),
    dropped: &mut Dropped,
) {
    for source in [Source::Meta, Source::Headers] {
        let Some(carried) = get(source, "baggage") else {
            continue;
        };
        let Carried::Text(b) = carried else {
            dropped.add(TraceField::Baggage, TraceDrop::Invalid);
            continue;
        };
        let checked = w3c::baggage(&b);
        note(dropped, TraceField::Baggage, &checked);
        if let Some(v) = kept(b, checked.kept) {
            keep("baggage", v);
            return;
        }
    }
}

// What is sent of `value` once checked.
fn kept(value: Cow<'_, str>, kept: Kept) -> Option<Cow<'_, str>> {
    match kept {
        Kept::Whole => Some(value),
        Kept::Part(part) => Some(Cow::Owned(part)),
        Kept::Nothing => None,
    }
}

fn note(dropped: &mut Dropped, field: TraceField, checked: &w3c::Checked) {
    if checked.invalid {
        dropped.add(field, TraceDrop::Invalid);
    }
    if checked.oversized {
        dropped.add(field, TraceDrop::Oversized);
    }
}

/// The three keys as header names, in `KEYS`' order: a lookup by text would parse the name
/// first, on every request.
pub(super) static HEADER_NAMES: [HeaderName; 3] = [
    HeaderName::from_static("traceparent"),
    HeaderName::from_static("tracestate"),
    HeaderName::from_static("baggage"),
];

/// Header `key`: its fields joined by commas (RFC 9110 §5.3: several fields of one name are one
/// list; several `traceparent`s thus do not parse).
pub(super) fn header<'h>(headers: &'h HeaderMap, key: &str) -> Option<Carried<'h>> {
    let name = HEADER_NAMES.iter().find(|n| n.as_str() == key)?;
    let mut fields = headers.get_all(name).iter();
    let Ok(first) = fields.next()?.to_str() else {
        return Some(Carried::Other);
    };
    let Some(second) = fields.next() else {
        return Some(Carried::Text(Cow::Borrowed(first)));
    };
    let mut joined = first.to_owned();
    for field in std::iter::once(second).chain(fields) {
        let Ok(text) = field.to_str() else {
            return Some(Carried::Other);
        };
        joined.push(',');
        joined.push_str(text);
    }
    Some(Carried::Text(Cow::Owned(joined)))
}

fn bit(field: TraceField, reason: TraceDrop) -> u8 {
    let field = match field {
        TraceField::Traceparent => 0,
        TraceField::Tracestate => 1,
        TraceField::Baggage => 2,
    };
    let reason = match reason {
        TraceDrop::Invalid => 0,
        TraceDrop::Oversized => 1,
    };
    1 << (field * 2 + reason)
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;
    use serde_json::{json, Value};

    use super::*;
    use crate::trace_context::TraceContext;

    const TP: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    const OTHER_TP: &str = "00-11111111111111111111111111111111-2222222222222222-01";

    // A `_meta` lookup over `meta`'s members.
    fn lookup<'v>(meta: &'v Value) -> impl Fn(&'static str) -> Option<Carried<'v>> + 'v {
        move |k| {
            let v = meta.get(k)?;
            Some(
                v.as_str()
                    .map_or(Carried::Other, |s| Carried::Text(s.into())),
            )
        }
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn of(meta: &Value, h: &HeaderMap) -> (TraceContext, Dropped) {
        TraceContext::of(lookup(meta), h)
    }

    fn only(field: TraceField, reason: TraceDrop) -> Dropped {
        let mut d = Dropped::default();
        d.add(field, reason);
        d
    }

    #[test]
    fn meta_wins_over_the_headers_and_the_headers_fill_in() {
        let h = headers(&[("traceparent", OTHER_TP), ("tracestate", "h=1")]);
        let (ctx, dropped) = of(&json!({"traceparent": TP}), &h);
        assert_eq!(ctx.get("traceparent"), Some(TP));
        assert_eq!(
            ctx.get("tracestate"),
            None,
            "the headers' goes with their trace"
        );
        assert!(
            dropped.is_empty(),
            "a value `_meta` wins over is not dropped"
        );
        let (ctx, dropped) = of(&json!({}), &h);
        assert_eq!(ctx.get("traceparent"), Some(OTHER_TP));
        assert_eq!(ctx.get("tracestate"), Some("h=1"));
        assert!(dropped.is_empty());
        // Baggage on its own: `_meta`'s when it has one, else the headers'.
        let h = headers(&[("traceparent", OTHER_TP), ("baggage", "k=v")]);
        let (ctx, _) = of(&json!({"traceparent": TP}), &h);
        assert_eq!(ctx.get("baggage"), Some("k=v"));
        let (ctx, _) = of(&json!({"traceparent": TP, "baggage": "m=1"}), &h);
        assert_eq!(ctx.get("baggage"), Some("m=1"));
        assert!(ctx.members().any(|m| m == ("baggage", "m=1")));
    }

    #[test]
    fn an_invalid_meta_traceparent_is_dropped_and_the_headers_taken() {
        let h = headers(&[("traceparent", OTHER_TP), ("tracestate", "h=1")]);
        let meta = json!({"traceparent": "00-zzzz", "tracestate": "m=1"});
        let (ctx, dropped) = of(&meta, &h);
        assert_eq!(ctx.get("traceparent"), Some(OTHER_TP));
        assert_eq!(ctx.get("tracestate"), Some("h=1"));
        assert!(dropped.has(TraceField::Traceparent, TraceDrop::Invalid));
        assert!(
            dropped.has(TraceField::Tracestate, TraceDrop::Invalid),
            "`_meta`'s tracestate had no trace"
        );
        // Neither valid: no trace, no tracestate; baggage still goes.
        let h = headers(&[("traceparent", "00-AB"), ("tracestate", "h=1")]);
        let (ctx, dropped) = of(&json!({"baggage": "k=v"}), &h);
        assert_eq!(
            ctx.members().collect::<Vec<_>>(),
            [("baggage", "k=v")],
            "{ctx:?}"
        );
        assert!(dropped.has(TraceField::Traceparent, TraceDrop::Invalid));
        assert!(dropped.has(TraceField::Tracestate, TraceDrop::Invalid));
        assert!(!dropped.has(TraceField::Baggage, TraceDrop::Invalid));
    }

    #[test]
    fn a_meta_value_that_is_not_a_string_is_invalid() {
        let meta = json!({"traceparent": 1, "tracestate": {"a": 1}, "baggage": ["k=v"]});
        let (ctx, dropped) = of(&meta, &HeaderMap::new());
        assert_eq!(ctx, TraceContext::default());
        for field in [
            TraceField::Traceparent,
            TraceField::Tracestate,
            TraceField::Baggage,
        ] {
            assert!(dropped.has(field, TraceDrop::Invalid), "{field:?}");
        }
    }

    #[test]
    fn oversized_and_malformed_lists_are_bounded_and_counted() {
        let huge = "a".repeat(64 * 1024);
        let meta = json!({"traceparent": TP, "tracestate": huge, "baggage": huge});
        let (ctx, dropped) = of(&meta, &HeaderMap::new());
        assert_eq!(ctx.members().collect::<Vec<_>>(), [("traceparent", TP)]);
        assert!(dropped.has(TraceField::Tracestate, TraceDrop::Invalid));
        assert!(dropped.has(TraceField::Baggage, TraceDrop::Invalid));
        let many: Vec<String> = (0..40).map(|i| format!("k{i}=v")).collect();
        let meta = json!({"traceparent": TP, "tracestate": many.join(","), "baggage": format!("ok=1,{huge}=x")});
        let (ctx, dropped) = of(&meta, &HeaderMap::new());
        assert_eq!(ctx.get("tracestate"), Some(many[..32].join(",").as_str()));
        assert_eq!(ctx.get("baggage"), Some("ok=1"));
        assert_eq!(
            dropped,
            Dropped(
                bit(TraceField::Tracestate, TraceDrop::Oversized)
                    | bit(TraceField::Baggage, TraceDrop::Oversized)
            ),
            "a 64 KiB key is a valid token, past the bound"
        );
    }

    #[test]
    fn several_header_fields_are_one_list() {
        let h = headers(&[
            ("traceparent", TP),
            ("tracestate", "a=1"),
            ("tracestate", "b=2"),
            ("baggage", "k=v"),
            ("baggage", "bad key=1"),
        ]);
        let (ctx, dropped) = TraceContext::of(|_| None, &h);
        assert_eq!(ctx.get("tracestate"), Some("a=1,b=2"));
        assert_eq!(ctx.get("baggage"), Some("k=v"));
        assert_eq!(dropped, only(TraceField::Baggage, TraceDrop::Invalid));
        let twice = headers(&[("traceparent", TP), ("traceparent", OTHER_TP)]);
        let (ctx, dropped) = TraceContext::of(|_| None, &twice);
        assert_eq!(ctx, TraceContext::default());
        assert_eq!(dropped, only(TraceField::Traceparent, TraceDrop::Invalid));
    }

    #[test]
    fn relayed_headers_are_checked_in_place_and_valid_ones_left_as_they_came() {
        let mut h = headers(&[
            ("traceparent", TP),
            ("tracestate", "a=1"),
            ("baggage", "k=v"),
        ]);
        let before = h.clone();
        assert!(TraceContext::check_headers(&mut h).is_empty());
        assert_eq!(h, before);
        let mut h = headers(&[
            (
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            ),
            ("tracestate", "a=1"),
            ("baggage", "k=v,bad key=1"),
            ("x-other", "kept"),
        ]);
        let dropped = TraceContext::check_headers(&mut h);
        assert!(h.get("traceparent").is_none() && h.get("tracestate").is_none());
        assert_eq!(h.get("baggage").unwrap(), "k=v");
        assert_eq!(h.get("x-other").unwrap(), "kept");
        assert!(dropped.has(TraceField::Traceparent, TraceDrop::Invalid));
        assert!(dropped.has(TraceField::Tracestate, TraceDrop::Invalid));
        assert!(dropped.has(TraceField::Baggage, TraceDrop::Invalid));
        let mut h = headers(&[
            (
                "traceparent",
                "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x",
            ),
            ("tracestate", "a=1"),
            ("tracestate", "b=2"),
        ]);
        assert!(TraceContext::check_headers(&mut h).is_empty());
        assert_eq!(h.get("traceparent").unwrap(), TP);
        assert_eq!(h.get_all("tracestate").iter().count(), 1);
        assert_eq!(h.get("tracestate").unwrap(), "a=1,b=2");
        let mut none = HeaderMap::new();
        assert!(TraceContext::check_headers(&mut none).is_empty());
    }
}
