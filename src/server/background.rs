//! What runs beside the request path for the server's life: the start announced to the peers,
//! readiness that follows the upstream, and the periodic sweeps (idle sessions, expired calls
//! and tasks, spent tokens, session records, idle bridged children), each on its own clock.

use std::sync::Arc;
use std::time::Duration;

use crate::app::App;

/// The background work: the peers told of this start once, readiness that follows the upstream,
/// and the periodic sweeps — each on its own clock, so the sweeps go on while the upstream is down.
pub(super) async fn run(app: Arc<App>) {
    tokio::join!(
        app.peers.announce(),
        sweep(Arc::clone(&app)),
        task_leases(Arc::clone(&app)),
        follow_upstream(Arc::clone(&app))
    );
}

// With a shared task store: whether it answers, and this instance's leases on the tasks it
// runs and its address renewed, every third of `tasks.lease`.
async fn task_leases(app: Arc<App>) {
    let Some(period) = app.calls.tasks.lease_period() else {
        return;
    };
    let mut renew = tokio::time::interval(period);
    loop {
        renew.tick().await;
        if app.calls.tasks.check_store().await {
            app.calls.tasks.renew_leases().await;
            if let Some(addresses) = app.calls.tasks.addresses() {
                addresses.announce().await;
            }
        }
    }
}

// Idle upstream sessions reaped; expired parked calls, tasks, spent tokens, sessions' records
// and idle bridged children swept.
async fn sweep(app: Arc<App>) {
    let period = (app.config.pool.idle_timeout / 2)
        .clamp(Duration::from_millis(100), Duration::from_secs(30));
    let mut reap = tokio::time::interval(period);
    loop {
        reap.tick().await;
        let closed = app.pool.reap_idle().await;
        if closed > 0 {
            tracing::debug!(closed, "closed idle upstream sessions");
        }
        app.calls.parked.sweep();
        app.calls.tasks.sweep().await;
        app.replays.sweep();
        app.approvals.sweep();
        app.inline_asks.sweep();
        app.bridge.reap_idle().await;
    }
}

// Readiness: an initialize until the upstream answers (backing off), then a check every
// `upstream.health_interval`; a failed connection anywhere turns readiness off until the next
// initialize answers.
async fn follow_upstream(app: Arc<App>) {
    let mut delay = Duration::from_millis(100);
    let mut health = tokio::time::interval(app.config.upstream.health_interval);
    let mut policy_checked = false;
    loop {
        if !app.pool.is_ready() {
            if !app.pool.probe().await {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
                continue;
            }
            tracing::info!(upstream = %app.upstream_name(), transport = app.pool.transport_name(),
                "upstream answered initialize; ready");
            delay = Duration::from_millis(100);
            if !policy_checked {
                policy_checked = true;
                let app = Arc::clone(&app);
                tokio::spawn(async move { app.check_approval_policy().await });
            }
        }
        health.tick().await;
        if !app
            .pool
            .check_health(app.config.upstream.health_interval)
            .await
        {
            tracing::warn!(upstream = %app.upstream_name(), "upstream unreachable; not ready");
        }
    }
}
