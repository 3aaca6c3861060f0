//! Trace export: the OpenTelemetry SDK with a batching OTLP/HTTP exporter, installed when
//! `traces.enabled` (the spans themselves are made through `hookline_common::runtime::traces`).
//!
//! Head sampling: `ParentBased(TraceIdRatioBased(traces.sample_ratio))` — a producer's sampled
//! flag is followed, a trace hookline starts is kept with the ratio. Export runs on the SDK's own
//! thread with a bounded queue (2,048 spans): a collector that is slow or down costs dropped
//! spans, never memory or delivery latency.

use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use opentelemetry_sdk::Resource;

use hookline_common::config::traces::TracesConfig;
use hookline_common::runtime::traces;

/// Flushes and stops the exporter when dropped (the end of `main`).
pub struct Export(Option<SdkTracerProvider>);

impl Drop for Export {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            if let Err(e) = p.shutdown() {
                tracing::warn!(error = %e, "flushing the last spans failed");
            }
        }
    }
}

/// Installs the exporter and turns span making on; nothing when `traces.enabled` is false.
/// Called before the async runtime starts (the exporter's HTTP client is a blocking one).
pub fn init(config: &TracesConfig, stage: &str) -> anyhow::Result<Export> {
    if !config.enabled {
        return Ok(Export(None));
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(config.endpoint.clone())
        .with_timeout(std::time::Duration::from_secs(10))
        .build()
        .map_err(|e| anyhow::anyhow!("traces.endpoint {}: {e}", config.endpoint))?;
    let resource = Resource::builder()
        .with_service_name(config.service_name.clone())
        .with_attribute(opentelemetry::KeyValue::new(
            "hookline.process",
            stage.to_string(),
        ))
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            config.sample_ratio,
        ))))
        .with_resource(resource)
        .build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    traces::enable(config.propagate);
    tracing::info!(
        endpoint = %config.endpoint,
        sample_ratio = config.sample_ratio,
        "exporting traces over OTLP/HTTP"
    );
    Ok(Export(Some(provider)))
}
