//! `POST /v1/events` over HTTP: the route the admin process mounts behind its authentication.
//!
//! The authentication layer in front of it puts the caller's [`TenantScope`] in the request
//! extensions (`None` for an admin token, `Some(tenant)` for a tenant-scoped one); a request
//! without one is refused (500: a wiring bug, never an open door).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Extension, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};

use crate::{Ingest, Publish, Rejected};

/// Whose events the caller may publish: `None` any tenant's, `Some(t)` only `t`'s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantScope(pub Option<String>);

/// The `/v1/events` route, reading at most `max_body + 1` bytes of a body (a longer one is a
/// 413 before it is read further: memory stays bounded whatever a client sends).
pub fn router(ingest: Arc<Ingest>, max_body: usize) -> Router {
    Router::new()
        .route("/v1/events", post(publish))
        .layer(body_limit(max_body))
        .with_state(ingest)
}

/// The body limit to put on the route: one byte over the event limit, so "too large" is
/// answered by [`Ingest::publish`] with its JSON error where possible.
pub fn body_limit(max_body: usize) -> DefaultBodyLimit {
    DefaultBodyLimit::max(max_body.saturating_add(1))
}

/// `POST /v1/events`: the handler, public so the admin process can mount (and document) it.
pub async fn publish(
    State(ingest): State<Arc<Ingest>>,
    scope: Option<Extension<TenantScope>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                Some("body"),
                "the event is larger than input.max_payload_bytes",
            )
        }
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "unreadable_body",
                Some("body"),
                &e.body_text(),
            )
        }
    };
    let Some(Extension(TenantScope(scope))) = scope else {
        tracing::error!("POST /v1/events reached without an authenticated scope");
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            None,
            "no caller scope",
        );
    };
    let key = match headers.get("idempotency-key").map(HeaderValue::to_str) {
        None => None,
        Some(Ok(k)) => Some(k),
        Some(Err(_)) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_field",
                Some("Idempotency-Key"),
                "the Idempotency-Key header must be printable ASCII",
            )
        }
    };
    let request = Publish {
        tenant_scope: scope.as_deref(),
        idempotency_key: key,
        traceparent: headers.get("traceparent").and_then(|v| v.to_str().ok()),
        body: &body,
    };
    match ingest.publish(request).await {
        Ok(accepted) => (
            StatusCode::ACCEPTED,
            Json(serde_json::json!({ "id": accepted.id, "tenant": accepted.tenant })),
        )
            .into_response(),
        Err(rejected) => rejection(&rejected),
    }
}

/// The JSON error of a refused publish; a 503 carries `Retry-After`.
pub fn rejection(r: &Rejected) -> Response {
    let status = StatusCode::from_u16(r.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = error(status, r.code(), r.field(), r.message());
    if let Rejected::Unavailable { retry_after, .. } = r {
        if let Ok(v) = HeaderValue::from_str(&retry_after.as_secs().max(1).to_string()) {
            response.headers_mut().insert("retry-after", v);
        }
    }
    response
}

/// The JSON error every admin route answers with:
/// `{"error":{"status":400,"code":"invalid_field","field":"type","message":"…"}}`.
pub fn error(status: StatusCode, code: &str, field: Option<&str>, message: &str) -> Response {
    let mut e = serde_json::json!({ "status": status.as_u16(), "code": code, "message": message });
    if let Some(f) = field {
        e["field"] = f.into();
    }
    (status, Json(serde_json::json!({ "error": e }))).into_response()
}
