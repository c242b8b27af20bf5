//! What speaks for a principal upstream: the headers every request of its session carries (the
//! client's `Authorization` as it came, or the subject the proxy verified). A session keeps the
//! newest a leg brought, so an access token refreshed between two legs is what the next request
//! upstream (the answers of a resumed call among them) carries, never a stale one.

use std::sync::Arc;

use arc_swap::ArcSwap;
use http::{HeaderName, HeaderValue};

/// Headers sent upstream for a principal; cheap to clone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Credentials(Arc<[(HeaderName, HeaderValue)]>);

impl Credentials {
    /// Credentials made of `headers`.
    pub(crate) fn new(headers: Vec<(HeaderName, HeaderValue)>) -> Self {
        Self(headers.into())
    }

    /// These headers and `extra` (a leg's trace context).
    pub(crate) fn and(&self, extra: impl Iterator<Item = (HeaderName, HeaderValue)>) -> Self {
        let mut headers = self.0.to_vec();
        let before = headers.len();
        headers.extend(extra);
        if headers.len() == before {
            return self.clone();
        }
        Self(headers.into())
    }

    /// `b` with these headers added.
    pub(crate) fn apply(&self, mut b: http::request::Builder) -> http::request::Builder {
        if let Some(headers) = b.headers_mut() {
            self.append_to(headers);
        }
        b
    }

    /// Adds these headers to `headers`.
    pub(crate) fn append_to(&self, headers: &mut http::HeaderMap) {
        for (name, value) in self.0.iter() {
            headers.append(name.clone(), value.clone());
        }
    }

    /// The headers.
    pub(crate) fn headers(&self) -> &[(HeaderName, HeaderValue)] {
        &self.0
    }
}

/// A session's credentials: the latest a leg brought.
#[derive(Debug, Default)]
pub(crate) struct LiveCredentials(ArcSwap<Credentials>);

impl LiveCredentials {
    /// Starts with `first`.
    pub(crate) fn new(first: Credentials) -> Arc<Self> {
        Arc::new(Self(ArcSwap::from_pointee(first)))
    }

    /// What the next request carries.
    pub(crate) fn current(&self) -> Arc<Credentials> {
        self.0.load_full()
    }

    /// A leg of the same principal brought `newer` (a refreshed token, say). The same headers
    /// again (every leg, with `principal = "header"`) change nothing.
    pub(crate) fn renew(&self, newer: &Credentials) {
        if **self.0.load() != *newer {
            self.0.store(Arc::new(newer.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_credentials_go_on_the_next_request() {
        let token = |t: &'static str| {
            Credentials::new(vec![(
                http::header::AUTHORIZATION,
                HeaderValue::from_static(t),
            )])
        };
        let live = LiveCredentials::new(token("Bearer first"));
        live.renew(&token("Bearer refreshed"));
        let req = live
            .current()
            .apply(http::Request::builder())
            .body(())
            .unwrap();
        assert_eq!(req.headers()["authorization"], "Bearer refreshed");
        assert_eq!(req.headers().get_all("authorization").iter().count(), 1);
    }
}
