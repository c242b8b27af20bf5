//! A call that becomes a task (the tasks extension): when it has neither finished nor asked for
//! input within `tasks.after` of the exchange now open, that exchange is answered with a
//! `CreateTaskResult` and the call runs on with none (`Phase::Detached`). From then on the
//! upstream's server requests are listed on the task (`input_required`) instead of parked behind
//! a token, answers come through `tasks/update`, a cancel through `tasks/cancel`, and the call's
//! end becomes the task's final status. There is no way back to rounds.

use std::collections::HashSet;

use serde_json::value::RawValue;
use serde_json::Value;
use tokio::time::Instant;

use super::leg::Outcome;
use super::{Call, TaskRun};
use crate::error::ProxyError;
use crate::jsonrpc::{self, Message};
use crate::protocol::META_SERVER_INFO;
use crate::tasks::{Control, TaskGuard};
use crate::trace_context::TraceContext;

impl Call {
    /// When the running call becomes a task, if it may become one (the client declared the
    /// extension, the tool's mode allows it) and has not yet.
    pub(super) fn task_due(&self) -> Option<Instant> {
        if self.task.is_some() || !self.phase.is_running() {
            return None;
        }
        Some(self.leg_opened + self.spec.task_after?)
    }

    /// The call is due: answer its exchange with a task and run on without one. At a bound of
    /// `[tasks]` it stays an ordinary call.
    pub(super) async fn become_task(&mut self) {
        if !self.phase.is_running() {
            return;
        }
        let held = self
            .spec
            .upstream_params
            .as_ref()
            .map_or(0, |p| p.get().len());
        let (guard, control) = match self.ctx.tasks.create(&self.spec.principal, held) {
            Ok(t) => t,
            Err(e) => {
                tracing::info!(error = %e, "the call stays an ordinary call");
                self.spec.task_after = None;
                return;
            }
        };
        let Some(leg) = self.phase.detach() else {
            return;
        };
        if let Some(p) = &mut self.parking {
            // Its rounds are over: no token of it may resume anything now.
            p.guard.retire("the call became a task");
        }
        let mut created = guard.task();
        created["resultType"] = Value::from("task");
        if let Some(info) = self.server_info() {
            created["_meta"] = serde_json::json!({ META_SERVER_INFO: info });
        }
        let body = jsonrpc::response_bytes(&leg.id, &jsonrpc::text(&created));
        TraceContext::event(&leg.span, "mrtr.task.created", Vec::new);
        self.task_event("mrtr.task.created");
        leg.finish(Outcome::task(body)).await;
        self.task = Some(TaskRun {
            guard,
            control,
            listed: HashSet::new(),
        });
        // Server requests that came before it (none: a round would have parked the call) would
        // be listed here.
        self.list_inputs();
    }

    /// Lists on the task every pending server request it does not list yet.
    pub(super) fn list_inputs(&mut self) {
        let Some(task) = &mut self.task else {
            return;
        };
        let mut asked_now = false;
        for (asked, embedded) in self.rounds.requests() {
            if task.listed.insert(asked.key.clone()) {
                task.guard.ask(asked, embedded.clone());
                asked_now = true;
            }
        }
        if asked_now {
            self.task_event("mrtr.task.input_required");
        }
    }

    // A transition of the task, as an event of the upstream call's client span.
    fn task_event(&self, name: &'static str) {
        TraceContext::event(&self.spec.upstream_span, name, Vec::new);
    }

    /// The upstream withdrew its request under `key`: the task no longer lists it.
    pub(super) fn unlist(&mut self, key: &str) {
        if let Some(task) = &mut self.task {
            task.guard.withdraw(key);
        }
    }

    /// What the client said through the task.
    pub(super) async fn on_control(&mut self, control: Option<Control>) {
        match control {
            Some(Control::Answers(answers, credentials, span)) => {
                self.task_event("mrtr.task.answered");
                let delivered = self.deliver_answers(&answers, &credentials).await;
                // The delivery's client span ends here.
                drop(span);
                if let Err(e) = delivered {
                    self.fail(e).await;
                }
            }
            Some(Control::Cancel) => {
                self.cancel_upstream("the client cancelled the task").await;
                self.end_task("mrtr.task.cancelled", |t| {
                    t.cancelled("cancelled by the client");
                });
            }
            None => self.end_task("mrtr.task.gone", |_| ()),
        }
    }

    /// The task's TTL ran out before it finished: cancel it upstream.
    pub(super) async fn expire_task(&mut self) {
        self.cancel_upstream("the task expired").await;
        self.end_task("mrtr.task.expired", |t| {
            t.cancelled("the task expired before it finished");
        });
    }

    /// The upstream's final message, for a task: its result or error becomes the task's.
    /// Returns `msg` back when the call is not a task.
    pub(super) fn finish_task(&mut self, msg: Message) -> Option<Message> {
        if self.task.is_none() {
            return Some(msg);
        }
        let ending = self.final_result(msg);
        let name = match ending {
            Ok(_) => "mrtr.task.completed",
            Err(_) => "mrtr.task.failed",
        };
        self.end_task(name, |t| match ending {
            Ok(result) => match RawValue::from_string(result) {
                Ok(raw) => t.complete(raw),
                Err(e) => t.fail(ProxyError::Internal(e.to_string()).to_error_object()),
            },
            Err(error) => t.fail(error),
        });
        None
    }

    /// A task's failure (`err`) becomes its final status (nothing when the call is no task).
    pub(super) fn fail_task(&mut self, err: &ProxyError) {
        if self.task.is_some() {
            let error = err.to_error_object();
            self.end_task("mrtr.task.failed", |t| t.fail(error));
        }
    }

    // The task's last word (the event `name`), then the call is done.
    fn end_task(&mut self, name: &'static str, last: impl FnOnce(&TaskGuard)) {
        if let Some(task) = &self.task {
            last(&task.guard);
            self.task_event(name);
        }
        self.phase.finish();
    }
}
