//! Targets of the client's answers: a `tasks/update`'s `inputResponses` checked against what the
//! upstream asked (`input::Asked`), and an answer to the approval form (`front::approval`).

use std::sync::OnceLock;

use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::config::{ApprovalRule, Config};
use crate::front::approval::verdict_of;
use crate::front::params::Params;
use crate::input::{self, Asked, InputKind};

/// The lock sign: no message of the proxy's own holds it, so a refusal holding a string of the
/// answer that has it echoed the answer.
const MARK: char = '\u{1f512}';

/// `tasks/update` answers. The input is a line holding the upstream's requests as JSON (an object:
/// key → `{"method", "params"}`, as a legacy server asks), then the `tasks/update` params as the
/// client sent them (JSON text, read by the params walker). Each answer in `inputResponses` to a
/// key asked is checked as the task's record checks it (`Asked::check`). Never a panic; a
/// refusal never holds a string value of the answer (one with the lock sign 🔒 is looked for:
/// the message names the field and the rule, never the value; keys are field names and may
/// appear); an accepted `accept` of a form elicitation matches its compiled schema; and the
/// proxy's own answer to an abandoned request (`input::cancel_answer`) passes its own check.
pub fn tasks_update(data: &[u8]) {
    let Some(newline) = data.iter().position(|b| *b == b'\n') else {
        return;
    };
    let Ok(Value::Object(requests)) = serde_json::from_slice::<Value>(&data[..newline]) else {
        return;
    };
    let asked: Vec<Asked> = requests
        .iter()
        .filter_map(|(key, request)| {
            let kind = InputKind::from_method(request.get("method")?.as_str()?)?;
            let schema = input::compile_schema(kind, request.get("params"));
            Some(Asked {
                key: key.clone(),
                kind,
                schema,
            })
        })
        .collect();
    for a in &asked {
        if let Some(cancel) = input::cancel_answer(a.kind) {
            assert_eq!(a.check(&cancel), Ok(()), "the proxy's own cancel answer");
        }
    }
    let Ok(raw) = serde_json::from_slice::<Box<RawValue>>(&data[newline + 1..]) else {
        return;
    };
    let Ok(params) = Params::parse(Some(raw)) else {
        return;
    };
    let Some(Value::Object(answers)) = params.get::<Value>("inputResponses") else {
        return;
    };
    for a in asked.iter().filter(|a| answers.contains_key(&a.key)) {
        let answer = &answers[&a.key];
        match a.check(answer) {
            Ok(()) => matches_schema(a, answer),
            Err(why) => not_echoed(&why, answer),
        }
    }
}

/// An answer to the approval form. The input is the answer (JSON), as a retry's
/// `inputResponses["approval"]` or a legacy client's `result` carries it, decided under two
/// policies: the bare form (`approve`, a required boolean) and one with an extra required field
/// (`reason`, a string of at most 20 characters). The verdict must be what the form says, read
/// here apart from the proxy's code (MCP's elicitation result and the form's JSON Schema):
/// malformed (not an object; `action` not `accept`, `decline` or `cancel`; `content` not an
/// object; accepted without a boolean `approve`, or without a valid `reason` where the policy
/// asks one), approved (accepted with `approve: true`), else declined; a malformed answer's
/// error never holds a string of it (see [`tasks_update`]).
pub fn approval_answer(data: &[u8]) {
    let Ok(answer) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let (bare, reasoned) = approval_rules();
    for (rule, asks_reason) in [(bare, false), (reasoned, true)] {
        assert_eq!(verdict_of(rule, None), Ok(None), "no answer is unanswered");
        let verdict = verdict_of(rule, Some(&answer));
        match (verdict, approval_expected(&answer, asks_reason)) {
            (Ok(Some(got)), Some(expected)) => assert_eq!(got, expected, "approved?"),
            (Err(why), None) => not_echoed(&why, &answer),
            (got, expected) => panic!("verdict {got:?}, the form says {expected:?}"),
        }
    }
}

// An accepted form answer matches the schema it was checked against.
fn matches_schema(asked: &Asked, answer: &Value) {
    let Some(schema) = &asked.schema else {
        return;
    };
    if answer.get("action").and_then(Value::as_str) == Some("accept") {
        let content = answer
            .get("content")
            .cloned()
            .unwrap_or(Value::Object(Map::new()));
        assert!(schema.is_valid(&content), "an answer off its schema passed");
    }
}

// No string of `answer` that holds the lock sign is in the refusal `why`.
fn not_echoed(why: &str, answer: &Value) {
    let mut strings = Vec::new();
    marked_strings(answer, &mut strings);
    for s in strings {
        assert!(!why.contains(s), "a refusal echoed the answer: {why}");
        let quoted = crate::jsonrpc::text(&Value::from(s));
        assert!(
            !why.contains(quoted.trim_matches('"')),
            "echoed, escaped: {why}"
        );
    }
}

fn marked_strings<'v>(v: &'v Value, out: &mut Vec<&'v str>) {
    match v {
        Value::String(s) if s.contains(MARK) => out.push(s),
        Value::Array(items) => items.iter().for_each(|i| marked_strings(i, out)),
        Value::Object(m) => m.values().for_each(|i| marked_strings(i, out)),
        _ => {}
    }
}

// What the form says of `answer`: `None` malformed, else whether it approves.
fn approval_expected(answer: &Value, asks_reason: bool) -> Option<bool> {
    let answer = answer.as_object()?;
    let action = answer.get("action")?.as_str()?;
    if !["accept", "decline", "cancel"].contains(&action) {
        return None;
    }
    let content = match answer.get("content") {
        None => None,
        Some(Value::Object(c)) => Some(c),
        Some(_) => return None,
    };
    if action != "accept" {
        return Some(false);
    }
    let field = |name: &str| content.and_then(|c| c.get(name));
    let approve = field("approve")?.as_bool()?;
    if asks_reason {
        let reason = field("reason")?.as_str()?;
        if reason.chars().count() > 20 {
            return None;
        }
    }
    Some(approve)
}

// The two policies: the bare form, and one asking a reason.
fn approval_rules() -> (&'static ApprovalRule, &'static ApprovalRule) {
    static RULES: OnceLock<(ApprovalRule, ApprovalRule)> = OnceLock::new();
    let (bare, reasoned) = RULES.get_or_init(|| {
        let toml = "[approval.tools.bare]\n[approval.tools.reasoned]\n\
            schema = { properties = { reason = { type = \"string\", maxLength = 20 } }, \
            required = [\"reason\"] }\n";
        let Ok(config) = Config::from_toml_str(toml) else {
            panic!("the fuzz target's own approval policies do not parse");
        };
        let rule = |name: &str| config.approval.rule_for(name).cloned();
        match (rule("bare"), rule("reasoned")) {
            (Some(b), Some(r)) => (b, r),
            _ => panic!("the fuzz target's own approval policies are missing"),
        }
    });
    (bare, reasoned)
}
