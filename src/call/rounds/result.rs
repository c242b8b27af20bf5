//! The `input_required` result a round is sent as, written straight from what the round asks:
//! no tree is built for it. Members come in key order, as an object `Value` is written, so the
//! bytes are those of the tree it replaced (the round's tests pin them).

use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use serde_json::value::RawValue;

use crate::protocol::META_SERVER_INFO;

/// The `input_required` result asking `input_requests`, signed `token`, naming the server in
/// `_meta` when known, as JSON text.
pub(super) fn input_required(
    input_requests: InputRequests<'_>,
    token: &str,
    server_info: Option<&RawValue>,
) -> String {
    let result = InputRequired {
        input_requests,
        token,
        server_info,
    };
    // Nothing in it fails to serialize: string keys, JSON values.
    serde_json::to_string(&result).unwrap_or_default()
}

/// The `inputRequests` object: each embedded request by its key, in key order.
pub(super) struct InputRequests<'a>(Vec<(&'a str, &'a RawValue)>);

impl<'a> InputRequests<'a> {
    /// The requests `asked` (key, embedded request), put in key order.
    pub(super) fn new(mut asked: Vec<(&'a str, &'a RawValue)>) -> Self {
        asked.sort_unstable_by_key(|(key, _)| *key);
        Self(asked)
    }
}

impl Serialize for InputRequests<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().copied())
    }
}

struct InputRequired<'a> {
    input_requests: InputRequests<'a>,
    token: &'a str,
    server_info: Option<&'a RawValue>,
}

impl Serialize for InputRequired<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // In key order, as an object `Value` is written.
        let mut m = s.serialize_map(None)?;
        if let Some(info) = self.server_info {
            m.serialize_entry("_meta", &ServerMeta(info))?;
        }
        m.serialize_entry("inputRequests", &self.input_requests)?;
        m.serialize_entry("requestState", self.token)?;
        m.serialize_entry("resultType", "input_required")?;
        m.end()
    }
}

// `{"io.modelcontextprotocol/serverInfo": <info>}`
struct ServerMeta<'a>(&'a RawValue);

impl Serialize for ServerMeta<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map([(META_SERVER_INFO, self.0)])
    }
}
