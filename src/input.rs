//! Input requests: what the upstream may ask a client for mid-call, how a legacy server request
//! becomes a modern embedded `inputRequests` entry, capability gating, and answer validation.

use std::sync::Arc;

use serde_json::{json, Map, Value};

use crate::ops::metrics::Capability;

mod schemas;

/// The three kinds of input a server may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InputKind {
    /// `elicitation/create`
    Elicitation,
    /// `sampling/createMessage`
    Sampling,
    /// `roots/list`
    Roots,
}

impl InputKind {
    /// The kind behind a legacy server request method, if it is one.
    pub(crate) fn from_method(method: &str) -> Option<Self> {
        match method {
            "elicitation/create" => Some(Self::Elicitation),
            "sampling/createMessage" => Some(Self::Sampling),
            "roots/list" => Some(Self::Roots),
            _ => None,
        }
    }

    /// Prefix of the `inputRequests` keys minted for this kind.
    pub(crate) fn key_prefix(self) -> &'static str {
        match self {
            Self::Elicitation => "elicitation",
            Self::Sampling => "sampling",
            Self::Roots => "roots",
        }
    }

    /// The method name.
    pub(crate) fn method(self) -> &'static str {
        match self {
            Self::Elicitation => "elicitation/create",
            Self::Sampling => "sampling/createMessage",
            Self::Roots => "roots/list",
        }
    }
}

/// Converts legacy params into the embedded modern request `{method, params}`: legacy `_meta`,
/// `task` and URL-mode `elicitationId` are dropped (the id is returned to be kept proxy-side).
/// The params are moved into it, not copied.
pub(crate) fn to_embedded(kind: InputKind, params: Option<Value>) -> (Value, Option<String>) {
    let mut p = match params {
        Some(Value::Object(p)) => p,
        _ => Map::new(),
    };
    p.remove("_meta");
    p.remove("task");
    let elicitation_id = match p.remove("elicitationId") {
        Some(Value::String(s)) => Some(s),
        _ => None,
    };
    let mut embedded = Map::new();
    embedded.insert("method".into(), kind.method().into());
    if !p.is_empty() || kind != InputKind::Roots {
        embedded.insert("params".into(), Value::Object(p));
    }
    (Value::Object(embedded), elicitation_id)
}

/// Checks that the request's declared capabilities allow relaying this input request.
///
/// # Errors
/// The `requiredCapabilities` object to put in a -32021 error.
pub(crate) fn check_capability(
    kind: InputKind,
    params: Option<&Value>,
    caps: &Value,
) -> Result<(), Value> {
    let param = |k: &str| params.and_then(|p| p.get(k));
    match kind {
        InputKind::Elicitation => {
            let mode = param("mode").and_then(Value::as_str).unwrap_or("form");
            let declared = caps.get("elicitation");
            let ok = match (mode, declared) {
                (_, None) => false,
                ("url", Some(e)) => e.get("url").is_some(),
                // `elicitation: {}` means form-only; a declaration of url alone excludes form.
                (_, Some(e)) => e.get("form").is_some() || e.get("url").is_none(),
            };
            if ok {
                Ok(())
            } else if mode == "url" {
                Err(json!({"elicitation": {"url": {}}}))
            } else {
                Err(json!({"elicitation": {"form": {}}}))
            }
        }
        InputKind::Sampling => {
            let Some(s) = caps.get("sampling") else {
                return Err(json!({"sampling": {}}));
            };
            let wants_tools = param("tools").is_some() || param("toolChoice").is_some();
            if wants_tools && s.get("tools").is_none() {
                return Err(json!({"sampling": {"tools": {}}}));
            }
            Ok(())
        }
        InputKind::Roots => caps
            .get("roots")
            .map(|_| ())
            .ok_or_else(|| json!({"roots": {}})),
    }
}

/// The metrics label of a `requiredCapabilities` object made by [`check_capability`].
pub(crate) fn missing_label(required: &Value) -> Capability {
    if let Some(e) = required.get("elicitation") {
        return if e.get("url").is_some() {
            Capability::ElicitationUrl
        } else {
            Capability::ElicitationForm
        };
    }
    match required.get("sampling") {
        Some(s) if s.get("tools").is_some() => Capability::SamplingTools,
        Some(_) => Capability::Sampling,
        None => Capability::Roots,
    }
}

/// One key of a round as a retry must answer it: its kind and, for a form elicitation, the
/// compiled `requestedSchema` the accepted content must match.
#[derive(Debug, Clone)]
pub(crate) struct Asked {
    /// The `inputRequests` key.
    pub(crate) key: String,
    /// What was asked.
    pub(crate) kind: InputKind,
    /// The elicitation's `requestedSchema`, compiled (`None` for other kinds and for schemas
    /// that do not compile, whose answers then pass unchecked, as before).
    pub(crate) schema: Option<Arc<jsonschema::Validator>>,
}

impl Asked {
    /// Checks an answer: its shape for the kind, then an accepted elicitation's content against
    /// the requested schema.
    ///
    /// # Errors
    /// `inputResponses["<key>"]: <what is wrong>` (the field and the rule, never the value
    /// given): the one form every way an answer comes in reports it.
    pub(crate) fn check(&self, answer: &Value) -> Result<(), String> {
        self.fits(answer)
            .map_err(|why| format!("inputResponses[\"{}\"]: {why}", self.key))
    }

    fn fits(&self, answer: &Value) -> Result<(), String> {
        validate_answer(self.kind, answer)?;
        let Some(schema) = &self.schema else {
            return Ok(());
        };
        if answer.get("action").and_then(Value::as_str) != Some("accept") {
            return Ok(());
        }
        let empty = json!({});
        let content = answer.get("content").unwrap_or(&empty);
        let violation = schema
            .iter_errors(content)
            .next()
            .map(|e| schema_violation(&e));
        violation.map_or(Ok(()), Err)
    }
}

impl Asked {
    /// What answers the embedded request `embedded` (`{method, params}`) listed under `key`:
    /// its kind from the method, its schema compiled from the params (remembered by its text,
    /// so a record that keeps only what the client sees costs no compile per answer). `None`
    /// when the method is not one of the three kinds.
    pub(crate) fn from_embedded(key: &str, embedded: &Value) -> Option<Self> {
        let kind = InputKind::from_method(embedded.get("method")?.as_str()?)?;
        Some(Self {
            key: key.to_owned(),
            kind,
            schema: compile_schema(kind, embedded.get("params")),
        })
    }
}

/// The one answer check: the answers in `answers` to the requests in `asked` (keys asked for
/// and not answered are left out, as are answers to keys not asked for), each checked against
/// what it answers. All or nothing: one answer that does not fit refuses them all.
///
/// # Errors
/// `inputResponses["<key>"]: <what is wrong>`, for the first answer that does not fit (never
/// its value: answers are not echoed or logged).
pub(crate) fn answered<'a>(
    asked: impl IntoIterator<Item = &'a Asked>,
    answers: &'a Map<String, Value>,
) -> Result<Vec<(&'a Asked, &'a Value)>, String> {
    let mut taken = Vec::new();
    for a in asked {
        if let Some(answer) = answers.get(&a.key) {
            a.check(answer)?;
            taken.push((a, answer));
        }
    }
    Ok(taken)
}

/// The compiled `requestedSchema` of a form elicitation (remembered by its text: see
/// [`schemas`]). Compiled with no resolver for remote or file `$ref`s: the schema comes from
/// the upstream, and the proxy fetches nothing for it.
pub(crate) fn compile_schema(
    kind: InputKind,
    params: Option<&Value>,
) -> Option<Arc<jsonschema::Validator>> {
    if kind != InputKind::Elicitation {
        return None;
    }
    schemas::compiled(params?.get("requestedSchema")?)
}

// Names the field and the rule an answer broke, not the value (answers are never echoed or
// logged).
fn schema_violation(e: &jsonschema::ValidationError<'_>) -> String {
    let path = e.instance_path().as_str().replace('/', ".");
    match e.kind() {
        jsonschema::error::ValidationErrorKind::Required { property } => {
            let name = property.as_str().unwrap_or("a field");
            format!("content{path}.{name} is required by the requested schema")
        }
        kind => format!(
            "content{path} does not match the requested schema ({})",
            kind.keyword()
        ),
    }
}

/// Validates an answer's shape for its kind.
///
/// # Errors
/// A message naming what is wrong.
pub(crate) fn validate_answer(kind: InputKind, answer: &Value) -> Result<(), String> {
    let Some(obj) = answer.as_object() else {
        return Err("must be an object".into());
    };
    match kind {
        InputKind::Elicitation => {
            match obj.get("action").and_then(Value::as_str) {
                Some("accept" | "decline" | "cancel") => {}
                _ => return Err("elicitation result needs action accept, decline or cancel".into()),
            }
            if obj.get("content").is_some_and(|c| !c.is_object()) {
                return Err("elicitation content must be an object".into());
            }
        }
        InputKind::Sampling => {
            if !obj.get("role").is_some_and(Value::is_string) {
                return Err("sampling result needs a role".into());
            }
            if !obj
                .get("content")
                .is_some_and(|c| c.is_object() || c.is_array())
            {
                return Err("sampling result needs content".into());
            }
            if !obj.get("model").is_some_and(Value::is_string) {
                return Err("sampling result needs a model".into());
            }
        }
        InputKind::Roots => {
            let Some(roots) = obj.get("roots").and_then(Value::as_array) else {
                return Err("roots result needs a roots array".into());
            };
            if roots
                .iter()
                .any(|r| !r.get("uri").is_some_and(Value::is_string))
            {
                return Err("every root needs a uri".into());
            }
        }
    }
    Ok(())
}

/// The answer given to the upstream when a parked request is abandoned (TTL, cancellation).
pub(crate) fn cancel_answer(kind: InputKind) -> Option<Value> {
    match kind {
        InputKind::Elicitation => Some(json!({"action": "cancel"})),
        InputKind::Sampling | InputKind::Roots => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_shape_drops_legacy_fields() {
        let p = json!({"mode":"url","message":"m","url":"https://x","elicitationId":"e1","_meta":{"a":1},"task":{}});
        let (e, id) = to_embedded(InputKind::Elicitation, Some(p));
        assert_eq!(
            e,
            json!({"method":"elicitation/create","params":{"mode":"url","message":"m","url":"https://x"}})
        );
        assert_eq!(id.as_deref(), Some("e1"));
        let (e, _) = to_embedded(InputKind::Roots, None);
        assert_eq!(e, json!({"method":"roots/list"}));
    }

    #[test]
    fn capability_gating() {
        let form = json!({"message":"m","requestedSchema":{"type":"object","properties":{}}});
        let url = json!({"mode":"url","message":"m","url":"https://x"});
        assert!(check_capability(
            InputKind::Elicitation,
            Some(&form),
            &json!({"elicitation":{}})
        )
        .is_ok());
        assert!(check_capability(
            InputKind::Elicitation,
            Some(&url),
            &json!({"elicitation":{}})
        )
        .is_err());
        assert!(check_capability(
            InputKind::Elicitation,
            Some(&url),
            &json!({"elicitation":{"url":{}}})
        )
        .is_ok());
        assert!(check_capability(
            InputKind::Elicitation,
            Some(&form),
            &json!({"elicitation":{"url":{}}})
        )
        .is_err());
        assert_eq!(
            check_capability(InputKind::Elicitation, Some(&form), &json!({})).unwrap_err(),
            json!({"elicitation":{"form":{}}})
        );
        let tools = json!({"messages":[],"maxTokens":5,"tools":[]});
        assert_eq!(
            check_capability(InputKind::Sampling, Some(&tools), &json!({"sampling":{}}))
                .unwrap_err(),
            json!({"sampling":{"tools":{}}})
        );
        assert!(check_capability(
            InputKind::Sampling,
            Some(&tools),
            &json!({"sampling":{"tools":{}}})
        )
        .is_ok());
        assert!(check_capability(InputKind::Roots, None, &json!({"roots":{}})).is_ok());
        assert!(check_capability(InputKind::Roots, None, &json!({"sampling":{}})).is_err());
    }

    #[test]
    fn accepted_content_must_match_the_requested_schema() {
        let params = json!({"message": "m", "requestedSchema": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1},
                "age": {"type": "integer", "minimum": 0},
                "color": {"type": "string", "enum": ["red", "blue"]},
            },
            "required": ["name"],
        }});
        let asked = Asked {
            key: "elicitation-1".into(),
            kind: InputKind::Elicitation,
            schema: compile_schema(InputKind::Elicitation, Some(&params)),
        };
        let accept = |content: Value| json!({"action": "accept", "content": content});
        assert!(asked
            .check(&accept(json!({"name": "Ada", "age": 36})))
            .is_ok());
        let e = asked.check(&accept(json!({"name": 5}))).unwrap_err();
        assert!(e.contains("content.name") && e.contains("type"), "{e}");
        let e = asked.check(&accept(json!({"age": 3}))).unwrap_err();
        assert!(e.contains("content.name is required"), "{e}");
        let e = asked
            .check(&accept(json!({"name": "Ada", "color": "green"})))
            .unwrap_err();
        assert!(
            e.contains("content.color") && !e.contains("green"),
            "never echoes the value: {e}"
        );
        assert!(
            asked.check(&json!({"action": "decline"})).is_ok(),
            "only accepted content is checked"
        );
        assert!(
            asked.check(&json!({"action": "maybe"})).is_err(),
            "the shape still is"
        );
        let remote = json!({"requestedSchema": {"$ref": "http://127.0.0.1:9/schema.json"}});
        assert!(
            compile_schema(InputKind::Elicitation, Some(&remote)).is_none(),
            "remote references are never fetched"
        );
        assert!(compile_schema(InputKind::Sampling, Some(&params)).is_none());
    }

    #[test]
    fn answers_are_checked_all_or_nothing_under_one_error_form() {
        let embedded = json!({"method": "elicitation/create", "params": {"message": "m",
            "requestedSchema": {"type": "object", "properties": {"n": {"type": "integer"}}}}});
        let one = Asked::from_embedded("elicitation-1", &embedded).unwrap();
        let two = Asked::from_embedded("roots-2", &json!({"method": "roots/list"})).unwrap();
        assert!(one.schema.is_some() && two.kind == InputKind::Roots);
        assert!(Asked::from_embedded("x", &json!({"method": "tools/call"})).is_none());
        let asked = [one, two];
        let answers = json!({"elicitation-1": {"action": "accept", "content": {"n": 3}},
            "other": {"ignored": true}});
        let taken = answered(&asked, answers.as_object().unwrap()).unwrap();
        assert_eq!(
            taken.len(),
            1,
            "unasked keys are left out, unanswered ones too"
        );
        assert_eq!(taken[0].0.key, "elicitation-1");
        let bad = json!({"elicitation-1": {"action": "accept", "content": {"n": 3}},
            "roots-2": {"roots": [{}]}});
        let e = answered(&asked, bad.as_object().unwrap()).unwrap_err();
        assert_eq!(e, "inputResponses[\"roots-2\"]: every root needs a uri");
    }

    #[test]
    fn answer_shapes() {
        assert!(validate_answer(
            InputKind::Elicitation,
            &json!({"action":"accept","content":{"a":1}})
        )
        .is_ok());
        assert!(validate_answer(InputKind::Elicitation, &json!({"action":"maybe"})).is_err());
        assert!(validate_answer(InputKind::Elicitation, &json!("accept")).is_err());
        assert!(validate_answer(
            InputKind::Sampling,
            &json!({"role":"assistant","content":{"type":"text","text":"x"},"model":"m"})
        )
        .is_ok());
        assert!(validate_answer(InputKind::Sampling, &json!({"role":"assistant"})).is_err());
        assert!(validate_answer(InputKind::Roots, &json!({"roots":[{"uri":"file:///a"}]})).is_ok());
        assert!(validate_answer(InputKind::Roots, &json!({"roots":[{}]})).is_err());
    }
}
