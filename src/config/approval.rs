//! `[approval]`: tools a person must approve before the upstream sees the call. Each entry of
//! `[approval.tools]` is keyed by a tool name or a glob (`delete_*`) and says what to ask
//! (`message`, a template naming arguments), which extra fields the person fills in (`schema`,
//! an elicitation `requestedSchema`) and what a declined call answers (`on_decline`).

use std::collections::BTreeMap;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::error::{invalid, ConfigError};

/// Longest `message` template.
pub const MAX_APPROVAL_MESSAGE_BYTES: usize = 1024;

/// `[approval]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawApproval {
    /// `log_arguments`
    pub log_arguments: Option<bool>,
    /// `[approval.tools.<name or glob>]`
    pub tools: BTreeMap<String, RawToolApproval>,
}

/// `[approval.tools.<name or glob>]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawToolApproval {
    /// `message`
    pub message: Option<String>,
    /// `schema`
    pub schema: Option<toml::Value>,
    /// `on_decline`
    pub on_decline: Option<String>,
}

/// `[approval]`, validated.
#[derive(Debug, Clone, Default)]
pub struct Approval {
    /// Whether the audit line of a decision names the call's argument values.
    pub log_arguments: bool,
    /// The gated tools: exact names first, then globs (longest pattern first).
    pub rules: Vec<ApprovalRule>,
}

/// One gated tool (or glob of tools).
#[derive(Debug, Clone)]
pub struct ApprovalRule {
    /// The key it was written under: a tool name or a glob.
    pub pattern: String,
    glob: Option<glob::Pattern>,
    /// What the person is asked; `{name}` stands for the argument `name`.
    pub message: String,
    /// Extra fields of the form: an object schema (`properties`, `required`), or none.
    pub schema: Option<serde_json::Value>,
    /// The text of the result when the person declines.
    pub on_decline: String,
    /// Digest of what the person is shown and decides on: an approval names it, so one given
    /// under another policy is not taken.
    pub version: String,
}

impl Approval {
    pub(super) fn from_raw(raw: RawApproval) -> Result<Self, ConfigError> {
        let mut rules = raw
            .tools
            .into_iter()
            .map(|(pattern, t)| ApprovalRule::from_raw(pattern, t))
            .collect::<Result<Vec<_>, _>>()?;
        // Exact names win over globs; among globs the longer (more specific) pattern wins.
        rules.sort_by_key(|r| (r.glob.is_some(), std::cmp::Reverse(r.pattern.len())));
        Ok(Self {
            log_arguments: raw.log_arguments.unwrap_or(false),
            rules,
        })
    }

    /// The rule gating `tool`, if any.
    pub fn rule_for(&self, tool: &str) -> Option<&ApprovalRule> {
        self.rules.iter().find(|r| r.matches(tool))
    }

    /// Whether any tool is gated.
    pub fn is_enabled(&self) -> bool {
        !self.rules.is_empty()
    }
}

impl ApprovalRule {
    /// Whether this rule's name or glob matches `tool`.
    pub fn matches(&self, tool: &str) -> bool {
        match &self.glob {
            None => self.pattern == tool,
            Some(g) => g.matches(tool),
        }
    }

    fn from_raw(pattern: String, t: RawToolApproval) -> Result<Self, ConfigError> {
        let key = "approval.tools";
        let is_glob = pattern.contains(['*', '?', '[']);
        let glob = if is_glob {
            Some(
                glob::Pattern::new(&pattern)
                    .map_err(|e| invalid(key, format!("`{pattern}`: {e}")))?,
            )
        } else {
            None
        };
        let message = t
            .message
            .unwrap_or_else(|| format!("Allow the tool `{pattern}` to run?"));
        if message.len() > MAX_APPROVAL_MESSAGE_BYTES {
            return Err(invalid(
                key,
                format!("`{pattern}`: message is over {MAX_APPROVAL_MESSAGE_BYTES} bytes"),
            ));
        }
        let schema = t.schema.map(|s| form_schema(&pattern, s)).transpose()?;
        let on_decline = t
            .on_decline
            .unwrap_or_else(|| "The call was not approved, so it did not run.".to_owned());
        let version = version(&message, schema.as_ref(), &on_decline);
        Ok(Self {
            pattern,
            glob,
            message,
            schema,
            on_decline,
            version,
        })
    }
}

// The extra fields: an object schema whose properties do not take the name `approve`.
fn form_schema(pattern: &str, raw: toml::Value) -> Result<serde_json::Value, ConfigError> {
    let key = "approval.tools";
    let schema = serde_json::to_value(raw).map_err(|e| invalid(key, e))?;
    let Some(props) = schema.get("properties").and_then(|p| p.as_object()) else {
        return Err(invalid(
            key,
            format!("`{pattern}`: schema needs a `properties` table"),
        ));
    };
    if props.contains_key("approve") {
        return Err(invalid(
            key,
            format!("`{pattern}`: `approve` is the proxy's own field"),
        ));
    }
    let required_ok = schema.get("required").is_none_or(|r| {
        r.as_array()
            .is_some_and(|a| a.iter().all(|v| v.is_string()))
    });
    if !required_ok {
        return Err(invalid(
            key,
            format!("`{pattern}`: schema `required` is a list of names"),
        ));
    }
    Ok(schema)
}

fn version(message: &str, schema: Option<&serde_json::Value>, on_decline: &str) -> String {
    let mut h = Sha256::new();
    let schema = schema.map(|s| serde_json::to_string(s).unwrap_or_default());
    for part in [message, schema.as_deref().unwrap_or(""), on_decline] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    hex::encode(&h.finalize()[..8])
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    #[test]
    fn exact_names_win_over_globs_and_longer_globs_over_shorter() {
        let c = Config::from_toml_str(
            "[approval.tools.\"*\"]\nmessage = \"any\"\n[approval.tools.\"delete_*\"]\nmessage = \"delete\"\n[approval.tools.delete_repo]\nmessage = \"repo\"\n",
        )
        .unwrap();
        let a = &c.approval;
        assert_eq!(a.rule_for("delete_repo").unwrap().message, "repo");
        assert_eq!(a.rule_for("delete_user").unwrap().message, "delete");
        assert_eq!(a.rule_for("echo").unwrap().message, "any");
        let none = Config::from_toml_str("").unwrap();
        assert!(none.approval.rule_for("echo").is_none());
        assert!(!none.approval.is_enabled());
    }

    #[test]
    fn a_schema_must_be_a_form_that_leaves_approve_to_the_proxy() {
        for bad in [
            "schema = { type = \"object\" }",
            "schema = { properties = { approve = { type = \"string\" } } }",
            "schema = { properties = {}, required = [1] }",
            "message = \"[\"\n[approval.tools.\"[\"]",
        ] {
            let text = format!("[approval.tools.\"x*\"]\n{bad}\n");
            let err = Config::from_toml_str(&text).unwrap_err().to_string();
            assert!(err.contains("approval.tools"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_message_is_bounded_and_defaults_name_the_tool() {
        let long = "x".repeat(super::MAX_APPROVAL_MESSAGE_BYTES + 1);
        let err = Config::from_toml_str(&format!("[approval.tools.t]\nmessage = \"{long}\"\n"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("approval.tools") && err.contains("1024"),
            "{err}"
        );
        let c = Config::from_toml_str("[approval.tools.t]\n").unwrap();
        let rule = &c.approval.rules[0];
        assert_eq!(rule.message, "Allow the tool `t` to run?");
        assert!(rule.schema.is_none());
        assert!(!c.approval.log_arguments);
    }

    #[test]
    fn the_version_changes_with_what_the_person_sees() {
        let v = |m: &str| {
            let c =
                Config::from_toml_str(&format!("[approval.tools.t]\nmessage = \"{m}\"\n")).unwrap();
            c.approval.rules[0].version.clone()
        };
        assert_eq!(v("a"), v("a"));
        assert_ne!(v("a"), v("b"));
    }
}
