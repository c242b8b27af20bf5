//! A shared store's faults, from the holder's side: tasks it lost (restarted empty, or failed
//! over to a replica without the data) and changes it missed (down when they were made) are
//! written back from the holder's copies.

use super::guard;
use super::local::Local;
use super::store::TaskStore;

/// Tasks held here that the store no longer has (it restarted empty, or failed over to a
/// replica that never had them): written back from this instance's copies, its lease with
/// them.
pub(super) async fn write_back(store: &dyn TaskStore, local: &Local, missing: Vec<String>) {
    for id in missing {
        let Some((record, holder)) = local.write_back(&id) else {
            continue;
        };
        match store.create(record, holder).await {
            Ok(()) => {
                tracing::info!(task = %guard::short(&id), "task written back to the store")
            }
            Err(e) => {
                tracing::warn!(task = %guard::short(&id), error = %e, "task not written back")
            }
        }
    }
}

/// Writes back the copies holding changes the store missed while it was down (but those of
/// tasks another instance holds now: theirs is the record).
pub(super) async fn catch_up(store: &dyn TaskStore, local: &Local, lost: &[String]) {
    let Some(holder) = local.holder() else {
        return;
    };
    for record in local.dirty() {
        let id = record.id.clone();
        if lost.contains(&id) {
            continue;
        }
        if store.create(record, holder).await.is_ok() {
            local.clean(&id);
            tracing::info!(task = %guard::short(&id), "task changes written back to the store");
        }
    }
}
