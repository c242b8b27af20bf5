//! A call that becomes a task (the tasks extension): when it has neither finished nor asked for
//! input within `tasks.after` of the exchange now open, that exchange is answered with a
//! `CreateTaskResult` and the call runs on with none (`Phase::Detached`). From then on the
//! upstream's server requests are listed on the task (`input_required`) instead of parked behind
//! a token, answers come through `tasks/update`, a cancel through `tasks/cancel`, and the call's
//! end becomes the task's final status. There is no way back to rounds.

use serde_json::value::RawValue;
use serde_json::Value;
use tokio::time::Instant;

use super::leg::Outcome;
use super::{Call, TaskRun};
use crate::error::ProxyError;
use crate::jsonrpc::{self, ErrorObject, Message};
use crate::protocol::META_SERVER_INFO;
use crate::tasks::{CallJournal, Change, Control};
use crate::trace_context::TraceContext;

impl Call {
    /// When the running call becomes a task, if it may become one (the client declared the
    /// extension, the tool's mode allows it) and has not yet.
    pub(super) fn task_due(&self) -> Option<Instant> {
        if !self.phase.is_running() {
            return None;
        }
        Some(self.leg_opened + self.spec.task_after?)
    }

    /// The call is due: answer its exchange with a task and run on without one. At a bound of
    /// `[tasks]`, or when the task could not be stored, it stays an ordinary call.
    pub(super) async fn become_task(&mut self) {
        if !self.phase.is_running() {
            return;
        }
        let held = self.spec.upstream_params.as_ref().map_or(0, |p| p.len());
        // Nothing moves the phase while this awaits: the actor handles one event at a time.
        let journal = self.task_journal().await;
        let journal_kept = journal.is_some();
        let created = (self.ctx.tasks)
            .create(&self.spec.principal, held, journal)
            .await;
        let (guard, control, mut created) = match created {
            Ok(t) => t,
            Err(e) => {
                tracing::info!(error = %e, "the call stays an ordinary call");
                self.spec.task_after = None;
                return;
            }
        };
        let replay_safe = journal_kept;
        let Ok(leg) = self.phase.detach(TaskRun {
            guard,
            control,
            replay_safe,
        }) else {
            return;
        };
        if let Some(p) = &mut self.parking {
            // Its rounds are over: no token of it may resume anything now.
            p.guard.retire("the call became a task");
        }
        created["resultType"] = Value::from("task");
        if let Some(info) = self.server_info() {
            created["_meta"] = serde_json::json!({ META_SERVER_INFO: info });
        }
        let body = jsonrpc::response_bytes(&leg.id, &jsonrpc::text(&created));
        TraceContext::event(&leg.span, "mrtr.task.created", Vec::new);
        self.task_event("mrtr.task.created");
        leg.finish(Outcome::task(body)).await;
        // Server requests that came before it (none: a round would have parked the call) would
        // be listed here.
        self.list_inputs().await;
    }

    // What runs a replay-safe call again, should its holder be lost: the request and the
    // answers given so far (in its rounds before it became a task). `None`: not replay-safe.
    async fn task_journal(&mut self) -> Option<CallJournal> {
        if !self.replay_safe().await {
            return None;
        }
        let spec = &self.spec;
        Some(CallJournal {
            method: spec.method.clone(),
            target: spec.target.clone(),
            // Text the proxy wrote: it reads as JSON.
            params: spec
                .upstream_params
                .as_deref()
                .and_then(|p| RawValue::from_string(p.to_owned()).ok()),
            capabilities: Value::clone(&spec.capabilities),
            answered: self.replay.answered().to_vec(),
        })
    }

    /// Lists on the task every pending server request it does not list yet.
    pub(super) async fn list_inputs(&mut self) {
        let Some(task) = self.phase.task_mut() else {
            return;
        };
        let listed = self.rounds.list();
        let asked_now = !listed.is_empty();
        for (key, embedded) in listed {
            task.guard.ask(key, embedded).await;
        }
        if asked_now {
            self.task_event("mrtr.task.input_required");
        }
    }

    // A transition of the task, as an event of the upstream call's client span.
    fn task_event(&self, name: &'static str) {
        TraceContext::event(&self.spec.upstream_span, name, Vec::new);
    }

    /// Writes `change` to the task, when the call is one.
    pub(super) async fn write_task(&mut self, change: Change) {
        if let Some(task) = self.phase.task_mut() {
            task.guard.apply(change).await;
        }
    }

    /// What the client said through the task.
    pub(super) async fn on_control(&mut self, control: Option<Control>) {
        match control {
            Some(Control::Answers {
                answers,
                credentials,
                span,
                taken,
            }) => {
                self.task_event("mrtr.task.answered");
                let keys = answers.keys().cloned().collect();
                let journal = match self.phase.task().is_some_and(|t| t.replay_safe) {
                    true => self.rounds.journal_of(&answers),
                    false => Vec::new(),
                };
                self.write_task(Change::Answered { keys, journal }).await;
                // The update is answered once the task no longer lists them; a client that
                // left meanwhile changes nothing.
                let _ = taken.send(());
                let delivered = self.deliver_answers(answers, &credentials).await;
                // The delivery's client span ends here.
                drop(span);
                if let Err(e) = delivered {
                    self.fail(e).await;
                }
            }
            Some(Control::Cancel) => {
                self.cancel_upstream("the client cancelled the task").await;
                let message = "cancelled by the client".to_owned();
                self.end_task("mrtr.task.cancelled", Change::Cancel { message })
                    .await;
            }
            Some(Control::Lost) => {
                self.cancel_upstream("another instance holds the task now")
                    .await;
                if let Some(task) = self.phase.task_mut() {
                    task.guard.let_go();
                }
                self.task_event("mrtr.task.lost");
                self.phase.finish();
            }
            // Its mailbox went with its record, at the TTL: nothing is left to write.
            None => {
                self.task_event("mrtr.task.gone");
                self.phase.finish();
            }
        }
    }

    /// The task's TTL ran out before it finished: cancel it upstream.
    pub(super) async fn expire_task(&mut self) {
        self.cancel_upstream("the task expired").await;
        let message = "the task expired before it finished".to_owned();
        self.end_task("mrtr.task.expired", Change::Cancel { message })
            .await;
    }

    /// The upstream's final message, for a task: its result or error becomes the task's.
    /// Returns `msg` back when the call is not a task.
    pub(super) async fn finish_task(&mut self, msg: Message) -> Option<Message> {
        if !self.phase.is_detached() {
            return Some(msg);
        }
        let ending = self
            .final_result(msg)
            .and_then(|result| RawValue::from_string(result).map_err(internal));
        match ending {
            Ok(result) => {
                if let Some(task) = self.phase.task_mut() {
                    task.guard.complete(result).await;
                }
                self.task_event("mrtr.task.completed");
                self.phase.finish();
            }
            Err(error) => {
                self.end_task("mrtr.task.failed", Change::Fail { error })
                    .await
            }
        }
        None
    }

    /// A task's failure (`err`) becomes its final status (nothing when the call is no task).
    pub(super) async fn fail_task(&mut self, err: &ProxyError) {
        if self.phase.is_detached() {
            let error = err.to_error_object();
            self.end_task("mrtr.task.failed", Change::Fail { error })
                .await;
        }
    }

    // The task's last word (`last`, the event `name`), then the call is done.
    async fn end_task(&mut self, name: &'static str, last: Change) {
        if let Some(task) = self.phase.task_mut() {
            task.guard.apply(last).await;
            self.task_event(name);
        }
        self.phase.finish();
    }
}

fn internal(e: serde_json::Error) -> ErrorObject {
    ProxyError::Internal(e.to_string()).to_error_object()
}
