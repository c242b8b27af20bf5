//! OpenTelemetry traces over OTLP/HTTP (protobuf): the `tracing` spans of the request path become
//! OTel spans (`tracing-opentelemetry`), batched in a bounded queue (`[telemetry] max_queue`:
//! past it spans are dropped, never a request slowed) and POSTed to the collector by hyper on
//! the proxy's runtime. Sampling is parent-based: the client's sampled flag decides, else
//! `sample_ratio`.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{HttpClient, HttpError};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracerProvider,
};
use opentelemetry_sdk::Resource;
use tracing_subscriber::Layer;

use super::bounded::{Bounded, Counted, Pending};
use crate::config::Telemetry;

/// The OTLP path of traces under a collector's base URL.
const TRACES_PATH: &str = "/v1/traces";

/// A running export; [`Exporting::shutdown`] flushes what is queued.
#[derive(Debug)]
pub struct Exporting {
    provider: SdkTracerProvider,
}

impl Exporting {
    /// The export `telemetry` asks for, or `None` when it is off.
    ///
    /// # Errors
    /// The exporter cannot be built (a bad endpoint).
    pub(super) fn start(telemetry: &Telemetry, instance: &str) -> Result<Option<Self>, String> {
        let Some(endpoint) = &telemetry.otlp_endpoint else {
            return Ok(None);
        };
        let url = if endpoint.trim_end_matches('/').ends_with(TRACES_PATH) {
            endpoint.clone()
        } else {
            format!("{}{TRACES_PATH}", endpoint.trim_end_matches('/'))
        };
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(url)
            .with_timeout(telemetry.export_timeout)
            .with_http_client(OnRuntime::new(telemetry.export_timeout))
            .build()
            .map_err(|e| e.to_string())?;
        // The bound is `Bounded`'s (it counts what it drops): the batch queue below never fills.
        let pending = Pending::default();
        let batch = BatchConfigBuilder::default()
            .with_max_queue_size(telemetry.max_queue)
            .with_scheduled_delay(Duration::from_millis(500))
            .build();
        let processor = BatchSpanProcessor::builder(Counted::new(exporter, pending.clone()))
            .with_batch_config(batch)
            .build();
        let processor = Bounded::new(processor, pending, telemetry.max_queue);
        let sampler =
            Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(telemetry.sample_ratio)));
        let resource = Resource::builder()
            .with_service_name(telemetry.service_name.clone())
            .with_attribute(opentelemetry::KeyValue::new(
                "service.instance.id",
                instance.to_owned(),
            ))
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(sampler)
            .with_resource(resource)
            .build();
        Ok(Some(Self { provider }))
    }

    /// The layer that turns spans into OTel spans.
    pub(super) fn layer<S>(&self) -> Box<dyn Layer<S> + Send + Sync>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a> + Send + Sync,
    {
        let tracer = self.provider.tracer("mrtr-proxy");
        // The proxy's own spans at info and above: never its dependencies', whatever RUST_LOG.
        let spans = tracing_subscriber::filter::Targets::new()
            .with_target("mrtr_proxy", tracing::Level::INFO);
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            // A request's span starts when its parent (the client's context, known once the
            // body is read) and name are set, not when it is first entered.
            .with_context_activation(false)
            .with_filter(spans)
            .boxed()
    }

    /// Flushes the queue and stops exporting (at exit).
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::debug!(error = %e, "the trace export did not flush");
        }
    }
}

/// hyper (http and https) on the proxy's own runtime: the batch processor exports from a thread
/// of its own, where hyper has no runtime to run on.
#[derive(Debug, Clone)]
struct OnRuntime {
    client: opentelemetry_http::hyper::HyperClient<
        hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    >,
    runtime: Option<tokio::runtime::Handle>,
}

impl OnRuntime {
    fn new(timeout: Duration) -> Self {
        let https = crate::http_client::https_connector();
        Self {
            client: opentelemetry_http::hyper::HyperClient::new(https, timeout, None),
            runtime: tokio::runtime::Handle::try_current().ok(),
        }
    }
}

impl HttpClient for OnRuntime {
    fn send_bytes<'a, 'b>(
        &'a self,
        request: Request<Bytes>,
    ) -> Pin<Box<dyn Future<Output = Result<Response<Bytes>, HttpError>> + Send + 'b>>
    where
        'a: 'b,
        Self: 'b,
    {
        let client = self.client.clone();
        let runtime = self.runtime.clone();
        Box::pin(async move {
            let Some(runtime) = runtime else {
                return Err("no runtime to export on".into());
            };
            runtime
                .spawn(async move { client.send_bytes(request).await })
                .await
                .map_err(|e| -> HttpError { Box::new(e) })?
        })
    }
}
