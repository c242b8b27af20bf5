//! The approval gate: a `tools/call` of a tool `[approval.tools]` names is answered, before the
//! upstream sees anything, with an `input_required` round of one form elicitation (the policy's
//! message, a required `approve` boolean, the policy's extra fields) behind a requestState bound
//! like any other (principal, tool, canonical arguments) and to the policy's version. Its retry
//! is taken once, on the instance that asked (a peer forwards it there; that instance gone, the
//! person is asked again): approved, the call starts as any other; declined, it ends as an error
//! result the upstream never saw. Legacy clients cannot be asked yet: `refuse_legacy`.

use std::sync::Arc;

use http::{HeaderMap, Response, StatusCode};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use super::principal::Principal;
use super::start::start_call;
use super::validate::ModernRequest;
use crate::app::App;
use crate::body::Body;
use crate::call::LegEvent;
use crate::config::ApprovalRule;
use crate::edge;
use crate::error::ProxyError;
use crate::input::{self, Asked, InputKind};
use crate::jsonrpc::{self, ErrorObject};
use crate::ops::metrics::Decision;
use crate::protocol::INVALID_REQUEST;
use crate::state::{random_id, request_digest, Claims, TokenError};

/// The `inputRequests` key of the approval.
pub(super) const APPROVAL_KEY: &str = "approval";
/// Longest argument value put into a message, in characters (longer ones are cut, marked `…`).
const MAX_VALUE_CHARS: usize = 200;
/// Bytes of randomness in an approval token's handle (it names no parked call).
const HANDLE_BYTES: usize = 16;

/// What became of an approval's retry: the call started (its leg), or an answer now (declined,
/// or asked again).
pub(super) enum Taken {
    Started(mpsc::Receiver<LegEvent>),
    Answered(Response<Body>),
}

/// What the person answered.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Approved,
    Declined,
    Unanswered,
}

/// The rule gating `req`, when it calls a gated tool.
pub(super) fn rule<'a>(app: &'a App, req: &ModernRequest) -> Option<&'a ApprovalRule> {
    (req.method == "tools/call")
        .then(|| app.config.approval.rule_for(req.target()))
        .flatten()
}

/// Asks the person: an `input_required` round, or -32021 when the client declared no form
/// elicitation (it cannot ask anyone).
///
/// # Errors
/// [`ProxyError::MissingCapability`]; [`ProxyError::Internal`] if the token cannot be signed.
pub(super) fn ask(
    app: &App,
    req: &ModernRequest,
    who: &Principal,
    rule: &ApprovalRule,
) -> Result<Response<Body>, ProxyError> {
    if let Err(required) = input::check_capability(InputKind::Elicitation, None, &req.capabilities)
    {
        audit(app, req, who, rule, Decision::Unaskable);
        return Err(ProxyError::MissingCapability { required });
    }
    let tokens = &app.tokens;
    let digest = request_digest(&req.method, req.target(), req.arguments());
    let handle = random_id(HANDLE_BYTES);
    let mut claims = tokens.claims(&handle, &who.digest, &digest, 1, tokens.now());
    claims.approval = Some(rule.version.clone());
    let token = tokens
        .sign(&claims)
        .map_err(|e| ProxyError::Internal(e.to_string()))?;
    let request = json!({"method": "elicitation/create", "params": form(rule, req.arguments())});
    let result = json!({
        "resultType": "input_required",
        "inputRequests": {APPROVAL_KEY: request},
        "requestState": token,
    });
    audit(app, req, who, rule, Decision::Asked);
    let body = jsonrpc::response_bytes(&req.id, &jsonrpc::text(&result));
    Ok(edge::json(StatusCode::OK, HeaderMap::new(), body))
}

/// The retry of an approval this instance asked for: approved, the call starts; declined, an
/// error result; unanswered, or asked under another policy, the person is asked again. The
/// token is spent here once, after its answer was found well-formed.
///
/// # Errors
/// [`ProxyError::BadRetry`] for a malformed answer (the token stays unspent);
/// [`TokenError::AlreadyUsed`] for a second retry with the same token.
pub(super) fn answered(
    app: &Arc<App>,
    req: ModernRequest,
    who: Principal,
    (claims, answers): (&Claims, &Map<String, Value>),
) -> Result<Taken, ProxyError> {
    if app.is_draining() {
        // Checked before the token is spent: the client may take it to another replica.
        return Err(ProxyError::Overloaded("the proxy is shutting down".into()));
    }
    let Some(rule) = rule(app, &req) else {
        // Not gated (any more): the approval is not needed.
        return Ok(Taken::Started(start_call(app, req, who, (true, None))));
    };
    if claims.approval.as_deref() != Some(rule.version.as_str()) {
        return ask(app, &req, &who, rule).map(Taken::Answered);
    }
    let verdict = verdict(rule, answers.get(APPROVAL_KEY))?;
    if !app.approvals.first(&claims.token_id) {
        return Err(TokenError::AlreadyUsed.into());
    }
    match verdict {
        Verdict::Unanswered => ask(app, &req, &who, rule).map(Taken::Answered),
        Verdict::Declined => {
            audit(app, &req, &who, rule, Decision::Declined);
            let result = json!({
                "resultType": "complete",
                "content": [{"type": "text", "text": rule.on_decline}],
                "isError": true,
            });
            let body = jsonrpc::response_bytes(&req.id, &jsonrpc::text(&result));
            let resp = edge::json(StatusCode::OK, HeaderMap::new(), body);
            Ok(Taken::Answered(resp))
        }
        Verdict::Approved => {
            audit(app, &req, &who, rule, Decision::Approved);
            Ok(Taken::Started(start_call(app, req, who, (true, None))))
        }
    }
}

/// A legacy client's body that calls a gated tool (alone or in a batch): the answer refusing
/// it, since a legacy client cannot be asked yet. `None` lets the body through.
pub(super) fn refuse_legacy(app: &App, body: &[u8]) -> Option<Response<Body>> {
    if !app.config.approval.is_enabled() {
        return None;
    }
    let parsed: Value = serde_json::from_slice(body).ok()?;
    let messages = match &parsed {
        Value::Array(batch) => batch.iter().collect(),
        one => vec![one],
    };
    let gated = messages.into_iter().find_map(|m| {
        let tool = m.get("params")?.get("name")?.as_str()?;
        let rule = (m.get("method")? == "tools/call")
            .then(|| app.config.approval.rule_for(tool))
            .flatten()?;
        Some((m.get("id").cloned().unwrap_or(Value::Null), tool, rule))
    })?;
    let (id, tool, rule) = gated;
    app.metrics.approvals.decided(Decision::LegacyRefused);
    tracing::info!(
        tool,
        policy = %rule.pattern,
        decision = Decision::LegacyRefused.as_str(),
        "approval gate"
    );
    let error = ErrorObject {
        code: INVALID_REQUEST,
        message: format!(
            "the tool `{tool}` runs only after a person approves it, which this proxy asks of 2026-07-28 clients only"
        ),
        data: None,
    };
    let id = serde_json::value::to_raw_value(&id).ok();
    let body = jsonrpc::error_bytes(id.as_deref(), &error);
    Some(edge::json(StatusCode::OK, HeaderMap::new(), body))
}

// The elicitation's params: the message with the arguments put in, and the form.
fn form(rule: &ApprovalRule, arguments: &Value) -> Value {
    json!({
        "mode": "form",
        "message": render(&rule.message, arguments),
        "requestedSchema": requested_schema(rule),
    })
}

// The form: `approve` (required) and the policy's extra fields.
fn requested_schema(rule: &ApprovalRule) -> Value {
    let mut properties = Map::new();
    properties.insert(
        "approve".into(),
        json!({"type": "boolean", "title": "Approve", "description": "Let this call run"}),
    );
    let mut required = vec![Value::from("approve")];
    if let Some(extra) = &rule.schema {
        if let Some(p) = extra.get("properties").and_then(Value::as_object) {
            properties.extend(p.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        if let Some(r) = extra.get("required").and_then(Value::as_array) {
            required.extend(r.iter().cloned());
        }
    }
    json!({"type": "object", "properties": properties, "required": required})
}

// `{name}` → the argument `name` as plain text (strings as they are, other values as JSON),
// cut at `MAX_VALUE_CHARS`; an argument not given reads `(not given)`.
fn render(template: &str, arguments: &Value) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let Some(len) = rest[open..].find('}') else {
            break;
        };
        let name = &rest[open + 1..open + len];
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_alphanumeric() || c == '_' || c == '-')
        {
            out.push_str(&rest[..=open]);
            rest = &rest[open + 1..];
            continue;
        }
        out.push_str(&rest[..open]);
        let value = match arguments.get(name) {
            None => "(not given)".to_owned(),
            Some(Value::String(s)) => s.clone(),
            Some(v) => jsonrpc::text(v),
        };
        push_cut(&mut out, &value);
        rest = &rest[open + len + 1..];
    }
    out.push_str(rest);
    out
}

fn push_cut(out: &mut String, value: &str) {
    let mut chars = value.chars();
    out.extend(chars.by_ref().take(MAX_VALUE_CHARS));
    if chars.next().is_some() {
        out.push('…');
    }
}

// The person's answer: its shape and the form checked (a malformed one is the client's fault,
// the token not spent), then approved only on `accept` with `approve: true`.
fn verdict(rule: &ApprovalRule, answer: Option<&Value>) -> Result<Verdict, ProxyError> {
    let Some(answer) = answer else {
        return Ok(Verdict::Unanswered);
    };
    let params = json!({"requestedSchema": requested_schema(rule)});
    let asked = Asked {
        key: APPROVAL_KEY.into(),
        kind: InputKind::Elicitation,
        schema: input::compile_schema(InputKind::Elicitation, Some(&params)),
    };
    asked.check(answer).map_err(|why| {
        ProxyError::BadRetry(format!("inputResponses[\"{APPROVAL_KEY}\"]: {why}"))
    })?;
    let accepted = answer.get("action").and_then(Value::as_str) == Some("accept");
    let approve = answer.pointer("/content/approve").and_then(Value::as_bool);
    Ok(if accepted && approve == Some(true) {
        Verdict::Approved
    } else {
        Verdict::Declined
    })
}

// One audit line per decision (argument values only with `approval.log_arguments`), and the
// metric.
fn audit(app: &App, req: &ModernRequest, who: &Principal, rule: &ApprovalRule, d: Decision) {
    app.metrics.approvals.decided(d);
    let arguments = app
        .config
        .approval
        .log_arguments
        .then(|| jsonrpc::text(req.arguments()));
    tracing::info!(
        principal = %who.digest,
        tool = req.target(),
        policy = %rule.pattern,
        decision = d.as_str(),
        arguments = arguments.as_deref(),
        "approval gate"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn rule(toml: &str) -> ApprovalRule {
        let c = Config::from_toml_str(&format!("[approval.tools.t]\n{toml}\n")).unwrap();
        c.approval.rules[0].clone()
    }

    #[test]
    fn a_message_names_arguments_as_plain_text_bounded() {
        let args = json!({"repo": "acme/site", "n": 3, "long": "x".repeat(300), "obj": {"a": 1}});
        assert_eq!(
            render("Delete {repo} ({n})?", &args),
            "Delete acme/site (3)?"
        );
        assert_eq!(render("{missing}!", &args), "(not given)!");
        assert_eq!(render("{obj}", &args), r#"{"a":1}"#);
        let long = render("{long}", &args);
        assert_eq!(long.chars().count(), MAX_VALUE_CHARS + 1);
        assert!(long.ends_with('…'));
        assert_eq!(
            render("{ not a name } {repo", &args),
            "{ not a name } {repo"
        );
        assert_eq!(render("{{repo}}", &args), "{acme/site}");
    }

    #[test]
    fn the_form_asks_approve_and_the_policy_fields() {
        let r = rule(
            "schema = { properties = { reason = { type = \"string\" } }, required = [\"reason\"] }",
        );
        let s = requested_schema(&r);
        assert_eq!(s["required"], json!(["approve", "reason"]));
        assert_eq!(s["properties"]["reason"]["type"], "string");
        assert_eq!(s["properties"]["approve"]["type"], "boolean");
    }

    #[test]
    fn only_accept_with_approve_true_approves() {
        let r = rule("");
        let v = |a: Value| verdict(&r, Some(&a));
        assert_eq!(
            v(json!({"action": "accept", "content": {"approve": true}})).unwrap(),
            Verdict::Approved
        );
        for declined in [
            json!({"action": "accept", "content": {"approve": false}}),
            json!({"action": "decline"}),
            json!({"action": "cancel"}),
        ] {
            assert_eq!(
                v(declined.clone()).unwrap(),
                Verdict::Declined,
                "{declined}"
            );
        }
        assert_eq!(verdict(&r, None).unwrap(), Verdict::Unanswered);
        assert!(
            v(json!({"action": "accept", "content": {}})).is_err(),
            "approve is required"
        );
        assert!(v(json!({"action": "maybe"})).is_err());
        assert!(v(json!({"action": "accept", "content": {"approve": "yes"}})).is_err());
    }
}
