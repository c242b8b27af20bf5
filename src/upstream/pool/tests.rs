//! The pool's own unit tests.

use crate::config::Config;

use super::*;

#[tokio::test]
async fn a_stdio_pool_is_bounded_by_its_processes_and_counts_none_open_at_first() {
    let config =
        Config::from_toml_str("[upstream]\ncommand = [\"server\"]\nmax_processes = 3\n").unwrap();
    let bound = PrincipalBound::new(1, 1);
    let metrics = Arc::new(Metrics::default());
    let pool = SessionPool::new(&config.upstream, config.pool.clone(), bound, metrics);
    assert_eq!(pool.open_sessions(), 0);
    assert_eq!(pool.permits.available_permits(), 3);
}

#[tokio::test(start_paused = true)]
async fn extensions_are_part_of_the_key_within_the_principals_bound_of_declarations() {
    let toml = "[upstream]\nurl = \"http://127.0.0.1:9/mcp\"\n\
                [pool]\nmax_extension_sets_per_principal = 2\n";
    let config = Config::from_toml_str(toml).unwrap();
    let metrics = Arc::new(Metrics::default());
    let bound = PrincipalBound::new(1, 1);
    let pool = SessionPool::new(&config.upstream, config.pool.clone(), bound, metrics);
    let declaring = |ext: serde_json::Value| {
        let caps = serde_json::json!({"roots": {}, "extensions": ext});
        Declared::of(&caps, 4096).unwrap()
    };
    let (plain, none) = pool.admit("p", &declaring(serde_json::json!({})));
    assert_eq!(&*plain.capabilities, r#"{"roots":{}}"#);
    assert!(none.is_none(), "no extensions, nothing held");
    let (a, hold_a) = pool.admit("p", &declaring(serde_json::json!({"x/a": {"v": 1}})));
    assert_eq!(
        &*a.capabilities,
        r#"{"roots":{},"extensions":{"x/a":{"v":1}}}"#
    );
    let (b, hold_b) = pool.admit("p", &declaring(serde_json::json!({"x/b": {}})));
    assert_ne!(a, b);
    // A third declaration of the principal: served as if it declared none (plain's key).
    let (c, hold_c) = pool.admit("p", &declaring(serde_json::json!({"x/c": {}})));
    assert_eq!(c, plain);
    assert!(hold_c.is_none());
    // Another principal has its own bound.
    let (q, _hold_q) = pool.admit("q", &declaring(serde_json::json!({"x/c": {}})));
    assert!(q.capabilities.contains("x/c"));
    // A declaration no session holds counts for `pool.idle_timeout` (so eviction cannot turn
    // the bound into a session per request), then another may take its place.
    drop((hold_a, hold_b));
    assert_eq!(
        pool.admit("p", &declaring(serde_json::json!({"x/c": {}})))
            .0,
        plain
    );
    tokio::time::advance(config.pool.idle_timeout).await;
    let (c, _hold_c) = pool.admit("p", &declaring(serde_json::json!({"x/c": {}})));
    assert!(c.capabilities.contains("x/c"));
    assert_eq!(pool.extension_sets.held("p"), 1);
}
