//! Replay in the actor: whether the call is replay-safe (config, or the upstream's own tool
//! annotations), the journal its next token carries, and — for a call run again because its
//! owner is gone — answering the upstream's requests from the old token's journal. What the call
//! keeps of it is its `ReplayState` (pure, in `replay_state`).

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use super::Call;
use crate::config::ReplayMode;
use crate::input::{self, Asked, InputKind};
use crate::jsonrpc::{self, Message};
use crate::state::replay::{self, Journal, ToolHint, ToolHints};
use crate::upstream::Session;

/// Pages of `tools/list` read at most when looking for a tool's annotations.
const MAX_LIST_PAGES: usize = 20;
/// How long the `tools/list` of one look-up may take in all.
const LIST_TIMEOUT: Duration = Duration::from_secs(5);

impl Call {
    /// Whether this call may be run again elsewhere from its token; decided once, at its
    /// first round.
    pub(super) async fn replay_safe(&mut self) -> bool {
        if let Some(safe) = self.replay.decided() {
            return safe;
        }
        // A gated tool runs only on the approval it was given: never again from a token.
        let mode = if self.spec.gated {
            ReplayMode::Never
        } else {
            self.ctx.replay.mode(&self.spec.method, &self.spec.target)
        };
        let safe = match mode {
            ReplayMode::Always => true,
            ReplayMode::Never => false,
            ReplayMode::Annotations => {
                let session = self.session();
                tool_hint(&self.ctx.tool_hints, session, &self.spec.target)
                    .await
                    .is_some_and(|h| h.replay_safe)
            }
        };
        self.replay.decide(safe);
        safe
    }

    /// Whether the call keeps a journal of its answers: it is replay-safe, or it is a task whose
    /// record keeps one (adopted tasks are). Decided at its first server request, before the
    /// request is fingerprinted, since only a journal reads fingerprints.
    pub(super) async fn journaled(&mut self) -> bool {
        self.phase.task().is_some_and(|t| t.replay_safe) || self.replay_safe().await
    }

    /// The journal the next token carries: the answers so far and this round's fingerprints;
    /// `None` for a call that is not replay-safe or whose journal outgrew `replay.max_state`.
    pub(super) async fn journal(&mut self) -> Option<Journal> {
        if !self.replay_safe().await {
            return None;
        }
        let pending = self.rounds.fingerprints();
        self.replay.journal(pending, self.ctx.replay.max_state)
    }

    /// For a call run again from a token: answers `msg` upstream when the token's journal (or
    /// the retry that brought it) has the answer for a request with its fingerprint, valid for
    /// what it asks now. Returns whether it did.
    pub(super) async fn answered_from_journal(
        &mut self,
        session: &Session,
        msg: &Message,
        (kind, params): (InputKind, Option<&Value>),
    ) -> bool {
        if !self.replay.is_rerun() {
            return false;
        }
        let fp = replay::fingerprint(kind.method(), params);
        let Some(answer) = self.replay.replayed(&fp) else {
            return false;
        };
        let asked = Asked {
            key: String::new(),
            kind,
            schema: input::compile_schema(kind, params),
        };
        if asked.check(&answer).is_err() {
            return false;
        }
        let id = msg.id.as_ref().map_or("null", |i| i.get());
        if let Err(e) = session.answer(id, Ok(&jsonrpc::text(&answer))).await {
            tracing::debug!(error = %e, "could not replay an answer upstream");
            return false;
        }
        self.ctx.metrics.cluster.answer_replayed();
        self.replay.delivered([(fp, answer)]);
        true
    }
}

/// What the upstream's `tools/list` says of `tool` (read again when older than a minute or
/// when the tool is unknown); `None` when it does not list the tool.
pub(super) async fn tool_hint(
    hints: &ToolHints,
    session: Option<Arc<Session>>,
    tool: &str,
) -> Option<ToolHint> {
    if !hints.fresh(Instant::now()) || !hints.tools.contains_key(tool) {
        if let Some(session) = session {
            if let Ok(found) = tokio::time::timeout(LIST_TIMEOUT, read_hints(&session)).await {
                // Updated in place, never emptied: a concurrent look-up sees old or new hints.
                let names: std::collections::HashSet<String> =
                    found.iter().map(|(n, _)| n.clone()).collect();
                for (name, hint) in found {
                    hints.tools.insert(name, hint);
                }
                hints.tools.retain(|name, _| names.contains(name));
                if let Ok(mut t) = hints.read.lock() {
                    *t = Some(Instant::now());
                }
            }
        }
    }
    hints.tools.get(tool).map(|h| *h)
}

// Every tool of the upstream's `tools/list` (all pages, bounded) and what it says of each.
async fn read_hints(session: &Arc<Session>) -> Vec<(String, ToolHint)> {
    let tools = session
        .list_all("tools/list", "tools", MAX_LIST_PAGES)
        .await;
    tools
        .iter()
        .filter_map(|tool| {
            let name = tool["name"].as_str()?;
            let a = &tool["annotations"];
            let hint = ToolHint {
                replay_safe: a["readOnlyHint"] == true || a["idempotentHint"] == true,
                task_required: tool["execution"]["taskSupport"] == "required",
            };
            Some((name.to_owned(), hint))
        })
        .collect()
}
