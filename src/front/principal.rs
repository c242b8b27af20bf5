//! Who is asking: the principal a request speaks for, as the configured header names it.
//! Sessions are keyed by its digest and tokens bound to it; the header itself goes upstream.

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::state::principal_digest;

/// The digest that keys sessions and binds tokens, and the header forwarded upstream on the
/// principal's sessions.
pub(super) struct Principal {
    pub(super) digest: String,
    pub(super) header: Option<(HeaderName, HeaderValue)>,
}

impl Principal {
    /// The principal of a request with `headers`, named by the header `name`.
    pub(super) fn of(name: &HeaderName, headers: &HeaderMap) -> Self {
        let header = headers.get(name).map(|v| (name.clone(), v.clone()));
        Self {
            digest: principal_digest(header.as_ref().map(|(_, v)| v.as_bytes())),
            header,
        }
    }
}
