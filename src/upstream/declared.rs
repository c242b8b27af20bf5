//! What a session declares in `initialize` for a modern request ([`Declared`]): the legacy
//! capabilities its declared ones map to, and its `extensions` but the proxy's own, as canonical
//! JSON text, the pool's key. And [`ExtensionSets`], the table that bounds how many extension
//! declarations one principal's sessions carry (`pool.max_extension_sets_per_principal`):
//! extensions are client input, and each new declaration would otherwise be a new session.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::{Map, Value};
use tokio::time::Instant;

use crate::protocol::TASKS_EXTENSION;

/// The capabilities a legacy client declares in `initialize` besides `extensions`, in key
/// order (that of a `serde_json::Map`: the text is canonical).
const LEGACY_CAPABILITIES: [&str; 4] = ["elicitation", "experimental", "roots", "sampling"];

/// Extensions the proxy implements itself for the legacy server, so never passed on: the
/// upstream would otherwise offer what only the proxy can serve.
const OWN_EXTENSIONS: [&str; 1] = [TASKS_EXTENSION];

/// What `initialize` declares upstream for a request, as canonical JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Declared {
    text: Arc<str>,
    /// Where the `extensions` member starts in `text` (its comma included) and where its object
    /// starts; it is the last member, so the object ends one byte before the text does.
    extensions: Option<(usize, usize)>,
}

/// The extensions a request passes on are larger than `pool.max_extensions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ExtensionsTooLarge {
    /// Bytes of their canonical JSON.
    pub(crate) bytes: usize,
}

/// Every principal's extension declarations: those sessions carry (open, or being opened), and
/// those whose last session closed less than `linger` ago. Counting the latter too keeps the
/// bound when the pool evicts: a principal starts at most `bound` new declarations per `linger`.
#[derive(Debug)]
pub(crate) struct ExtensionSets {
    bound: usize,
    linger: Duration,
    held: Mutex<HashMap<Arc<str>, Declarations>>,
}

/// One principal's declarations, by their canonical text.
type Declarations = HashMap<Arc<str>, Declaration>;

/// One declaration of a principal.
#[derive(Debug, Default)]
struct Declaration {
    holds: usize,
    /// When its last hold went (`None` while held).
    free_since: Option<Instant>,
}

/// A session's (or a lease's, while it opens one) hold on an extension declaration of its
/// principal.
#[derive(Debug)]
pub(crate) struct ExtensionHold {
    sets: Arc<ExtensionSets>,
    principal: Arc<str>,
    extensions: Arc<str>,
}

impl Declared {
    /// Maps the capabilities a modern request declared: `elicitation`, `experimental`, `roots`
    /// and `sampling` as they came, then `extensions` with every member but the proxy's own
    /// and those that are not objects (a declaration is an object of settings; a legacy SDK
    /// refuses an `initialize` with another). No `extensions` when none is left. Written
    /// without building a map; `serde_json::Map` sorts keys at every depth, so two orders of
    /// the same declaration give one text.
    ///
    /// # Errors
    /// [`ExtensionsTooLarge`] when the extensions passed on exceed `max_extensions_bytes`.
    pub(crate) fn of(
        modern: &Value,
        max_extensions_bytes: usize,
    ) -> Result<Self, ExtensionsTooLarge> {
        let mut out = Vec::with_capacity(64);
        out.push(b'{');
        let mut passed = None;
        // One pass over the members, in key order (the map's): the legacy ones are written as
        // they come, `extensions` kept for the end.
        for (key, v) in modern.as_object().into_iter().flatten() {
            if key == "extensions" {
                passed = v.as_object();
                continue;
            }
            if !LEGACY_CAPABILITIES.contains(&key.as_str()) {
                continue;
            }
            if out.len() > 1 {
                out.push(b',');
            }
            // The keys need no escaping; a `Value` always serializes, into a `Vec` infallibly.
            out.push(b'"');
            out.extend_from_slice(key.as_bytes());
            out.extend_from_slice(b"\":");
            let _ = serde_json::to_writer(&mut out, v);
        }
        let extensions = match passed.filter(|all| all.iter().any(passes_on)) {
            Some(all) => {
                let member = out.len();
                if out.len() > 1 {
                    out.push(b',');
                }
                out.extend_from_slice(b"\"extensions\":");
                let object = out.len();
                write_extensions(&mut out, all);
                let bytes = out.len() - object;
                if bytes > max_extensions_bytes {
                    return Err(ExtensionsTooLarge { bytes });
                }
                Some((member, object))
            }
            None => None,
        };
        out.push(b'}');
        let text = String::from_utf8(out).map_or_else(|_| Arc::from("{}"), Arc::from);
        Ok(Self { text, extensions })
    }

    /// Bytes of the extensions passed on (their canonical JSON; 0 when none), as the bound of
    /// [`Declared::of`] counts them.
    pub(crate) fn extension_bytes(&self) -> usize {
        self.extensions
            .map_or(0, |(_, object)| self.text.len().saturating_sub(object + 1))
    }

    /// Nothing declared (the proxy's own sessions: probes, checks).
    pub(crate) fn nothing() -> Self {
        Self {
            text: Arc::from("{}"),
            extensions: None,
        }
    }

    /// The canonical text.
    #[cfg(test)]
    pub(crate) fn text(&self) -> &str {
        &self.text
    }

    /// The canonical text, shared (the pool's key holds it).
    pub(crate) fn shared_text(&self) -> Arc<str> {
        Arc::clone(&self.text)
    }

    /// The extensions passed on, as canonical JSON text; `None` when there are none.
    pub(crate) fn extensions(&self) -> Option<&str> {
        let (_, object) = self.extensions?;
        self.text.get(object..self.text.len() - 1)
    }

    /// The text of the same declaration without its extensions.
    pub(crate) fn text_without_extensions(&self) -> String {
        match self.extensions {
            Some((member, _)) => format!("{}}}", self.text.get(..member).unwrap_or("{")),
            None => self.text.to_string(),
        }
    }
}

// Whether an extension member is passed on upstream.
fn passes_on((name, settings): (&String, &Value)) -> bool {
    settings.is_object() && !OWN_EXTENSIONS.contains(&name.as_str())
}

// The extensions passed on, as a JSON object.
fn write_extensions(out: &mut Vec<u8>, all: &Map<String, Value>) {
    out.push(b'{');
    let mut first = true;
    for (name, settings) in all.iter().filter(|m| passes_on(*m)) {
        if !first {
            out.push(b',');
        }
        first = false;
        // Client text: escaped as JSON, as serde_json writes any string.
        let _ = serde_json::to_writer(&mut *out, name);
        out.push(b':');
        let _ = serde_json::to_writer(&mut *out, settings);
    }
    out.push(b'}');
}

impl ExtensionSets {
    /// An empty table: each principal holds at most `bound` declarations (≥ 1), one counting
    /// for `linger` after its last session closed.
    pub(crate) fn new(bound: usize, linger: Duration) -> Arc<Self> {
        Arc::new(Self {
            bound: bound.max(1),
            linger,
            held: Mutex::new(HashMap::new()),
        })
    }

    /// A hold on declaration `extensions` of `principal`: one it counts already, or a new one
    /// within the bound. `None` past the bound.
    pub(crate) fn hold(
        self: &Arc<Self>,
        principal: &str,
        extensions: &str,
    ) -> Option<ExtensionHold> {
        let now = Instant::now();
        let mut held = self.lock();
        let principal = match held.get_key_value(principal) {
            Some((p, _)) => Arc::clone(p),
            None => Arc::from(principal),
        };
        let sets = held.entry(Arc::clone(&principal)).or_default();
        sets.retain(|_, d| !d.expired(now, self.linger));
        let extensions = match sets.get_key_value(extensions) {
            Some((e, _)) => Arc::clone(e),
            // A principal with nothing counted has room: the bound is at least 1.
            None if sets.len() >= self.bound => return None,
            None => Arc::from(extensions),
        };
        let declaration = sets.entry(Arc::clone(&extensions)).or_default();
        declaration.holds += 1;
        declaration.free_since = None;
        Some(ExtensionHold {
            sets: Arc::clone(self),
            principal,
            extensions,
        })
    }

    /// Forgets the declarations whose last session closed `linger` ago or more (the pool's
    /// reaper calls it: a principal that never comes back leaves nothing behind).
    pub(crate) fn forget_expired(&self) {
        let now = Instant::now();
        self.lock().retain(|_, sets| {
            sets.retain(|_, d| !d.expired(now, self.linger));
            !sets.is_empty()
        });
    }

    /// The declarations `principal` counts now.
    #[cfg(test)]
    pub(crate) fn held(&self, principal: &str) -> usize {
        let now = Instant::now();
        self.lock().get(principal).map_or(0, |sets| {
            sets.values()
                .filter(|d| !d.expired(now, self.linger))
                .count()
        })
    }

    fn release(&self, principal: &str, extensions: &str) {
        let mut held = self.lock();
        let declaration = held
            .get_mut(principal)
            .and_then(|sets| sets.get_mut(extensions));
        if let Some(d) = declaration {
            d.holds = d.holds.saturating_sub(1);
            if d.holds == 0 {
                d.free_since = Some(Instant::now());
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Arc<str>, Declarations>> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Declaration {
    fn expired(&self, now: Instant, linger: Duration) -> bool {
        self.holds == 0
            && self
                .free_since
                .is_some_and(|t| now.duration_since(t) >= linger)
    }
}

impl Drop for ExtensionHold {
    fn drop(&mut self) {
        self.sets.release(&self.principal, &self.extensions);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn text(modern: &Value) -> String {
        Declared::of(modern, 4096).unwrap().text().to_owned()
    }

    #[test]
    fn capability_mapping_keeps_legacy_keys_and_drops_the_rest() {
        let all = json!({"sampling":{},"roots":{"listChanged":true},"experimental":{"x":[1]},"elicitation":{}});
        let m = json!({"elicitation":{"form":{}},"extensions":{"io.modelcontextprotocol/tasks":{}},"roots":{},"other":1});
        for (modern, legacy) in [
            (m, json!({"elicitation":{"form":{}},"roots":{}})),
            (json!({}), json!({})),
            (json!([1]), json!({})),
            (all.clone(), all),
        ] {
            // The canonical text of the mapped capabilities (a `Map` sorts its keys).
            assert_eq!(text(&modern), crate::jsonrpc::text(&legacy));
            assert_eq!(Declared::of(&modern, 0).unwrap().extensions(), None);
        }
    }

    #[test]
    fn extensions_pass_on_last_without_the_proxys_own() {
        let modern = json!({"roots":{},"extensions":{
            "io.modelcontextprotocol/ui":{"mimeTypes":["text/html;profile=mcp-app"]},
            "io.modelcontextprotocol/tasks":{},
            "x.y/flag":true,
        }});
        let d = Declared::of(&modern, 4096).unwrap();
        let ui = r#"{"io.modelcontextprotocol/ui":{"mimeTypes":["text/html;profile=mcp-app"]}}"#;
        assert_eq!(d.text(), format!(r#"{{"roots":{{}},"extensions":{ui}}}"#));
        assert_eq!(d.extensions(), Some(ui));
        assert_eq!(d.text_without_extensions(), r#"{"roots":{}}"#);
        let only = Declared::of(&json!({"extensions":{"a":{}}}), 4096).unwrap();
        assert_eq!(only.text(), r#"{"extensions":{"a":{}}}"#);
        assert_eq!(only.text_without_extensions(), "{}");
        // Parsed back, the text is the declaration (what `initialize` carries).
        let parsed: Value = serde_json::from_str(d.text()).unwrap();
        assert_eq!(
            parsed["extensions"]["io.modelcontextprotocol/ui"]["mimeTypes"][0],
            "text/html;profile=mcp-app"
        );
    }

    #[test]
    fn key_order_does_not_change_the_text() {
        let a = r#"{"extensions":{"b/x":{"z":1,"a":{"q":[1],"p":2}},"a/y":{}},"roots":{}}"#;
        let b = r#"{"roots":{},"extensions":{"a/y":{},"b/x":{"a":{"p":2,"q":[1]},"z":1}}}"#;
        let da = Declared::of(&serde_json::from_str(a).unwrap(), 4096).unwrap();
        let db = Declared::of(&serde_json::from_str(b).unwrap(), 4096).unwrap();
        assert_eq!(da, db);
        assert_eq!(
            da.extensions(),
            Some(r#"{"a/y":{},"b/x":{"a":{"p":2,"q":[1]},"z":1}}"#)
        );
    }

    #[test]
    fn extensions_past_the_bound_are_refused_with_their_size() {
        let ext = json!({"extensions":{"a/b":{"v":"x".repeat(100)}}});
        let size = Declared::of(&ext, 4096)
            .unwrap()
            .extensions()
            .unwrap()
            .len();
        assert!(Declared::of(&ext, size).is_ok());
        assert_eq!(
            Declared::of(&ext, size - 1),
            Err(ExtensionsTooLarge { bytes: size })
        );
        // The proxy's own extension is not passed on, so not measured.
        let own = json!({"extensions":{TASKS_EXTENSION:{"v":"x".repeat(100)}}});
        assert!(Declared::of(&own, 1).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_principal_counts_at_most_its_bound_of_declarations_for_their_linger() {
        let linger = Duration::from_secs(60);
        let sets = ExtensionSets::new(2, linger);
        let a1 = sets.hold("p", "{a}").unwrap();
        let a2 = sets.hold("p", "{a}").unwrap();
        let b = sets.hold("p", "{b}").unwrap();
        assert!(sets.hold("p", "{c}").is_none(), "a third declaration");
        assert!(
            sets.hold("q", "{c}").is_some(),
            "another principal's are its own"
        );
        assert_eq!(sets.held("p"), 2);
        drop((a1, a2));
        // {a} has no session left, but counts for its linger: the bound holds under eviction.
        assert!(sets.hold("p", "{c}").is_none(), "{{a}} still counts");
        let a3 = sets
            .hold("p", "{a}")
            .expect("a lingering declaration is taken again");
        drop(a3);
        tokio::time::advance(linger).await;
        let c = sets
            .hold("p", "{c}")
            .expect("{a} is forgotten after its linger");
        drop((b, c));
        tokio::time::advance(linger).await;
        sets.forget_expired();
        assert!(sets.lock().is_empty(), "nothing is left behind");
    }
}
