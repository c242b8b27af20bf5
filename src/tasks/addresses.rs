//! Where each replica can be reached, kept in the shared task store beside the records, so that
//! a `tasks/update` or `tasks/cancel` (or an MRTR retry) reaches the instance holding its task
//! or call without a configured peer set.
//!
//! Each replica announces its own MCP URL under `instance:<id>` every lease renewal, for one
//! `tasks.lease`: the key lapses with the replica. The URL is sealed like a record's private
//! part (AES-256-GCM under the state key, bound to the instance id), so only a holder of the
//! shared key can name where requests go: a writer of the store alone cannot redirect a
//! forward. The forward itself still proves the target by asking it its instance id.

use std::sync::{Arc, Mutex};

use http::Uri;
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};

use super::redis_store::{millis, RedisStore};
use crate::ops::metrics::StoreOp;
use crate::state::replay;

/// The addresses of the replicas sharing a store.
#[derive(Debug)]
pub(crate) struct Addresses {
    store: Arc<RedisStore>,
    /// This instance's id.
    owner: String,
    /// This instance's MCP URL, once known (the configured `cluster.advertise`, or the listen
    /// address once bound).
    advertised: Mutex<Option<String>>,
}

/// What `instance:<id>` holds.
#[derive(Serialize, Deserialize)]
struct Announced {
    /// The key `sealed` is sealed under.
    kid: String,
    /// The URL, sealed.
    sealed: String,
}

impl Addresses {
    pub(super) fn new(store: Arc<RedisStore>, owner: String) -> Self {
        Self {
            store,
            owner,
            advertised: Mutex::new(None),
        }
    }

    /// Sets the URL this instance announces (its MCP endpoint as the other replicas reach it).
    pub(crate) fn advertise(&self, url: &Uri) {
        *crate::sync::lock(&self.advertised) = Some(url.to_string());
    }

    /// Announces this instance's URL, for one lease (nothing when it has none).
    pub(crate) async fn announce(&self) {
        let Some(url) = crate::sync::lock(&self.advertised).clone() else {
            return;
        };
        let (kid, key) = self.store.tokens().keys().sealer();
        let Some(sealed) = replay::seal(&key, &aad(&self.owner), url.as_bytes()) else {
            return;
        };
        let Ok(text) = serde_json::to_string(&Announced { kid, sealed }) else {
            return;
        };
        let mut conn = self.store.connection();
        let key = self.store.key(&format!("instance:{}", self.owner));
        let set = conn.pset_ex::<_, _, ()>(key, text, millis(self.store.lease()));
        if let Err(e) = self.store.run(StoreOp::Lease, set).await {
            tracing::warn!(error = %e, "this instance's address not announced to the task store");
        }
    }

    /// The URL instance `id` announced, if it is announced now and opens under a key held here.
    pub(crate) async fn of(&self, id: &str) -> Option<Uri> {
        let mut conn = self.store.connection();
        let key = self.store.key(&format!("instance:{id}"));
        let text: Option<String> = self.store.run(StoreOp::Lease, conn.get(key)).await.ok()?;
        let announced: Announced = serde_json::from_str(&text?).ok()?;
        let key = self.store.tokens().keys().opener(&announced.kid)?;
        let url = replay::open_bytes(&key, &aad(id), &announced.sealed)?;
        String::from_utf8(url).ok()?.parse().ok()
    }
}

// What a sealed address is bound to: its instance, under this use's label.
fn aad(id: &str) -> Vec<u8> {
    let mut aad = b"mrtr-proxy instance address v1\0".to_vec();
    aad.extend_from_slice(id.as_bytes());
    aad
}
