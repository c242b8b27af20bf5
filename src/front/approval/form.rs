//! The approval form, pure: the message with the call's arguments put in, the form's schema,
//! what an answer means, and the audit of each decision. Modern (`approval`) and legacy
//! (`legacy`) clients are asked the same form.

use serde_json::{json, Map, Value};

use crate::app::App;
use crate::config::ApprovalRule;
use crate::error::ProxyError;
use crate::input::{self, Asked, InputKind};
use crate::jsonrpc;
use crate::ops::metrics::Decision;

/// The `inputRequests` key of the approval.
pub(super) const APPROVAL_KEY: &str = "approval";
/// Longest argument value put into a message, in characters (longer ones are cut, marked `…`).
const MAX_VALUE_CHARS: usize = 200;

/// What the person answered.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    Approved,
    Declined,
    Unanswered,
}

// The elicitation's params: the message with the arguments put in, and the form.
pub(super) fn form(rule: &ApprovalRule, arguments: &Value) -> Value {
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
pub(super) fn verdict(rule: &ApprovalRule, answer: Option<&Value>) -> Result<Verdict, ProxyError> {
    let Some(answer) = answer else {
        return Ok(Verdict::Unanswered);
    };
    let params = json!({"requestedSchema": requested_schema(rule)});
    let asked = Asked {
        key: APPROVAL_KEY.into(),
        kind: InputKind::Elicitation,
        schema: input::compile_schema(InputKind::Elicitation, Some(&params)),
    };
    asked.check(answer).map_err(ProxyError::BadRetry)?;
    let accepted = answer.get("action").and_then(Value::as_str) == Some("accept");
    let approve = answer.pointer("/content/approve").and_then(Value::as_bool);
    Ok(if accepted && approve == Some(true) {
        Verdict::Approved
    } else {
        Verdict::Declined
    })
}

/// One audit line per decision (argument values only with `approval.log_arguments`), and the
/// metric. The principal is named by its keyed label, never its digest (see
/// `KeySet::principal_label`).
pub(super) fn audit(
    app: &App,
    (principal, tool, arguments): (&str, &str, &Value),
    rule: &ApprovalRule,
    d: Decision,
) {
    app.metrics.approvals.decided(d);
    let arguments = app
        .config
        .approval
        .log_arguments
        .then(|| jsonrpc::text(arguments));
    let principal = app.tokens.principal_label(principal);
    tracing::info!(
        principal = principal.as_str(),
        tool,
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
    use serde_json::json;
    use std::sync::{Arc, Mutex};

    /// What a subscriber wrote.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    // The JSON log lines `f` writes.
    fn logged(f: impl FnOnce()) -> Vec<Value> {
        let out = Captured::default();
        let writer = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn gated_app(secret: &str) -> Arc<App> {
        let toml = format!(
            "[upstream]\nurl = \"http://127.0.0.1:9/mcp\"\n[state]\nsecret = \"{secret}\"\n\
             [approval.tools.delete_repo]\n"
        );
        App::new(Config::from_toml_str(&toml).unwrap()).unwrap()
    }

    // The `principal` of the audit line of a decision on `app` for the principal `digest`.
    fn audited_principal(app: &App, digest: &str) -> String {
        let rule = &app.config.approval.rules[0];
        let args = json!({"repo": "acme/site"});
        let lines = logged(|| audit(app, (digest, "delete_repo", &args), rule, Decision::Asked));
        let [line] = lines.as_slice() else {
            panic!("one audit line: {lines:?}")
        };
        assert_eq!(line["fields"]["message"], "approval gate", "{line}");
        assert!(!line.to_string().contains(digest), "{line}");
        line["fields"]["principal"].as_str().unwrap().to_owned()
    }

    #[tokio::test]
    async fn the_audit_line_names_the_principal_by_a_keyed_label_replicas_share() {
        const KEY: &str = "an-hs256-secret-of-at-least-32-bytes!!";
        // `principal = "header"`: the digest of a Basic header, which a weak password makes
        // guessable offline were it logged as it is.
        let digest = crate::state::principal_digest(Some(b"Basic dXNlcjpodW50ZXIy"));
        let label = audited_principal(&gated_app(KEY), &digest);
        assert_eq!(label.len(), 16, "{label}");
        assert!(!digest.contains(&label), "not a cut of the digest: {label}");
        assert_eq!(
            audited_principal(&gated_app(KEY), &digest),
            label,
            "another replica with the same keys logs the same label"
        );
        let other = gated_app("another-hs256-secret-of-32-bytes-or-more");
        assert_ne!(audited_principal(&other, &digest), label, "another key set");
    }

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
