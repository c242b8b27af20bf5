//! [`RedisStore`]: task records in Redis (>= 6) or Valkey, shared by the replicas, so that a
//! task outlives the replica that runs it.
//!
//! Keys (each under `tasks.store_prefix`, each expiring with what it holds):
//! - `task:<id>`: the record as JSON, what a person typed or a tool returned sealed
//!   (AES-256-GCM under the state key set's sealing key, tagged with its kid, bound to the id):
//!   a dump shows ids, principals' digests, statuses and times, nothing else. It expires at the
//!   task's TTL.
//! - `lease:<id>`: the instance that holds the task (runs its call), for `tasks.lease`, renewed
//!   by its holder every third of that; a task whose lease lapsed is adopted.
//! - the channel `changes`: the id of every task that changed, for `subscriptions/listen` on
//!   every replica.
//!
//! A change is a compare-and-set on the record's text (a Lua script): the holder writes what it
//! read plus its change, and the store refuses it when anyone wrote in between.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Script};
use serde::{Deserialize, Serialize};
use serde_json::Map;
use tokio::sync::broadcast;
use tokio::time::Instant;

use super::record::{CallJournal, Change, Ending, Status, TaskRecord};
use super::store::{Applied, Renewal, StoreError, StoreFuture, TaskStore};
use crate::config;
use crate::ops::metrics::{Metrics, StoreOp};
use crate::state::replay;
use crate::state::TokenCodec;

/// Task changes a `subscriptions/listen` stream may fall behind by before it skips some.
const CHANGES_BUFFER: usize = 256;
/// How long the change feed waits before it subscribes again after losing the store.
const RESUBSCRIBE_AFTER: Duration = Duration::from_secs(1);

/// The compare-and-set of a change: the record is still what the writer read (`ARGV[1]`), so
/// it becomes `ARGV[2]` (its expiry kept); the change is published. 1 when it took.
const CAS: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
redis.call('PUBLISH', KEYS[2], ARGV[3])
return 1";

/// Renews the leases of tasks `ARGV[3..]` for `ARGV[1]` (for `ARGV[2]` ms) where it holds them
/// or no one does: per task 1, or 0 when another instance holds its lease, or 2 when the store
/// no longer has the task (its lease is not taken then). `KEYS[1]` is the key prefix.
const RENEW: &str = r"
local out = {}
for i = 3, #ARGV do
  local lease = KEYS[1] .. 'lease:' .. ARGV[i]
  local h = redis.call('GET', lease)
  if redis.call('EXISTS', KEYS[1] .. 'task:' .. ARGV[i]) == 0 then
    out[i - 2] = 2
  elseif h == false or h == ARGV[1] then
    redis.call('SET', lease, ARGV[1], 'PX', ARGV[2])
    out[i - 2] = 1
  else
    out[i - 2] = 0
  end
end
return out";

/// The store.
pub(crate) struct RedisStore {
    conn: ConnectionManager,
    prefix: String,
    timeout: Duration,
    lease: Duration,
    tokens: Arc<TokenCodec>,
    metrics: Arc<Metrics>,
    changes: broadcast::Sender<Arc<str>>,
    cas: Script,
    renew: Script,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// A record as the store keeps it: what a dump may show in the clear, the rest sealed.
#[derive(Serialize, Deserialize)]
struct Stored {
    id: String,
    principal: String,
    status: Status,
    created_ms: u64,
    updated_ms: u64,
    expires_ms: u64,
    ttl_ms: u64,
    poll_interval_ms: u64,
    rounds: u32,
    replay_safe: bool,
    keys_minted: u32,
    version: u64,
    /// The key `sealed` is sealed under.
    kid: String,
    /// [`Private`], sealed.
    sealed: String,
}

/// What only the task's principal may read.
#[derive(Serialize, Deserialize)]
struct Private {
    message: Option<String>,
    input_requests: Map<String, serde_json::Value>,
    ending: Option<Ending>,
    call: Option<CallJournal>,
}

impl RedisStore {
    /// A store on `settings` through `client` (see [`super::store_client`]), connecting when
    /// first used (a store down at start-up does not stop the proxy: tasks wait for it,
    /// `/readyz` says so).
    ///
    /// # Errors
    /// The connection manager cannot be made.
    pub(crate) fn new(
        settings: &config::RedisStore,
        client: redis::Client,
        (tokens, metrics): (Arc<TokenCodec>, Arc<Metrics>),
    ) -> Result<Arc<Self>, String> {
        let manager = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(settings.timeout))
            .set_response_timeout(Some(settings.timeout))
            .set_number_of_retries(1);
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), manager)
            .map_err(|e| e.to_string())?;
        let store = Arc::new(Self {
            conn,
            prefix: settings.prefix.clone(),
            timeout: settings.timeout,
            lease: settings.lease,
            tokens,
            metrics,
            changes: broadcast::channel(CHANGES_BUFFER).0,
            cas: Script::new(CAS),
            renew: Script::new(RENEW),
        });
        tokio::spawn(feed(
            client,
            store.key("changes"),
            store.changes.downgrade(),
        ));
        Ok(store)
    }

    /// The store's key for `what`, under `tasks.store_prefix`.
    pub(super) fn key(&self, what: &str) -> String {
        format!("{}{what}", self.prefix)
    }

    /// A handle on the store's one connection.
    pub(super) fn connection(&self) -> ConnectionManager {
        self.conn.clone()
    }

    /// The key set that seals what the store keeps.
    pub(super) fn tokens(&self) -> &TokenCodec {
        &self.tokens
    }

    /// How long a lease lasts unrenewed.
    pub(super) fn lease(&self) -> Duration {
        self.lease
    }

    /// One round trip, bounded by `store_timeout`, timed and counted as `what`.
    pub(super) async fn run<T>(
        &self,
        what: StoreOp,
        op: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        let started = Instant::now();
        let done = match tokio::time::timeout(self.timeout, op).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(StoreError::Unavailable(e.to_string())),
            Err(_) => Err(StoreError::Unavailable(
                "no answer within store_timeout".into(),
            )),
        };
        let took = started.elapsed();
        self.metrics.tasks.store_op(what, took, done.is_ok());
        done
    }

    fn encode(&self, r: &TaskRecord) -> Result<String, StoreError> {
        let private = Private {
            message: r.message.clone(),
            input_requests: r.input_requests.clone(),
            ending: r.ending.clone(),
            call: r.call.clone(),
        };
        let plain = serde_json::to_vec(&private).map_err(|e| unsealed(&e))?;
        let (kid, key) = self.tokens.keys().sealer();
        let sealed = replay::seal(&key, &aad(&r.id), &plain)
            .ok_or_else(|| StoreError::Unavailable("no randomness to seal a record".into()))?;
        let stored = Stored {
            id: r.id.clone(),
            principal: r.principal.clone(),
            status: r.status,
            created_ms: r.created_ms,
            updated_ms: r.updated_ms,
            expires_ms: r.expires_ms,
            ttl_ms: r.ttl_ms,
            poll_interval_ms: r.poll_interval_ms,
            rounds: r.rounds,
            replay_safe: r.replay_safe,
            keys_minted: r.keys_minted,
            version: r.version,
            kid,
            sealed,
        };
        serde_json::to_string(&stored).map_err(|e| unsealed(&e))
    }

    fn decode(&self, text: &str) -> Result<TaskRecord, StoreError> {
        let s: Stored = serde_json::from_str(text).map_err(|e| unsealed(&e))?;
        let key = self.tokens.keys().opener(&s.kid).ok_or_else(|| {
            StoreError::Unavailable("a record sealed under a key no longer held".into())
        })?;
        let plain = replay::open_bytes(&key, &aad(&s.id), &s.sealed)
            .ok_or_else(|| StoreError::Unavailable("a record that does not open".into()))?;
        let p: Private = serde_json::from_slice(&plain).map_err(|e| unsealed(&e))?;
        Ok(TaskRecord {
            id: s.id,
            principal: s.principal,
            status: s.status,
            message: p.message,
            created_ms: s.created_ms,
            updated_ms: s.updated_ms,
            expires_ms: s.expires_ms,
            ttl_ms: s.ttl_ms,
            poll_interval_ms: s.poll_interval_ms,
            input_requests: p.input_requests,
            ending: p.ending,
            rounds: s.rounds,
            replay_safe: s.replay_safe,
            keys_minted: s.keys_minted,
            call: p.call,
            version: s.version,
        })
    }

    async fn create_now(&self, record: TaskRecord, holder: &str) -> Result<(), StoreError> {
        let text = self.encode(&record)?;
        // A record past its TTL is not written (again): the store let it expire.
        let ttl = record.expires_ms.saturating_sub(super::local::now_ms());
        if ttl == 0 {
            return Err(StoreError::Unknown);
        }
        let mut conn = self.conn.clone();
        let lease = millis(self.lease);
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("SET")
            .arg(self.key(&format!("task:{}", record.id)))
            .arg(text)
            .arg("PX")
            .arg(ttl)
            .ignore()
            .cmd("SET")
            .arg(self.key(&format!("lease:{}", record.id)))
            .arg(holder)
            .arg("PX")
            .arg(lease)
            .ignore()
            .cmd("PUBLISH")
            .arg(self.key("changes"))
            .arg(&record.id)
            .ignore();
        self.run(StoreOp::Create, pipe.query_async::<()>(&mut conn))
            .await
    }

    async fn get_now(&self, id: &str) -> Result<Option<TaskRecord>, StoreError> {
        let mut conn = self.conn.clone();
        let key = self.key(&format!("task:{id}"));
        let text: Option<String> = self.run(StoreOp::Get, conn.get(key)).await?;
        text.map(|t| self.decode(&t)).transpose()
    }

    async fn apply_now(
        &self,
        id: &str,
        version: u64,
        change: Change,
        now_ms: u64,
    ) -> Result<Applied, StoreError> {
        let key = self.key(&format!("task:{id}"));
        let mut conn = self.conn.clone();
        let read: Option<String> = self.run(StoreOp::Apply, conn.get(&key)).await?;
        let read = read.ok_or(StoreError::Unknown)?;
        let mut record = self.decode(&read)?;
        if record.version != version {
            return Err(StoreError::Conflict);
        }
        let transition = record.apply(change, now_ms);
        if transition.is_none() {
            return Ok(Applied {
                version,
                transition,
            });
        }
        let written = self.encode(&record)?;
        let mut invocation = self.cas.key(&key);
        invocation
            .key(self.key("changes"))
            .arg(read)
            .arg(written)
            .arg(id);
        let took: i64 = (self.run(StoreOp::Apply, invocation.invoke_async(&mut conn))).await?;
        if took != 1 {
            return Err(StoreError::Conflict);
        }
        Ok(Applied {
            version: record.version,
            transition,
        })
    }

    async fn holder_now(&self, id: &str) -> Result<Option<String>, StoreError> {
        let mut conn = self.conn.clone();
        let key = self.key(&format!("lease:{id}"));
        self.run(StoreOp::Lease, conn.get(key)).await
    }

    async fn renew_now(&self, ids: &[String], holder: &str) -> Result<Renewal, StoreError> {
        let mut renewal = Renewal::default();
        if ids.is_empty() {
            return Ok(renewal);
        }
        let mut invocation = self.renew.prepare_invoke();
        invocation
            .key(&self.prefix)
            .arg(holder)
            .arg(millis(self.lease));
        for id in ids {
            invocation.arg(id);
        }
        let mut conn = self.conn.clone();
        let held: Vec<i64> = (self.run(StoreOp::Lease, invocation.invoke_async(&mut conn))).await?;
        for (id, h) in ids.iter().zip(held) {
            match h {
                0 => renewal.lost.push(id.clone()),
                2 => renewal.missing.push(id.clone()),
                _ => {}
            }
        }
        Ok(renewal)
    }

    async fn acquire_now(&self, id: &str, holder: &str) -> Result<bool, StoreError> {
        let mut conn = self.conn.clone();
        let mut set = redis::cmd("SET");
        set.arg(self.key(&format!("lease:{id}")))
            .arg(holder)
            .arg("NX")
            .arg("PX")
            .arg(millis(self.lease));
        let taken: Option<String> = self.run(StoreOp::Lease, set.query_async(&mut conn)).await?;
        Ok(taken.is_some())
    }

    async fn ping_now(&self) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let ping = redis::cmd("PING");
        self.run(StoreOp::Ping, ping.query_async::<String>(&mut conn))
            .await
            .map(drop)
    }
}

impl TaskStore for RedisStore {
    fn create<'a>(&'a self, record: TaskRecord, holder: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(self.create_now(record, holder))
    }

    fn get<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<TaskRecord>> {
        Box::pin(self.get_now(id))
    }

    fn apply<'a>(
        &'a self,
        id: &'a str,
        version: u64,
        change: Change,
        now_ms: u64,
    ) -> StoreFuture<'a, Applied> {
        Box::pin(self.apply_now(id, version, change, now_ms))
    }

    fn holder<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<String>> {
        Box::pin(self.holder_now(id))
    }

    fn renew<'a>(&'a self, ids: &'a [String], holder: &'a str) -> StoreFuture<'a, Renewal> {
        Box::pin(self.renew_now(ids, holder))
    }

    fn acquire<'a>(&'a self, id: &'a str, holder: &'a str) -> StoreFuture<'a, bool> {
        Box::pin(self.acquire_now(id, holder))
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        Box::pin(self.ping_now())
    }

    fn changes(&self) -> broadcast::Receiver<Arc<str>> {
        self.changes.subscribe()
    }

    // Every key expires by itself with what it holds.
    fn sweep(&self, _now_ms: u64) -> StoreFuture<'_, usize> {
        Box::pin(std::future::ready(Ok(0)))
    }
}

// Relays the store's change channel to this process's listeners, subscribing again whenever
// the store is lost; ends once the store itself is gone (its sender with it).
async fn feed(client: redis::Client, channel: String, tx: broadcast::WeakSender<Arc<str>>) {
    while tx.strong_count() > 0 {
        if let Ok(mut pubsub) = client.get_async_pubsub().await {
            if pubsub.subscribe(&channel).await.is_ok() {
                let mut messages = pubsub.on_message();
                while let Some(msg) = messages.next().await {
                    let (Some(tx), Ok(id)) = (tx.upgrade(), msg.get_payload::<String>()) else {
                        continue;
                    };
                    // No listener is the common case; a send error says only that.
                    let _ = tx.send(Arc::from(id));
                }
            }
        }
        tokio::time::sleep(RESUBSCRIBE_AFTER).await;
    }
}

// What a sealed record is bound to: its own id, under this use's label.
fn aad(id: &str) -> Vec<u8> {
    let mut aad = b"mrtr-proxy task record v1\0".to_vec();
    aad.extend_from_slice(id.as_bytes());
    aad
}

fn unsealed(e: &serde_json::Error) -> StoreError {
    StoreError::Unavailable(format!("a record that does not read: {e}"))
}

pub(super) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
