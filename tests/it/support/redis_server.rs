//! A real `redis-server` for the tests of the shared task store: each test starts its own on a
//! free loopback port, without persistence, and it is killed when dropped. `tests/run.sh`
//! installs the Debian package when it is missing; a machine without it fails these tests
//! (they are never skipped).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running `redis-server`.
pub struct RedisServer {
    pub port: u16,
    child: Child,
}

impl RedisServer {
    /// Starts one and waits (bounded: 10 s) until it answers. The port is free when asked
    /// for, but another test may take it before redis-server binds it: then redis-server exits
    /// and another port is tried (5 at most).
    pub async fn start() -> Self {
        for _ in 0..5 {
            // A free port, asked of the kernel (`--port 0` would turn Redis's TCP off).
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let mut server = Self {
                port,
                child: spawn(port),
            };
            if server.answering().await {
                return server;
            }
        }
        panic!("redis-server did not start on any of 5 free ports");
    }

    /// Kills it and starts an empty one on the same port (a store without persistence that
    /// restarted, or failed over).
    pub async fn restart_empty(&mut self) {
        self.stop();
        self.child = spawn(self.port);
        assert!(
            self.answering().await,
            "redis-server did not start again on its port"
        );
    }

    /// Kills it (the store is down until [`RedisServer::restart_empty`]).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    // Whether it answers (bounded: 10 s); `false` at once when it exited (its port was taken).
    async fn answering(&mut self) -> bool {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while self.connection().await.is_err() {
            if self.child.try_wait().ok().flatten().is_some() {
                return false;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "redis-server did not answer"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }

    /// `redis://127.0.0.1:<port>/0`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// A connection of the test's own, to look at (or tamper with) what the store holds.
    pub async fn connection(&self) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        let client = redis::Client::open(self.url())?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        redis::cmd("PING").query_async::<String>(&mut conn).await?;
        Ok(conn)
    }

    /// Every key and its value (strings only: that is all the store writes).
    pub async fn dump(&self) -> Vec<(String, String)> {
        let mut conn = self.connection().await.unwrap();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query_async(&mut conn)
            .await
            .unwrap();
        let mut out = Vec::new();
        for k in keys {
            let v: Option<String> = redis::cmd("GET")
                .arg(&k)
                .query_async(&mut conn)
                .await
                .unwrap();
            out.push((k, v.unwrap_or_default()));
        }
        out
    }
}

fn spawn(port: u16) -> Child {
    Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server is installed (tests/run.sh installs it)")
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
