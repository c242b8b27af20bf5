//! The pool's own unit tests.

use crate::config::Config;

use super::*;

#[tokio::test]
async fn a_stdio_pool_is_bounded_by_its_processes_and_counts_none_open_at_first() {
    let config =
        Config::from_toml_str("[upstream]\ncommand = [\"server\"]\nmax_processes = 3\n").unwrap();
    let bound = PrincipalBound::new(1, 1);
    let pool = SessionPool::new(&config.upstream, config.pool.clone(), bound);
    assert_eq!(pool.open_sessions(), 0);
    assert_eq!(pool.permits.available_permits(), 3);
}
