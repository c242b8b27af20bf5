//! Legacy → modern result rewriting: `resultType`, cache hints, `serverInfo` in `_meta`,
//! legacy-only fields dropped, retired error codes mapped. Also builds `server/discover`.
//!
//! Results are spliced, not re-serialised, when their top level has none of the keys we add: the
//! upstream's bytes then reach the client unchanged after the fields we prepend.

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use crate::config::CacheScope;
use crate::jsonrpc::ErrorObject;
use crate::protocol::{
    INTERNAL_ERROR, INVALID_PARAMS, LEGACY_RESOURCE_NOT_FOUND, META_SERVER_INFO, MODERN_VERSION,
    RESERVED_CODES, TASKS_EXTENSION,
};

/// What rewriting needs to know.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RewriteCtx<'a> {
    /// The upstream's `serverInfo` (as text: it is put in every result's `_meta`).
    pub(crate) server_info: Option<&'a RawValue>,
    /// `ttlMs` for cacheable results.
    pub(crate) ttl_ms: u64,
    /// `cacheScope` for cacheable results.
    pub(crate) scope: CacheScope,
}

/// Results that carry `ttlMs`/`cacheScope` in 2026-07-28.
pub(crate) fn is_cacheable(method: &str) -> bool {
    matches!(
        method,
        "server/discover"
            | "tools/list"
            | "prompts/list"
            | "resources/list"
            | "resources/templates/list"
            | "resources/read"
    )
}

#[derive(Deserialize)]
struct TopKeys {
    #[serde(rename = "_meta")]
    meta: Option<IgnoredAny>,
    #[serde(rename = "resultType")]
    result_type: Option<IgnoredAny>,
    #[serde(rename = "ttlMs")]
    ttl_ms: Option<IgnoredAny>,
    #[serde(rename = "cacheScope")]
    cache_scope: Option<IgnoredAny>,
}

/// Rewrites a legacy result (raw JSON object) of `method` into the modern shape, written at
/// the end of `out` (the response being built around it).
pub(crate) fn write_result(out: &mut String, method: &str, raw: &str, ctx: RewriteCtx<'_>) {
    if method != "tools/list" && raw.trim_start().starts_with('{') && !adds_a_named_key(raw) {
        return splice(out, raw, method, ctx);
    }
    let Ok(Value::Object(mut obj)) = serde_json::from_str::<Value>(raw) else {
        // Not an object: wrap nothing, but never emit a result without resultType.
        out.push_str(r#"{"resultType":"complete","value":"#);
        out.push_str(raw);
        return out.push('}');
    };
    if method == "tools/list" {
        strip_legacy_tool_fields(&mut obj);
    }
    obj.insert("resultType".into(), "complete".into());
    if is_cacheable(method) {
        obj.insert("ttlMs".into(), ctx.ttl_ms.into());
        obj.insert("cacheScope".into(), ctx.scope.as_str().into());
    }
    if let Some(info) = ctx.server_info {
        let meta = obj
            .entry("_meta")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(m) = meta {
            m.entry(META_SERVER_INFO)
                .or_insert_with(|| serde_json::from_str(info.get()).unwrap_or(Value::Null));
        }
    }
    out.push_str(&crate::jsonrpc::text(&Value::Object(obj)));
}

// Whether the top level of `raw` (a JSON object) names a key the splice would add. The text is
// searched first: when no key we add appears in it at all, and no escape could spell one,
// nothing can clash (the common case, with no parse); otherwise its top-level keys are read.
fn adds_a_named_key(raw: &str) -> bool {
    let may = raw.contains("\\u")
        || ["\"_meta\"", "\"resultType\"", "\"ttlMs\"", "\"cacheScope\""]
            .iter()
            .any(|key| raw.contains(key));
    if !may {
        return false;
    }
    serde_json::from_str::<TopKeys>(raw).map_or(true, |keys| {
        keys.meta.is_some()
            || keys.result_type.is_some()
            || keys.ttl_ms.is_some()
            || keys.cache_scope.is_some()
    })
}

fn splice(out: &mut String, raw: &str, method: &str, ctx: RewriteCtx<'_>) {
    let rest = raw.trim_start().strip_prefix('{').unwrap_or("}");
    out.push_str(r#"{"resultType":"complete""#);
    if is_cacheable(method) {
        out.push_str(r#","ttlMs":"#);
        out.push_str(&ctx.ttl_ms.to_string());
        out.push_str(r#","cacheScope":""#);
        out.push_str(ctx.scope.as_str());
        out.push('"');
    }
    if let Some(info) = ctx.server_info {
        // The key needs no escaping.
        out.push_str(r#","_meta":{""#);
        out.push_str(META_SERVER_INFO);
        out.push_str(r#"":"#);
        out.push_str(info.get());
        out.push('}');
    }
    if !rest.trim_start().starts_with('}') {
        out.push(',');
    }
    out.push_str(rest);
}

// Legacy task support (`execution.taskSupport`) has no meaning for modern clients.
fn strip_legacy_tool_fields(obj: &mut Map<String, Value>) {
    if let Some(Value::Array(tools)) = obj.get_mut("tools") {
        for tool in tools {
            if let Value::Object(t) = tool {
                t.remove("execution");
            }
        }
    }
}

/// Maps retired legacy error codes to their 2026-07-28 equivalents: -32002 (resource not found)
/// becomes -32602. Codes in the range 2026-07-28 reserves for the spec (-32020 … -32099) mean
/// nothing defined when a legacy server sends them (-32042, URL elicitation required, where it
/// could not become a round), and must not be emitted: they become -32603, message and data kept.
pub(crate) fn rewrite_error(mut err: ErrorObject) -> ErrorObject {
    if err.code == LEGACY_RESOURCE_NOT_FOUND {
        err.code = INVALID_PARAMS;
    } else if RESERVED_CODES.contains(&err.code) {
        err.code = INTERNAL_ERROR;
    }
    err
}

/// Builds the `server/discover` result from the upstream's `InitializeResult`. The upstream's
/// `capabilities.extensions` are kept (an MCP Apps server advertises `io.modelcontextprotocol/ui`
/// there); the tasks extension is the proxy's to advertise, when it offers it (`tasks`).
pub(crate) fn discover_result(
    init: &Value,
    legacy_version: &str,
    ctx: RewriteCtx<'_>,
    tasks: bool,
) -> Value {
    // Capabilities of another type are no declaration: none are advertised.
    let mut caps = match init.get("capabilities") {
        Some(Value::Object(c)) => c.clone(),
        _ => Map::new(),
    };
    // Legacy tasks are not wire-compatible with the tasks extension; do not advertise them.
    caps.remove("tasks");
    advertise_extensions(&mut caps, tasks);
    let mut out = json!({
        "resultType": "complete",
        "supportedVersions": [MODERN_VERSION, legacy_version],
        "capabilities": caps,
        "ttlMs": ctx.ttl_ms,
        "cacheScope": ctx.scope.as_str(),
    });
    if let Some(i) = init.get("instructions").filter(|i| i.is_string()) {
        out["instructions"] = i.clone();
    }
    if let Some(info) = init.get("serverInfo") {
        out["_meta"] = json!({ META_SERVER_INFO: info });
    }
    out
}

// The upstream's extensions (objects only: a declaration is one) without the tasks extension,
// which only the proxy serves, and the proxy's tasks extension when it offers it.
fn advertise_extensions(caps: &mut Map<String, Value>, tasks: bool) {
    let mut extensions = match caps.remove("extensions") {
        Some(Value::Object(e)) => e,
        _ => Map::new(),
    };
    extensions.retain(|name, settings| name != TASKS_EXTENSION && settings.is_object());
    if tasks {
        extensions.insert(TASKS_EXTENSION.to_owned(), json!({}));
    }
    if !extensions.is_empty() {
        caps.insert("extensions".to_owned(), Value::Object(extensions));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(info: Option<&RawValue>) -> RewriteCtx<'_> {
        RewriteCtx {
            server_info: info,
            ttl_ms: 1000,
            scope: CacheScope::Private,
        }
    }

    fn parse(s: &str) -> Value {
        serde_json::from_str(s).unwrap()
    }

    fn rewrite_result(method: &str, raw: &str, ctx: RewriteCtx<'_>) -> String {
        let mut out = String::new();
        write_result(&mut out, method, raw, ctx);
        out
    }

    #[test]
    fn a_key_we_add_only_nested_or_only_in_text_keeps_the_splice() {
        for raw in [
            r#"{"content":[{"type":"text","text":"x","_meta":{"a":1}}]}"#,
            r#"{"content":[{"type":"text","text":"\"resultType\": here"}]}"#,
        ] {
            let out = rewrite_result("tools/call", raw, ctx(None));
            assert!(out.ends_with(&raw[1..]), "{out}");
            assert_eq!(parse(&out)["resultType"], "complete");
        }
    }

    #[test]
    fn a_top_level_key_we_add_is_merged_however_it_is_spelled() {
        let info = crate::jsonrpc::raw(&json!({"name":"up"})).unwrap();
        for raw in [
            r#"{"_meta":{"k":1},"content":[]}"#,
            r#"{"\u005fmeta":{"k":1},"content":[]}"#,
            r#"{"resultType":"old","content":[]}"#,
        ] {
            let out = rewrite_result("tools/call", raw, ctx(Some(&info)));
            // One object, each key once: a tree would refuse nothing, so count the keys.
            let v: serde_json::Map<String, Value> = serde_json::from_str(&out).unwrap();
            assert_eq!(v["resultType"], "complete", "{out}");
            assert_eq!(v["_meta"][META_SERVER_INFO]["name"], "up", "{out}");
            assert_eq!(out.matches("resultType").count(), 1, "{out}");
            assert_eq!(out.matches("_meta").count(), 1, "{out}");
        }
        let out = rewrite_result("tools/call", r#"{"\u005fmeta":{"k":1}}"#, ctx(None));
        assert_eq!(parse(&out)["_meta"]["k"], 1, "{out}");
    }

    #[test]
    fn call_results_get_result_type_and_keep_bytes() {
        let raw = r#"{"content":[{"type":"text","text":"hi"}],  "isError":false}"#;
        let out = rewrite_result("tools/call", raw, ctx(None));
        assert!(
            out.ends_with(r#""content":[{"type":"text","text":"hi"}],  "isError":false}"#),
            "{out}"
        );
        let v = parse(&out);
        assert_eq!(v["resultType"], "complete");
        assert!(v.get("ttlMs").is_none());
    }

    #[test]
    fn lists_and_reads_get_cache_hints() {
        let info = crate::jsonrpc::raw(&json!({"name":"up","version":"1"})).unwrap();
        for m in ["prompts/list", "resources/read", "resources/templates/list"] {
            let v = parse(&rewrite_result(m, r#"{"x":[]}"#, ctx(Some(&info))));
            assert_eq!(v["ttlMs"], 1000, "{m}");
            assert_eq!(v["cacheScope"], "private");
            assert_eq!(v["_meta"][META_SERVER_INFO]["name"], "up");
        }
        let v = parse(&rewrite_result("resources/read", "{}", ctx(None)));
        assert_eq!(v["resultType"], "complete");
    }

    #[test]
    fn existing_meta_is_merged() {
        let info = crate::jsonrpc::raw(&json!({"name":"up"})).unwrap();
        let v = parse(&rewrite_result(
            "tools/call",
            r#"{"_meta":{"k":1},"content":[]}"#,
            ctx(Some(&info)),
        ));
        assert_eq!(v["_meta"]["k"], 1);
        assert_eq!(v["_meta"][META_SERVER_INFO]["name"], "up");
    }

    #[test]
    fn tools_list_drops_task_support() {
        let raw = r#"{"tools":[{"name":"a","inputSchema":{"type":"object"},"execution":{"taskSupport":"optional"}}]}"#;
        let v = parse(&rewrite_result("tools/list", raw, ctx(None)));
        assert!(v["tools"][0].get("execution").is_none());
        assert_eq!(v["tools"][0]["name"], "a");
        assert_eq!(v["cacheScope"], "private");
    }

    #[test]
    fn retired_codes_are_mapped() {
        let e = rewrite_error(ErrorObject {
            code: -32002,
            message: "nf".into(),
            data: None,
        });
        assert_eq!(e.code, -32602);
        let e = rewrite_error(ErrorObject {
            code: -32601,
            message: "x".into(),
            data: None,
        });
        assert_eq!(e.code, -32601);
        for reserved in [-32042, -32020, -32099] {
            let e = rewrite_error(ErrorObject {
                code: reserved,
                message: "m".into(),
                data: None,
            });
            assert_eq!(e.code, -32603, "{reserved}");
            assert_eq!(e.message, "m");
        }
        let e = rewrite_error(ErrorObject {
            code: -32001,
            message: "implementation-defined".into(),
            data: None,
        });
        assert_eq!(e.code, -32001, "legacy implementation codes pass");
    }

    #[test]
    fn discover_from_initialize() {
        let init = json!({"protocolVersion":"2025-06-18","capabilities":{"tools":{"listChanged":true},"tasks":{}},"serverInfo":{"name":"s","version":"1"},"instructions":"use me"});
        let v = discover_result(&init, "2025-06-18", ctx(None), false);
        assert_eq!(v["supportedVersions"], json!(["2026-07-28", "2025-06-18"]));
        assert!(v["capabilities"].get("tasks").is_none());
        assert!(v["capabilities"].get("extensions").is_none());
        assert_eq!(v["instructions"], "use me");
        assert_eq!(v["_meta"][META_SERVER_INFO]["name"], "s");
        assert_eq!(v["ttlMs"], 1000);
    }

    #[test]
    fn discover_keeps_the_upstreams_extensions_beside_the_proxys() {
        let ui = json!({"mimeTypes":["text/html;profile=mcp-app"]});
        let init = json!({"capabilities":{"extensions":{
            "io.modelcontextprotocol/ui": ui, TASKS_EXTENSION: {"theirs": true}, "x/not-an-object": 1,
        }}});
        for tasks in [true, false] {
            let v = discover_result(&init, "2025-11-25", ctx(None), tasks);
            let mut expected = json!({"io.modelcontextprotocol/ui": ui});
            if tasks {
                expected[TASKS_EXTENSION] = json!({});
            }
            assert_eq!(v["capabilities"]["extensions"], expected, "tasks: {tasks}");
        }
        // Whatever the upstream put there, nothing panics and the proxy's own is advertised.
        for caps in [
            json!(5),
            json!({"extensions": "x"}),
            json!({"extensions": null}),
            json!(null),
        ] {
            let v = discover_result(
                &json!({"capabilities": caps}),
                "2025-11-25",
                ctx(None),
                true,
            );
            assert_eq!(
                v["capabilities"]["extensions"],
                json!({TASKS_EXTENSION: {}}),
                "{caps}"
            );
        }
    }
}
