//! The process's signals: SIGTERM or SIGINT (Ctrl-C) shut down; SIGHUP reloads the keys.

/// Resolves on SIGINT, or SIGTERM on Unix.
pub async fn signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    tracing::info!("shutdown signal received");
}

/// Calls `reload` on every SIGHUP, forever (on Unix; never elsewhere). The first call happens
/// only after a signal: start-up has already loaded what `reload` would.
pub async fn on_hangup(reload: impl Fn()) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut hup) = signal(SignalKind::hangup()) else {
            tracing::warn!("cannot listen for SIGHUP: keys reload only on restart");
            return;
        };
        while hup.recv().await.is_some() {
            reload();
        }
    }
    #[cfg(not(unix))]
    {
        let _ = &reload;
        std::future::pending::<()>().await;
    }
}
