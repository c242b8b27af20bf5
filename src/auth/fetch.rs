//! The authorization server's endpoints (a JWKS, an introspection endpoint): any origin, http or
//! https (rustls with the Mozilla roots), answers bounded in time and size. Rare requests, so
//! hyper-util's general client, not the one-origin client of the hot path.

use std::sync::Arc;
use std::time::Duration;

use http::{header, HeaderValue, Method, Request, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

use crate::ops::metrics::{AuthEndpoint, Metrics};

/// Largest answer read (a key set or an introspection answer).
const MAX_ANSWER_BYTES: usize = 256 * 1024;

/// Why the authorization server gave no usable answer: the proxy cannot decide, so the request
/// gets 503 (never an open door).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct FetchError(String);

/// A client for the authorization server's endpoints (GET: the key set; POST: introspection).
#[derive(Debug, Clone)]
pub(crate) struct Fetcher {
    client: Client<HttpsConnector<HttpConnector>, Full<bytes::Bytes>>,
    timeout: Duration,
    metrics: Arc<Metrics>,
}

impl Fetcher {
    /// A client giving each request `timeout` in all, counting them in `metrics`.
    pub(crate) fn new(timeout: Duration, metrics: Arc<Metrics>) -> Self {
        let https = crate::http_client::https_connector();
        Self {
            client: Client::builder(TokioExecutor::new()).build(https),
            timeout,
            metrics,
        }
    }

    /// GETs `uri` (the key set) and reads its JSON answer.
    pub(crate) async fn get_json(&self, uri: &Uri) -> Result<Value, FetchError> {
        let req = Request::get(uri.clone())
            .header(header::ACCEPT, "application/json")
            .body(Full::default())
            .map_err(|e| FetchError(e.to_string()))?;
        let answer = self.json(req).await;
        self.metrics
            .auth
            .fetched(AuthEndpoint::Jwks, answer.is_ok());
        answer
    }

    /// POSTs a form to `uri` (with HTTP Basic credentials, if any) and reads its JSON answer.
    pub(crate) async fn post_form(
        &self,
        uri: &Uri,
        basic: Option<&HeaderValue>,
        form: String,
    ) -> Result<Value, FetchError> {
        let mut req = Request::builder()
            .method(Method::POST)
            .uri(uri.clone())
            .header(header::ACCEPT, "application/json")
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
        if let Some(b) = basic {
            req = req.header(header::AUTHORIZATION, b.clone());
        }
        let req = req
            .body(Full::from(form))
            .map_err(|e| FetchError(e.to_string()))?;
        let answer = self.json(req).await;
        self.metrics
            .auth
            .fetched(AuthEndpoint::Introspection, answer.is_ok());
        answer
    }

    async fn json(&self, req: Request<Full<bytes::Bytes>>) -> Result<Value, FetchError> {
        let uri = req.uri().clone();
        let exchange = async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| FetchError(format!("{uri}: {e}")))?;
            let status = resp.status();
            let body = Limited::new(resp.into_body(), MAX_ANSWER_BYTES)
                .collect()
                .await
                .map_err(|e| FetchError(format!("{uri}: {e}")))?
                .to_bytes();
            if !status.is_success() {
                return Err(FetchError(format!("{uri} answered {status}")));
            }
            serde_json::from_slice(&body).map_err(|e| FetchError(format!("{uri}: not JSON: {e}")))
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| FetchError(format!("{uri}: no answer within {:?}", self.timeout)))?
    }
}
