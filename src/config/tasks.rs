//! `[tasks]`: the persistent workflow of the `io.modelcontextprotocol/tasks` extension. A
//! `tools/call` from a client that declares the extension becomes a task when it has neither
//! finished nor asked for input within `after` (per tool: `always`, `never` or `after` in
//! `[tasks.tools]`, keyed by name or glob); the task then lives until `ttl`, in this instance's
//! memory (`store = "memory"`) or in a Redis / Valkey store the replicas share.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::auth::SecretSource;
use super::error::{invalid, positive, ConfigError};
use super::state::HeldBounds;
use super::store_tls::StoreTls;
use super::units::{duration, nonzero_duration, size};

/// `[tasks]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawTasks {
    /// `enabled`
    pub enabled: Option<bool>,
    /// `after`
    pub after: Option<String>,
    /// `ttl`
    pub ttl: Option<String>,
    /// `poll_interval`
    pub poll_interval: Option<String>,
    /// `max`
    pub max: Option<usize>,
    /// `max_per_principal`
    pub max_per_principal: Option<usize>,
    /// `max_memory`
    pub max_memory: Option<String>,
    /// `store`
    pub store: Option<String>,
    /// `store_prefix`
    pub store_prefix: Option<String>,
    /// `store_password_env`
    pub store_password_env: Option<String>,
    /// `store_password_file`
    pub store_password_file: Option<String>,
    /// `store_timeout`
    pub store_timeout: Option<String>,
    /// `store_ca_file`
    pub store_ca_file: Option<String>,
    /// `store_cert_file`
    pub store_cert_file: Option<String>,
    /// `store_key_file`
    pub store_key_file: Option<String>,
    /// `lease`
    pub lease: Option<String>,
    /// `[tasks.tools]`
    pub tools: BTreeMap<String, String>,
}

/// When a tool's call becomes a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskMode {
    /// As soon as it is sent upstream.
    Always,
    /// Never: it stays an ordinary call, however long it runs.
    Never,
    /// When it has neither finished nor asked for input within `tasks.after`.
    After,
}

/// Where task records live.
#[derive(Debug, Clone)]
pub enum Store {
    /// In this process's memory: a task dies with its replica.
    Memory,
    /// In Redis (>= 6) or Valkey, shared by the replicas.
    Redis(RedisStore),
}

/// `store = "redis://…"` and its settings.
#[derive(Debug, Clone)]
pub struct RedisStore {
    /// `redis://[user@]host:port/db` or `rediss://…` (TLS); never a password.
    pub url: String,
    /// What every key starts with (`"mrtr:"`).
    pub prefix: String,
    /// Where the password is read from at start-up, if the store wants one.
    pub password: Option<SecretSource>,
    /// How long one store operation may take.
    pub timeout: Duration,
    /// How long a holder's lease on a task lasts unless renewed (it renews every third of it):
    /// a task whose holder is gone is adopted this long after its last renewal.
    pub lease: Duration,
    /// For `rediss://`: the CAs trusted and the client certificate, as files read at start-up.
    pub tls: StoreTls,
}

/// `[tasks]`, validated.
#[derive(Debug, Clone)]
pub struct Tasks {
    /// Whether the extension is offered at all.
    pub enabled: bool,
    /// How long a call runs (without finishing or asking) before it becomes a task.
    pub after: Duration,
    /// How long a task lives from its creation (`ttlMs`): a running one is cancelled upstream
    /// then, a finished one's result is kept until then.
    pub ttl: Duration,
    /// The poll interval suggested to clients (`pollIntervalMs`).
    pub poll_interval: Duration,
    /// Tasks on this instance (running and finished, until their TTL).
    pub max: usize,
    /// Tasks per principal.
    pub max_per_principal: usize,
    /// Memory charged to tasks in all (params, inputs asked, results, a fixed overhead each).
    pub max_memory: usize,
    /// Where task records live.
    pub store: Store,
    /// Per-tool modes: exact names first, then globs (longest pattern first).
    tools: Vec<(String, Option<glob::Pattern>, TaskMode)>,
}

impl Tasks {
    pub(super) fn from_raw(mut raw: RawTasks) -> Result<Self, ConfigError> {
        let store = Store::from_raw(&raw)?;
        let mut tools = std::mem::take(&mut raw.tools)
            .into_iter()
            .map(|(pattern, mode)| {
                let mode = match mode.as_str() {
                    "always" => TaskMode::Always,
                    "never" => TaskMode::Never,
                    "after" => TaskMode::After,
                    _ => {
                        return Err(invalid(
                            "tasks.tools",
                            "want \"always\", \"never\" or \"after\"",
                        ))
                    }
                };
                let glob = if pattern.contains(['*', '?', '[']) {
                    let g = glob::Pattern::new(&pattern)
                        .map_err(|e| invalid("tasks.tools", format!("`{pattern}`: {e}")))?;
                    Some(g)
                } else {
                    None
                };
                Ok((pattern, glob, mode))
            })
            .collect::<Result<Vec<_>, _>>()?;
        tools.sort_by_key(|(p, g, _)| (g.is_some(), std::cmp::Reverse(p.len())));
        let ttl = nonzero_duration("tasks.ttl", raw.ttl.as_deref(), "1h")?;
        let after = duration("tasks.after", raw.after.as_deref(), "5s")?;
        if after >= ttl {
            return Err(invalid("tasks.after", "must be shorter than tasks.ttl"));
        }
        Ok(Self {
            enabled: raw.enabled.unwrap_or(true),
            after,
            ttl,
            poll_interval: nonzero_duration(
                "tasks.poll_interval",
                raw.poll_interval.as_deref(),
                "1s",
            )?,
            max: positive("tasks.max", raw.max, 1000)?,
            max_per_principal: positive("tasks.max_per_principal", raw.max_per_principal, 100)?,
            max_memory: size("tasks.max_memory", raw.max_memory.as_deref(), "80MiB")?,
            store,
            tools,
        })
    }

    /// The bounds on tasks held.
    pub fn bounds(&self) -> HeldBounds {
        HeldBounds {
            total: self.max,
            per_principal: self.max_per_principal,
            bytes: self.max_memory,
        }
    }

    /// Makes `tool` (an exact name) become a task in `mode`, over what the file said (the
    /// demo's slow tool).
    pub fn set_mode(&mut self, tool: &str, mode: TaskMode) {
        self.tools.retain(|(p, _, _)| p != tool);
        self.tools.insert(0, (tool.to_owned(), None, mode));
    }

    /// When a call of `tool` becomes a task.
    pub fn mode_for(&self, tool: &str) -> TaskMode {
        self.tools
            .iter()
            .find(|(p, g, _)| match g {
                Some(g) => g.matches(tool),
                None => p == tool,
            })
            .map_or(TaskMode::After, |(_, _, m)| *m)
    }
}

impl Store {
    fn from_raw(raw: &RawTasks) -> Result<Self, ConfigError> {
        let url = match raw.store.as_deref() {
            // The store's other keys mean nothing without one.
            None | Some("memory") => return Ok(Self::Memory),
            Some(url) => url,
        };
        let files = [
            &raw.store_ca_file,
            &raw.store_cert_file,
            &raw.store_key_file,
        ];
        let tls = StoreTls::from_raw(files.map(Option::as_deref), is_tls(url)?)?;
        let password = match (&raw.store_password_env, &raw.store_password_file) {
            (None, None) => None,
            (Some(e), None) => Some(SecretSource::Env(e.clone())),
            (None, Some(f)) => Some(SecretSource::File(PathBuf::from(f))),
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "tasks.store_password_env",
                    "set one of store_password_env and store_password_file",
                ))
            }
        };
        let prefix = raw.store_prefix.clone().unwrap_or_else(|| "mrtr:".into());
        if prefix.is_empty() || prefix.len() > 64 || prefix.contains(char::is_whitespace) {
            return Err(invalid(
                "tasks.store_prefix",
                "1 to 64 characters, no spaces",
            ));
        }
        let timeout = nonzero_duration("tasks.store_timeout", raw.store_timeout.as_deref(), "2s")?;
        let lease = nonzero_duration("tasks.lease", raw.lease.as_deref(), "15s")?;
        if lease < 3 * timeout {
            return Err(invalid(
                "tasks.lease",
                "must be at least three store_timeouts (it is renewed every third)",
            ));
        }
        Ok(Self::Redis(RedisStore {
            url: url.to_owned(),
            prefix,
            password,
            timeout,
            lease,
            tls,
        }))
    }
}

/// Whether the store at `url` is `rediss://`.
///
/// # Errors
/// Not a Redis URL, a password in it, or `#insecure` (certificate checks off).
fn is_tls(url: &str) -> Result<bool, ConfigError> {
    let info = redis::IntoConnectionInfo::into_connection_info(url).map_err(|_| {
        invalid(
            "tasks.store",
            "want \"memory\", redis://host:port/db or rediss://…",
        )
    })?;
    if info.redis_settings().password().is_some() {
        return Err(invalid(
            "tasks.store",
            "no password in the URL: set store_password_env or store_password_file",
        ));
    }
    match info.addr() {
        redis::ConnectionAddr::TcpTls { insecure: true, .. } => Err(invalid(
            "tasks.store",
            "`#insecure` turns off the store's certificate check (anyone on the path could \
             read and forge task records): give store_ca_file for a private CA",
        )),
        redis::ConnectionAddr::TcpTls { .. } => Ok(true),
        _ => Ok(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tasks(toml: &str) -> Result<Tasks, ConfigError> {
        Tasks::from_raw(toml::from_str(toml).unwrap())
    }

    #[test]
    fn defaults() {
        let t = tasks("").unwrap();
        assert!(t.enabled);
        assert_eq!(t.after, Duration::from_secs(5));
        assert_eq!(t.ttl, Duration::from_secs(3600));
        assert_eq!(t.mode_for("anything"), TaskMode::After);
    }

    #[test]
    fn exact_names_win_over_globs_and_longer_globs_win() {
        let t = tasks(
            r#"[tools]
            "report_*" = "always"
            "report_quick*" = "never"
            report_quickest = "after"
            "*" = "never""#,
        )
        .unwrap();
        assert_eq!(t.mode_for("report_big"), TaskMode::Always);
        assert_eq!(t.mode_for("report_quick1"), TaskMode::Never);
        assert_eq!(t.mode_for("report_quickest"), TaskMode::After);
        assert_eq!(t.mode_for("other"), TaskMode::Never);
    }

    #[test]
    fn the_store_is_memory_unless_a_redis_url_is_given() {
        assert!(matches!(tasks("").unwrap().store, Store::Memory));
        let t = tasks("store = \"redis://127.0.0.1:6379/2\"\nstore_password_env = \"P\"").unwrap();
        let Store::Redis(r) = t.store else {
            panic!("not redis")
        };
        assert_eq!(
            (r.url.as_str(), r.prefix.as_str()),
            ("redis://127.0.0.1:6379/2", "mrtr:")
        );
        assert!(matches!(r.password, Some(SecretSource::Env(ref v)) if v == "P"));
        assert_eq!(
            (r.timeout, r.lease),
            (Duration::from_secs(2), Duration::from_secs(15))
        );
        assert!(tasks("store = \"rediss://cache.internal:6380/0\"").is_ok());
    }

    #[test]
    fn a_store_password_never_sits_in_the_url_and_bad_store_settings_are_refused() {
        let e = tasks("store = \"redis://:hunter2@127.0.0.1:6379/0\"").unwrap_err();
        assert!(
            e.to_string().contains("store_password_env") && !e.to_string().contains("hunter2"),
            "{e}"
        );
        let e = tasks("store = \"mysql://x\"").unwrap_err();
        assert!(e.to_string().contains("tasks.store"), "{e}");
        let e = tasks("store = \"redis://h/0\"\nstore_timeout = \"10s\"").unwrap_err();
        assert!(e.to_string().contains("tasks.lease"), "{e}");
        let both =
            "store = \"redis://h/0\"\nstore_password_env = \"A\"\nstore_password_file = \"/f\"";
        assert!(tasks(both).is_err());
    }

    #[test]
    fn bad_values_name_the_key() {
        let e = tasks("[tools]\nx = \"sometimes\"").unwrap_err();
        assert!(e.to_string().contains("tasks.tools"), "{e}");
        let e = tasks("after = \"2h\"").unwrap_err();
        assert!(e.to_string().contains("tasks.after"), "{e}");
        let e = tasks("max = 0").unwrap_err();
        assert!(e.to_string().contains("tasks.max"), "{e}");
    }

    fn tls(toml: &str) -> Result<StoreTls, String> {
        match tasks(toml).map_err(|e| e.to_string())?.store {
            Store::Redis(r) => Ok(r.tls),
            Store::Memory => Err("memory".into()),
        }
    }

    #[test]
    fn a_rediss_store_takes_a_ca_and_a_client_certificate_with_its_key() {
        let t = tls("store = \"rediss://cache:6380/0\"").unwrap();
        assert!(t.is_default(), "the public roots, no client certificate");
        let t = tls(concat!(
            "store = \"rediss://cache:6380/0\"\nstore_ca_file = \"/etc/ca.pem\"\n",
            "store_cert_file = \"/etc/c.pem\"\nstore_key_file = \"/etc/c.key\"",
        ))
        .unwrap();
        assert_eq!(t.ca_file, Some(std::path::PathBuf::from("/etc/ca.pem")));
        let client = t.client.unwrap();
        assert_eq!(
            (client.cert_file.to_str(), client.key_file.to_str()),
            (Some("/etc/c.pem"), Some("/etc/c.key"))
        );
    }

    #[test]
    fn tls_keys_on_a_plain_store_a_lone_cert_or_key_and_insecure_are_refused_by_name() {
        let (plain, tls_store) = ("store = \"redis://h/0\"\n", "store = \"rediss://h/0\"\n");
        for (store, more, key) in [
            (plain, "store_ca_file = \"/ca\"", "tasks.store_ca_file"),
            (plain, "store_cert_file = \"/c\"", "tasks.store_cert_file"),
            (plain, "store_key_file = \"/k\"", "tasks.store_key_file"),
            (
                tls_store,
                "store_cert_file = \"/c\"",
                "tasks.store_cert_file",
            ),
            (tls_store, "store_key_file = \"/k\"", "tasks.store_key_file"),
            (tls_store, "store_ca_file = \"\"", "tasks.store_ca_file"),
            ("store = \"rediss://h/#insecure\"", "", "tasks.store"),
        ] {
            let e = tls(&format!("{store}{more}")).unwrap_err();
            assert!(e.contains(&format!("`{key}`")), "{store}{more}: {e}");
        }
        let e = tls("store = \"rediss://h/#insecure\"").unwrap_err();
        assert!(e.contains("store_ca_file"), "says what to do instead: {e}");
    }
}
