//! Tasks of the `io.modelcontextprotocol/tasks` extension, the persistent workflow of SEP-2322:
//! a `tools/call` that runs long is answered with a task the client polls (`tasks/get`), answers
//! (`tasks/update`) and may cancel (`tasks/cancel`) while the upstream call goes on.
//!
//! Who does what:
//! - `record`: the task as a store keeps it ([`record::TaskRecord`], pure and serializable) and
//!   the one function that changes it;
//! - `store`: where records live ([`store::TaskStore`]; `MemoryStore` today) and who holds each;
//! - `store_client`: the Redis / Valkey client from the URL, password and TLS files;
//! - `guard`: the call actor's side, the task's one writer ([`TaskGuard`]): its changes, and the
//!   metrics and logs of its transitions;
//! - `local`: what this process keeps of the tasks it holds (charges, mailboxes);
//! - `view`: the wire shapes;
//! - this file, the front's side ([`Tasks`]): creation, reads, and the client's answers and
//!   cancellations checked here, then posted to the holder's mailbox ([`Control`]) — never
//!   written by the front.

mod addresses;
mod adopt;
mod faults;
mod guard;
mod local;
mod record;
mod redis_store;
mod routing;
mod store;
mod store_client;
mod view;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::time::Instant;

pub(crate) use addresses::Addresses;
pub(crate) use adopt::Rerun;
use adopt::{Adopting, NOT_REPLAY_SAFE, NO_ROOM};
pub(crate) use guard::TaskGuard;
pub(crate) use local::Control;
use local::{busy, now_ms, post, Local, RUNNING_TASK_BYTES};
pub(crate) use record::{CallJournal, Change};
use record::{Lifetime, TaskRecord};
use routing::ID_SEPARATOR;
pub(crate) use routing::{owner_of, unknown, Route};
use store::{StoreError, TaskStore};
pub(crate) use store_client::{read_password, store_client};

use crate::config;
use crate::error::ProxyError;
use crate::input::{self, Asked};
use crate::ops::metrics::{Adopted, Metrics};
use crate::state::{random_id, TokenCodec};
use crate::upstream::Credentials;

/// What one task is charged besides its params and its result, until its TTL: its record and
/// the inputs it asks.
pub(crate) const TASK_OVERHEAD: usize = 16 * 1024;
/// Bytes of randomness in a task id (128 bits: the id is a handle, though bound to a principal).
const ID_BYTES: usize = 16;
/// Client messages a task's actor may have queued.
const MAILBOX: usize = 64;
/// How long `tasks/update` waits for the task's actor to take its answers (it takes them as
/// its next event, normally within microseconds; an actor stuck longer is reported busy).
const TAKEN_WITHIN: Duration = Duration::from_secs(10);

/// The tasks, as the front and the call actors see them.
#[derive(Debug)]
pub(crate) struct Tasks {
    store: Arc<dyn TaskStore>,
    /// Where the replicas sharing the store are reached (a store in memory has none).
    addresses: Option<Addresses>,
    /// The store answered when last asked (a store in memory always does).
    store_up: AtomicBool,
    /// The store was asked once already.
    store_checked: AtomicBool,
    local: Arc<Local>,
    config: config::Tasks,
    owner: String,
    metrics: Arc<Metrics>,
}

impl From<StoreError> for ProxyError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unknown => unknown(),
            e @ (StoreError::Conflict | StoreError::Unavailable(_)) => {
                Self::Overloaded(format!("{e}; retry later"))
            }
        }
    }
}

impl Tasks {
    /// The tasks in the configured store (this process's memory, or Redis / Valkey); ids
    /// name this instance (`tokens`' issuer), whose key seals what a shared store keeps.
    ///
    /// # Errors
    /// The store's password or TLS files cannot be read (the message names the key), or its
    /// URL makes no client.
    pub(crate) fn new(
        config: config::Tasks,
        tokens: Arc<TokenCodec>,
        metrics: Arc<Metrics>,
    ) -> Result<Arc<Self>, String> {
        let owner = tokens.issuer().to_owned();
        let (store, addresses) = store_client::open(&config.store, &owner, tokens, &metrics)?;
        let in_memory = matches!(config.store, config::Store::Memory);
        metrics.tasks.store_up(in_memory);
        Ok(Arc::new(Self {
            store_up: AtomicBool::new(in_memory),
            store_checked: AtomicBool::new(false),
            store,
            addresses,
            local: Arc::new(Local::new(
                config.bounds(),
                (!in_memory).then(|| owner.clone()),
            )),
            config,
            owner,
            metrics,
        }))
    }

    /// Asks the task store whether it answers, and remembers (see [`Tasks::store_up`]); logs
    /// when that changes.
    /// A store down from the first check is said too, with why (a refused certificate...).
    pub(crate) async fn check_store(&self) -> bool {
        let answer = self.store.ping().await;
        let up = answer.is_ok();
        let first = !self.store_checked.swap(true, Ordering::AcqRel);
        if self.store_up.swap(up, Ordering::AcqRel) != up || (first && !up) {
            match answer {
                Ok(()) => tracing::info!("task store reachable"),
                Err(e) => tracing::warn!(
                    error = %e,
                    "task store unreachable: new calls stay ordinary calls"
                ),
            }
        }
        self.metrics.tasks.store_up(up);
        up
    }

    /// Where the replicas sharing the task store are reached (`None`: a store in memory).
    pub(crate) fn addresses(&self) -> Option<&Addresses> {
        self.addresses.as_ref()
    }

    /// Whether the task store answered when last asked (always, for one in memory).
    pub(crate) fn store_up(&self) -> bool {
        self.store_up.load(Ordering::Acquire)
    }

    /// How often the leases on the tasks held here are renewed (`None`: a store in memory
    /// has none).
    pub(crate) fn lease_period(&self) -> Option<Duration> {
        match &self.config.store {
            config::Store::Memory => None,
            config::Store::Redis(r) => Some(r.lease / 3),
        }
    }

    /// Renews this instance's leases on the tasks it holds (finished ones too: a lease that
    /// lapses says its holder is gone); a task whose lease another instance took (it adopted
    /// the task while this one could not renew) is stopped here.
    pub(crate) async fn renew_leases(&self) {
        let ids = self.local.ids();
        match self.store.renew(&ids, &self.owner).await {
            Ok(renewal) => {
                faults::write_back(self.store.as_ref(), &self.local, renewal.missing).await;
                faults::catch_up(self.store.as_ref(), &self.local, &renewal.lost).await;
                for id in renewal.lost {
                    self.metrics.tasks.lease_lost();
                    tracing::warn!(task = %guard::short(&id), "task lease taken by another instance: stopping its copy here");
                    if let Some(mailbox) = self.local.mailbox(&id) {
                        let _ = post(&mailbox, Control::Lost);
                    }
                    // Held here no more (a finished task's actor is gone: no one else lets go).
                    if let Some(status) = self.local.release(&id) {
                        self.metrics.tasks.moved(Some(guard::state(status)), None);
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "task leases not renewed"),
        }
    }

    /// How long a task lives (also asked of an upstream's legacy task).
    pub(crate) fn ttl(&self) -> Duration {
        self.config.ttl
    }

    /// Bytes charged to the tasks this instance holds.
    pub(crate) fn held_bytes(&self) -> usize {
        self.local.held_bytes()
    }

    /// Ids of tasks that changed, for `subscriptions/listen` (which reads each with `get`).
    pub(crate) fn changes(&self) -> broadcast::Receiver<Arc<str>> {
        self.store.changes()
    }

    /// Creates a task for `principal` charged `held` bytes (its params) plus the overhead, and
    /// stores it: the actor gets its guard, its mailbox, and the `Task` to answer with.
    ///
    /// # Errors
    /// [`ProxyError::Overloaded`] past `tasks.max`, `tasks.max_per_principal` or
    /// `tasks.max_memory`, or when the store did not take it (then there is no task).
    pub(crate) async fn create(
        &self,
        principal: &str,
        held: usize,
        call: Option<CallJournal>,
    ) -> Result<(TaskGuard, mpsc::Receiver<Control>, Value), ProxyError> {
        let bytes = held
            .saturating_add(TASK_OVERHEAD)
            .saturating_add(RUNNING_TASK_BYTES);
        self.local.admit(principal, bytes)?;
        let id = format!("{}{ID_SEPARATOR}{}", self.owner, random_id(ID_BYTES));
        let (now, life) = (now_ms(), self.lifetime());
        let record = TaskRecord::with_replay(id.clone(), principal.to_owned(), now, life, call);
        let created = view::task(&record);
        if let Err(e) = self.store.create(record.clone(), &self.owner).await {
            self.local.refund(principal, bytes);
            self.metrics.tasks.not_created();
            return Err(e.into());
        }
        let deadline = Instant::now() + self.config.ttl;
        let (mailbox, rx) = mpsc::channel(MAILBOX);
        tracing::info!(task = %guard::short(&id), status = "working", "task created");
        let copy = self.local.keeps_copies().then(|| record.clone());
        self.local
            .hold(id, (principal, bytes), deadline, (mailbox, copy));
        let parts = (
            Arc::clone(&self.store),
            Arc::clone(&self.local),
            Arc::clone(&self.metrics),
        );
        Ok((TaskGuard::new(parts, &record, deadline), rx, created))
    }

    /// Where a request for task `id` is served (`read`: a `tasks/get`). In memory: where the
    /// task's id says it was created. In a shared store: a read here, from the store; an update
    /// or a cancel at the holder while its lease lives; a task whose holder is gone is adopted
    /// here first.
    /// `answers`: a `tasks/update`'s, which go into the journal of a task it adopts.
    pub(crate) async fn route(
        &self,
        id: &str,
        (read, answers): (bool, Option<&Map<String, Value>>),
        principal: &str,
    ) -> Result<Route, ProxyError> {
        let holder = self.store.holder(id).await?;
        let adopting = Adopting {
            principal,
            answers,
            read,
        };
        Ok(match holder {
            // An earlier process under this instance's id held it (restarted with a fixed
            // `state.instance_id`): it is adopted like any task whose holder is gone.
            Some(h) if h == self.owner && self.shared() && !self.local.holds(id) => {
                self.adopt(id, adopting, true).await?
            }
            Some(h) if h == self.owner => Route::Here,
            Some(_) if read && self.shared() => Route::Here,
            Some(h) => Route::Holder(h),
            None if self.shared() => self.adopt(id, adopting, false).await?,
            None => match owner_of(id) {
                Some(o) if o != self.owner => Route::Holder(o.to_owned()),
                _ => Route::Here,
            },
        })
    }

    fn shared(&self) -> bool {
        !matches!(self.config.store, config::Store::Memory)
    }

    // Task `id`'s holder is gone (its lease lapsed): take the lease — of several instances
    // racing, exactly one does — then a finished task is only read, a replay-safe one runs
    // again here, and any other ends failed: its call died with its holder. Only on a request
    // of the task's own principal. One log line per adoption.
    async fn adopt(&self, id: &str, by: Adopting<'_>, ours: bool) -> Result<Route, ProxyError> {
        // Another request here adopts it: a read is served from the store, the rest retry.
        let Some(_adopting) = self.local.adopting(id) else {
            return by.read.then_some(Route::Here).ok_or_else(busy);
        };
        let record = self.store.get(id).await?;
        let Some(record) = record.filter(|r| r.visible_to(by.principal, now_ms())) else {
            // Unknown, expired, or another principal's: answered here as unknown.
            return Ok(Route::Here);
        };
        if ours && record.status.is_terminal() {
            // Finished, and its lease already this instance's: adopted before, nothing to do.
            return Ok(Route::Here);
        }
        if !self.take_lease(id, ours).await? {
            // Another instance adopted it just now.
            return Ok(match self.store.holder(id).await? {
                Some(h) if h != self.owner => Route::Holder(h),
                _ => Route::Here,
            });
        }
        if record.status.is_terminal() {
            self.metrics.tasks.adopted(Adopted::Finished);
            tracing::info!(task = %guard::short(id), outcome = "finished", "task adopted");
            return Ok(Route::Here);
        }
        if record.replay_safe && record.call.is_some() {
            let answered = adopt::late_answers(&record, by.answers);
            let rerun = Change::Rerun { answered };
            match self.store.apply(id, record.version, rerun, now_ms()).await {
                // Adopted meanwhile by another request (on this instance or another one).
                Err(StoreError::Conflict) => return Ok(Route::Here),
                applied => applied?,
            };
            let Some(record) = self.store.get(id).await? else {
                return Ok(Route::Here);
            };
            match self.hold_adopted(record) {
                Ok(rerun) => {
                    self.metrics.tasks.adopted(Adopted::Replayed);
                    tracing::info!(task = %guard::short(id), outcome = "replayed", "task adopted");
                    return Ok(Route::Rerun(Box::new(rerun)));
                }
                Err(record) => return self.fail_adopted(*record, NO_ROOM).await,
            }
        }
        self.fail_adopted(record, NOT_REPLAY_SAFE).await
    }

    // Takes task `id`'s lease for this instance: when no one holds it, or (`ours`) when this
    // instance's id holds it from an earlier process.
    async fn take_lease(&self, id: &str, ours: bool) -> Result<bool, ProxyError> {
        if !ours {
            return Ok(self.store.acquire(id, &self.owner).await?);
        }
        let renewal = self.store.renew(&[id.to_owned()], &self.owner).await?;
        Ok(renewal.lost.is_empty() && renewal.missing.is_empty())
    }

    // A replay-safe task adopted here: charged and held like one created here (its deadline
    // its own TTL); given back when this instance has no room for it.
    fn hold_adopted(&self, mut record: TaskRecord) -> Result<Rerun, Box<TaskRecord>> {
        let Some(call) = record.call.take() else {
            return Err(Box::new(record));
        };
        let held = call.params.as_ref().map_or(0, |p| p.get().len());
        let bytes = held
            .saturating_add(TASK_OVERHEAD)
            .saturating_add(RUNNING_TASK_BYTES);
        if self.local.admit(&record.principal, bytes).is_err() {
            record.call = Some(call);
            return Err(Box::new(record));
        }
        let left = record.expires_ms.saturating_sub(now_ms());
        let deadline = Instant::now() + Duration::from_millis(left);
        let (mailbox, rx) = mpsc::channel(MAILBOX);
        let who = (record.principal.as_str(), bytes);
        let copy = self.local.keeps_copies().then(|| record.clone());
        self.local
            .hold(record.id.clone(), who, deadline, (mailbox, copy));
        let parts = (
            Arc::clone(&self.store),
            Arc::clone(&self.local),
            Arc::clone(&self.metrics),
        );
        Ok(Rerun {
            guard: TaskGuard::new(parts, &record, deadline),
            mailbox: rx,
            call,
            keys_minted: record.keys_minted,
            principal: record.principal,
        })
    }

    // An adopted task that does not run again here: `failed`, saying why.
    async fn fail_adopted(&self, record: TaskRecord, why: &str) -> Result<Route, ProxyError> {
        adopt::fail(self.store.as_ref(), &self.metrics, &record, why).await?;
        Ok(Route::Here)
    }

    // The record of `id` as `principal` may see it (live, its own).
    // A task held here that a shared store lost (it restarted empty) is written back first.
    async fn record(&self, id: &str, principal: &str) -> Result<TaskRecord, ProxyError> {
        let mut record = self.store.get(id).await?;
        if record.is_none() {
            if let Some((copy, holder)) = self.local.write_back(id) {
                self.store.create(copy.clone(), holder).await?;
                record = Some(copy);
            }
        }
        record
            .filter(|r| r.visible_to(principal, now_ms()))
            .ok_or_else(unknown)
    }

    /// Whether `principal` may see task `id`.
    pub(crate) async fn visible(&self, id: &str, principal: &str) -> bool {
        self.record(id, principal).await.is_ok()
    }

    /// `tasks/get`: the `DetailedTask` of `id`, as `principal` may see it.
    ///
    /// # Errors
    /// -32602 for an unknown or expired id, or another principal's.
    pub(crate) async fn get(&self, id: &str, principal: &str) -> Result<Value, ProxyError> {
        Ok(view::detailed(&self.record(id, principal).await?))
    }

    /// `tasks/update`: the answers to outstanding requests (others are ignored: unknown, or
    /// answered already) are checked and posted to the task's actor, which takes them off the
    /// list (the task is `working` again once none is outstanding) before this returns.
    ///
    /// # Errors
    /// -32602 for an unknown task, or an answer that does not fit what it answers (then none is
    /// taken); busy when the actor's mailbox is full or it does not take them in time.
    pub(crate) async fn update(
        &self,
        id: &str,
        principal: &str,
        answers: &Map<String, Value>,
        (credentials, span): (&Credentials, tracing::Span),
    ) -> Result<(), ProxyError> {
        let record = self.record(id, principal).await?;
        let asked: Vec<Asked> = (record.input_requests.iter())
            .filter_map(|(key, embedded)| Asked::from_embedded(key, embedded))
            .collect();
        let taken: Map<String, Value> = input::answered(&asked, answers)
            .map_err(ProxyError::BadRetry)?
            .into_iter()
            .map(|(asked, answer)| (asked.key.clone(), answer.clone()))
            .collect();
        if taken.is_empty() {
            return Ok(());
        }
        let Some(mailbox) = self.local.mailbox(id) else {
            return Err(unknown());
        };
        let (tx, rx) = oneshot::channel();
        let control = Control::Answers {
            answers: taken,
            credentials: credentials.clone(),
            span,
            taken: tx,
        };
        post(&mailbox, control)?;
        // Closed unanswered: the task ended meanwhile, and its answers with it.
        match tokio::time::timeout(TAKEN_WITHIN, rx).await {
            Ok(_) => Ok(()),
            Err(_) => Err(busy()),
        }
    }

    /// `tasks/cancel`: asks the task's actor to cancel it (the status becomes `cancelled` when
    /// the upstream call is abandoned).
    ///
    /// # Errors
    /// -32602 for an unknown task or one already finished.
    pub(crate) async fn cancel(&self, id: &str, principal: &str) -> Result<(), ProxyError> {
        let record = self.record(id, principal).await?;
        if record.status.is_terminal() {
            return Err(ProxyError::InvalidParams(
                "the task has already finished".into(),
            ));
        }
        match self.local.mailbox(id) {
            Some(mailbox) => post(&mailbox, Control::Cancel),
            None => Err(unknown()),
        }
    }

    /// Drops the tasks past their TTL (running ones were cancelled by their actor at that
    /// moment) and gives back what this instance charged for them.
    pub(crate) async fn sweep(&self) {
        for status in self.local.expire(Instant::now()) {
            self.metrics.tasks.moved(Some(guard::state(status)), None);
        }
        match self.store.sweep(now_ms()).await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(dropped = n, "tasks dropped at their TTL"),
            Err(e) => tracing::warn!(error = %e, "task sweep failed"),
        }
    }

    fn lifetime(&self) -> Lifetime {
        Lifetime {
            ttl_ms: millis(self.config.ttl),
            poll_interval_ms: millis(self.config.poll_interval),
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
