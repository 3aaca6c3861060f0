//! `POST /v1/events` over HTTP: the route the admin process mounts behind its authentication.
//!
//! The authentication layer in front of it puts the caller's [`TenantScope`] in the request
//! extensions (`None` for an admin token, `Some(tenant)` for a tenant-scoped one); a request
//! without one is refused (500: a wiring bug, never an open door).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};

use crate::{Ingest, Publish, Rejected};

/// Whose events the caller may publish: `None` any tenant's, `Some(t)` only `t`'s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantScope(pub Option<String>);

/// The `/v1/events` route.
pub fn router(ingest: Arc<Ingest>) -> Router {
    Router::new()
        .route("/v1/events", post(publish))
        .with_state(ingest)
}

async fn publish(
    State(ingest): State<Arc<Ingest>>,
    scope: Option<Extension<TenantScope>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
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

fn error(status: StatusCode, code: &str, field: Option<&str>, message: &str) -> Response {
    let mut e = serde_json::json!({ "status": status.as_u16(), "code": code, "message": message });
    if let Some(f) = field {
        e["field"] = f.into();
    }
    (status, Json(serde_json::json!({ "error": e }))).into_response()
}
