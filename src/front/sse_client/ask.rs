//! The approval gate on the HTTP+SSE front: a gated call is asked about on the session's stream
//! (the same form as on `/mcp`), when the session's `initialize` declared form elicitation; the
//! answer comes back as a POST on the session and is taken here. Approved, the call goes
//! upstream as any message of the session; declined, silent or with the client gone, it does not.

use bytes::Bytes;
use serde_json::Value;

use crate::app::App;
use crate::auth::Principal;
use crate::bridge::SseClient;
use crate::config::ApprovalRule;
use crate::front::approval;
use crate::front::gate::GatedCall;

/// Refuses a gated call nobody can be asked about, on the session's stream.
pub(super) async fn refuse(app: &App, client: &SseClient, principal: &str, call: &GatedCall<'_>) {
    let refused = approval::refusal(app, principal, call);
    let _ = client.out.send(Bytes::from(refused)).await;
}

/// A gated call of an HTTP+SSE client, asked about on its stream (owned: the asking outlives
/// the POST that brought it).
pub(super) struct Asking {
    pub(super) id: Value,
    tool: String,
    arguments: Value,
    rule: ApprovalRule,
}

impl Asking {
    /// The gate's `call`, owned.
    pub(super) fn of(call: GatedCall<'_>) -> Self {
        Self {
            id: call.id,
            tool: call.tool,
            arguments: call.arguments,
            rule: call.rule.clone(),
        }
    }
}

/// Asks the person on the session's stream and waits (at most `state.ttl`) for the answer
/// POSTed on the session: `true` once approved; declined, the decline is sent on the stream;
/// the client gone or silent, `false`.
pub(super) async fn approved(
    app: &App,
    client: &SseClient,
    who: &Principal,
    asking: Asking,
) -> bool {
    let call = GatedCall {
        id: asking.id,
        tool: asking.tool,
        arguments: asking.arguments,
        rule: &asking.rule,
    };
    let question = approval::Question::new(call.rule, &call.arguments);
    let answer = client.expect(&question.key);
    approval::asked(app, &who.digest, &call);
    if client
        .out
        .send(Bytes::from(question.message))
        .await
        .is_err()
    {
        return false;
    }
    let answered = tokio::select! {
        answered = tokio::time::timeout(app.config.state.ttl, answer) => answered,
        () = client.out.closed() => return false,
    };
    let Ok(Ok(message)) = answered else {
        client.abandon(&question.key);
        return false;
    };
    match approval::decided(app, (&who.digest, &call), &message) {
        Some(declined) => {
            let _ = client.out.send(Bytes::from(declined)).await;
            false
        }
        None => true,
    }
}
