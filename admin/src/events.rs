//! `/v1/events`: publishing (handled by the ingest crate, documented here) and an event's
//! delivery history from the delivery log (`hookline trace` over HTTP).

use std::sync::Arc;

use axum::extract::{Extension, Path, State};
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use hookline_common::config::Config;
use hookline_control::attempts::Attempt;
use hookline_ingest::http::TenantScope;
use hookline_ingest::Ingest;

use crate::auth::Caller;
use crate::error::{ApiError, ApiResult};

/// `POST /v1/events` — documented here, handled by the ingest crate.
#[utoipa::path(
    post, path = "/v1/events", tag = "events",
    params(("Idempotency-Key" = Option<String>, Header,
        description = "Retrying with the same key (per tenant, within 24 h) returns the same event id and never delivers twice; reusing it with another body is a 422")),
    request_body(content = Object, description = "The event envelope, or `type` + `data` (+ `tenant`): the server assigns `id` (from the key when given)"),
    responses(
        (status = 202, description = "on `<p>.events`, acknowledged by Kafka: `{\"id\",\"tenant\"}`"),
        (status = 400, description = "bad body; `error.field` names the field"),
        (status = 401), (status = 403, description = "a tenant token publishing for another tenant"),
        (status = 413), (status = 422, description = "`idempotency_key_reused` with another body"),
        (status = 503, description = "Kafka did not acknowledge; retry after `Retry-After` with the same key"),
    ),
    security(("bearer" = []))
)]
pub async fn publish(
    state: State<Arc<Ingest>>,
    scope: Option<Extension<TenantScope>>,
    headers: axum::http::HeaderMap,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> axum::response::Response {
    hookline_ingest::http::publish(state, scope, headers, body).await
}

/// Every attempt of an event, oldest first, from every process.
#[derive(Debug, Serialize, ToSchema)]
pub struct Trace {
    #[schema(value_type = Vec<Object>)]
    pub attempts: Vec<Attempt>,
}

#[utoipa::path(
    get, path = "/v1/events/{id}/attempts", tag = "events",
    params(("id" = String, Path, description = "the event id")),
    responses(
        (status = 200, body = Trace, description = "each attempt: endpoint, attempt number, stage (`dispatcher`, `retry.5m`, `replay`), outcome, status or failure class, duration, time, next hop, process"),
        (status = 401), (status = 404, description = "no attempt of this event (that the token may see)"),
    ),
    security(("bearer" = []))
)]
pub async fn attempts(
    State(config): State<Arc<Config>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<Json<Trace>> {
    let all = hookline_control::trace::trace(&config, &id, None)
        .await
        .map_err(|e| ApiError::unavailable(&e))?;
    let attempts: Vec<Attempt> = all
        .into_iter()
        .filter(|a| caller.sees(a.tenant.as_deref()))
        .collect();
    if attempts.is_empty() {
        return Err(ApiError::not_found("event attempts"));
    }
    Ok(Json(Trace { attempts }))
}
