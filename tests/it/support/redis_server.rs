//! A real `redis-server` for the tests of the shared task store: each test starts its own on a
//! free loopback port, without persistence, and it is killed when dropped. `tests/run.sh`
//! installs the Debian package when it is missing; a machine without it fails these tests
//! (they are never skipped). [`RedisServer::start_tls`] starts one that speaks only TLS.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::pki::Pki;

/// A running `redis-server`.
pub struct RedisServer {
    pub port: u16,
    child: Child,
    tls: Option<Tls>,
}

/// The files of a server that speaks only TLS: its certificate and key, the CA it trusts for
/// client certificates (and the test's own connection trusts for it), the client's.
#[derive(Clone)]
struct Tls {
    pki: [PathBuf; 5],
    auth_clients: bool,
}

impl RedisServer {
    /// Starts one and waits (bounded: 10 s) until it answers. The port is free when asked
    /// for, but another test may take it before redis-server binds it: then redis-server exits
    /// and another port is tried (5 at most).
    pub async fn start() -> Self {
        Self::start_with(None).await
    }

    /// Starts one that speaks only TLS, with `pki`'s certificate `server` (`"server"` or
    /// `"stranger"`), asking clients for a certificate `pki`'s CA signed when `auth_clients`
    /// (`tls-auth-clients yes`).
    pub async fn start_tls(pki: &Pki, server: &str, auth_clients: bool) -> Self {
        let (cert, key) = (format!("{server}.pem"), format!("{server}.key"));
        let files = [&cert, &key, "ca.pem", "client.pem", "client.key"];
        let tls = Tls {
            pki: files.map(|f| pki.file(f)),
            auth_clients,
        };
        Self::start_with(Some(tls)).await
    }

    async fn start_with(tls: Option<Tls>) -> Self {
        for _ in 0..5 {
            // A free port, asked of the kernel (`--port 0` would turn Redis's TCP off).
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let mut server = Self {
                port,
                child: spawn(port, tls.as_ref()),
                tls: tls.clone(),
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
        self.child = spawn(self.port, self.tls.as_ref());
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
    // One that speaks TLS is asked only to accept a TCP connection: its certificate may name
    // another host than 127.0.0.1 (a test of the name check).
    async fn answering(&mut self) -> bool {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !self.accepting().await {
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

    async fn accepting(&self) -> bool {
        if self.tls.is_some() {
            let addr = ("127.0.0.1", self.port);
            tokio::net::TcpStream::connect(addr).await.is_ok()
        } else {
            self.connection().await.is_ok()
        }
    }

    /// `redis://127.0.0.1:<port>/0`, or `rediss://…` when it speaks TLS.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}/0", self.port)
    }

    /// A connection of the test's own, to look at (or tamper with) what the store holds (over
    /// TLS with the client certificate when it speaks TLS).
    pub async fn connection(&self) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        let client = match &self.tls {
            None => redis::Client::open(self.url())?,
            Some(Tls {
                pki: [.., ca, cert, key],
                ..
            }) => {
                let read = |p: &PathBuf| std::fs::read(p).unwrap();
                let certs = redis::TlsCertificates {
                    client_tls: Some(redis::ClientTlsConfig {
                        client_cert: read(cert),
                        client_key: read(key),
                    }),
                    root_cert: Some(read(ca)),
                };
                redis::Client::build_with_tls(self.url(), certs)?
            }
        };
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

fn spawn(port: u16, tls: Option<&Tls>) -> Child {
    let mut command = Command::new("redis-server");
    let port = port.to_string();
    match tls {
        None => command.args(["--port", &port]),
        Some(Tls {
            pki: [cert, key, ca, ..],
            auth_clients,
        }) => command
            .args(["--port", "0", "--tls-port", &port])
            .arg("--tls-cert-file")
            .arg(cert)
            .arg("--tls-key-file")
            .arg(key)
            .arg("--tls-ca-cert-file")
            .arg(ca)
            .args([
                "--tls-auth-clients",
                if *auth_clients { "yes" } else { "no" },
            ]),
    };
    command
        .args(["--bind", "127.0.0.1"])
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
