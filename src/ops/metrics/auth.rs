//! `[auth]`'s metrics: requests it refused, by why, its requests to the authorization server,
//! by endpoint and result, and the introspections it did not send, by why (never by principal
//! or token).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::labels::{
    AuthEndpoint, AuthFetchLabels, AuthRefusal, AuthRefusalLabel, FetchResult, IntrospectionSkip,
    IntrospectionSkipLabel,
};

/// Refusals, fetches and introspections not sent.
#[derive(Debug, Default)]
pub(crate) struct AuthMetrics {
    refusals: Family<AuthRefusalLabel, Counter>,
    fetches: Family<AuthFetchLabels, Counter>,
    skipped: Family<IntrospectionSkipLabel, Counter>,
}

impl AuthMetrics {
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "auth_refusals",
            "Requests [auth] refused, by reason",
            self.refusals.clone(),
        );
        r.register(
            "auth_fetches",
            "Requests to the authorization server (key set, introspection), by endpoint and result",
            self.fetches.clone(),
        );
        r.register(
            "auth_introspections_skipped",
            "Tokens not introspected: refused again from the negative cache, or past the rate bound",
            self.skipped.clone(),
        );
    }

    /// A request was refused for `reason`.
    pub(crate) fn refused(&self, reason: AuthRefusal) {
        self.refusals
            .get_or_create(&AuthRefusalLabel { reason })
            .inc();
    }

    /// The authorization server's `endpoint` was asked, with `ok` as the result.
    pub(crate) fn fetched(&self, endpoint: AuthEndpoint, ok: bool) {
        let result = if ok {
            FetchResult::Ok
        } else {
            FetchResult::Error
        };
        self.fetches
            .get_or_create(&AuthFetchLabels { endpoint, result })
            .inc();
    }

    /// A token was not introspected, for `reason`.
    pub(crate) fn skipped(&self, reason: IntrospectionSkip) {
        self.skipped
            .get_or_create(&IntrospectionSkipLabel { reason })
            .inc();
    }
}
