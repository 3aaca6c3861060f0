//! `/v1/endpoints`: the live registry over HTTP (list, create, show, update, enable/disable,
//! delete, rotate the secret, health, a test send). Writes go through `hookline_control::Registry` — an
//! acknowledged Kafka transaction with optimistic concurrency (`version`), visible to every
//! process within about a second — so the API, the CLI and every pod agree.
//!
//! Tenant tokens see and change only endpoints of their tenant; creating one sets the tenant.
//! An endpoint for every tenant (`tenant` absent) is an admin's. A generated signing secret is
//! returned once, by the call that made it.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Extension, Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use hookline_common::contract::delivery::now_ms;
use hookline_control::endpoint::{generate_secret, FieldError};
use hookline_control::health::HealthReport;
use hookline_control::import::{Definition, Outcome, MAX_BATCH};
use hookline_control::set;
use hookline_control::tracker::Health;
use hookline_control::{Endpoint, EndpointUpdate, HeaderEdit, Registry, WriteError};

use crate::auth::Caller;
use crate::error::{ApiError, ApiResult};

/// What the endpoint routes share.
#[derive(Clone)]
pub struct Control {
    pub registry: Registry,
    pub health: Arc<Health>,
}

fn write_error(e: WriteError) -> ApiError {
    let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    match e {
        WriteError::Invalid(f) => ApiError::field(&f.field, f.reason),
        WriteError::NotFound { .. } => ApiError::not_found("endpoint"),
        WriteError::AlreadyExists { .. } => ApiError::new(status, "already_exists", e.to_string()),
        WriteError::Conflict { .. } => ApiError::new(status, "version_conflict", e.to_string()),
        WriteError::FileManaged { .. } => ApiError::new(status, "file_managed", e.to_string()),
        WriteError::Crypto(_) => {
            tracing::error!(error = %e, "endpoint secret could not be sealed");
            ApiError::new(status, "secrets_key", e.to_string())
        }
        WriteError::Kafka(ref k) => ApiError::unavailable(k),
    }
}

/// The endpoint `id` if the caller may see it (another tenant's is a 404).
fn visible(c: &Control, caller: &Caller, id: &str) -> ApiResult<Endpoint> {
    c.registry
        .get(id)
        .filter(|e| caller.sees(e.tenant.as_deref()))
        .ok_or_else(|| ApiError::not_found("endpoint"))
}

fn body<T>(b: Result<Json<T>, JsonRejection>) -> ApiResult<T> {
    b.map(|Json(t)| t)
        .map_err(|e| ApiError::field("body", e.body_text()))
}

fn duration(field: &str, text: &str) -> ApiResult<Duration> {
    humantime::parse_duration(text)
        .map_err(|e| ApiError::field(field, format!("`{text}` is not a duration: {e}")))
}

/// The tenant a caller's write sets: a tenant token's own (asking for another is a 403).
fn tenant_for(caller: &Caller, asked: Option<String>) -> ApiResult<Option<String>> {
    match (caller.tenant(), asked) {
        (None, asked) => Ok(asked),
        (Some(mine), None) => Ok(Some(mine.to_string())),
        (Some(mine), Some(t)) if t == mine => Ok(Some(t)),
        (Some(_), Some(_)) => Err(ApiError {
            field: Some("tenant".into()),
            ..ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                "a tenant token manages only its own tenant's endpoints",
            )
        }),
    }
}

/// An endpoint as the API shows it (never a secret value: only how many sign and until when).
#[derive(Debug, Serialize, ToSchema)]
pub struct EndpointView {
    #[schema(value_type = Object)]
    #[serde(flatten)]
    pub endpoint: Value,
}

fn view(e: &Endpoint) -> Json<Value> {
    Json(e.to_json(now_ms()))
}

/// A page of endpoints, by id.
#[derive(Debug, Serialize, ToSchema)]
pub struct EndpointList {
    #[schema(value_type = Vec<Object>)]
    pub items: Vec<Value>,
    /// Pass as `cursor` for the next page; absent on the last page.
    pub next_cursor: Option<String>,
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only this tenant's endpoints (a tenant token always sees only its own).
    pub tenant: Option<String>,
    /// `enabled`, `disabled` or `unusable` (a secret this process cannot open).
    pub state: Option<String>,
    /// Only endpoints whose URL starts with this (`https://hooks.acme.example/`).
    pub url_prefix: Option<String>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
    /// Page size, 1..=1000 (default 100).
    pub limit: Option<usize>,
}

/// An endpoint with the signing secret the call made (shown only in this answer).
#[derive(Debug, Serialize, ToSchema)]
pub struct WithSecret {
    #[schema(value_type = Object)]
    pub endpoint: Value,
    /// `whsec_…`: give it to the receiver; it is not shown again.
    pub secret: Option<String>,
}

#[utoipa::path(
    get, path = "/v1/endpoints", tag = "endpoints",
    params(ListQuery),
    responses(
        (status = 200, body = EndpointList),
        (status = 400, description = "a bad `limit`, `state` or `cursor` (named in `error.field`)"),
        (status = 401),
    ),
    security(("bearer" = []))
)]
pub async fn list(
    State(c): State<Control>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<ListQuery>,
) -> ApiResult<Json<EndpointList>> {
    let query = list_query(q)?;
    let now = now_ms();
    let set = c.registry.current();
    let page = set.page(&query, |t| caller.sees(t));
    Ok(Json(EndpointList {
        items: page.items.iter().map(|e| e.to_json(now)).collect(),
        next_cursor: page.next,
    }))
}

/// The list query, checked: a bad field is a 400 naming it.
fn list_query(q: ListQuery) -> ApiResult<set::Query> {
    let limit = q.limit.unwrap_or(set::DEFAULT_PAGE);
    if !(1..=set::MAX_PAGE).contains(&limit) {
        return Err(ApiError::field(
            "limit",
            format!("must be 1..={}", set::MAX_PAGE),
        ));
    }
    let non_empty = |v: Option<String>| v.filter(|s| !s.trim().is_empty());
    let state = non_empty(q.state)
        .map(|s| set::State::parse(&s))
        .transpose()
        .map_err(|e| ApiError::field("state", e))?;
    let after = non_empty(q.cursor);
    if let Some(c) = &after {
        if c.len() > 64
            || !c
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || "._-".contains(ch))
        {
            return Err(ApiError::field(
                "cursor",
                "not a cursor of this list (pass next_cursor as it was returned)",
            ));
        }
    }
    Ok(set::Query {
        tenant: non_empty(q.tenant),
        state,
        url_prefix: non_empty(q.url_prefix),
        after,
        limit,
    })
}

pub use hookline_control::import::{EndpointInput as CreateEndpoint, HeaderInput};

fn header_edits(headers: Vec<HeaderInput>) -> Vec<HeaderEdit> {
    headers.into_iter().map(HeaderEdit::from).collect()
}

fn invalid(e: FieldError) -> ApiError {
    ApiError::field(&e.field, e.reason)
}

#[utoipa::path(
    post, path = "/v1/endpoints", tag = "endpoints",
    request_body = CreateEndpoint,
    responses(
        (status = 201, body = WithSecret),
        (status = 400, description = "a bad field, named"), (status = 401),
        (status = 403, description = "a tenant token creating for another tenant"),
        (status = 409, description = "the id exists (or is file-managed)"),
        (status = 503),
    ),
    security(("bearer" = []))
)]
pub async fn create(
    State(c): State<Control>,
    Extension(caller): Extension<Caller>,
    req: Result<Json<CreateEndpoint>, JsonRejection>,
) -> ApiResult<(StatusCode, Json<WithSecret>)> {
    let mut req = body(req)?;
    req.tenant = tenant_for(&caller, req.tenant.take())?;
    let Definition { def, generated } = req.definition().map_err(invalid)?;
    let e = c.registry.create(def).await.map_err(write_error)?;
    tracing::info!(caller = %caller.name, endpoint = %e.id, "endpoint created through the admin api");
    Ok((
        StatusCode::CREATED,
        Json(WithSecret {
            endpoint: e.to_json(now_ms()),
            secret: generated,
        }),
    ))
}

/// `POST /v1/endpoints:batch`: endpoints in the create shape, all written or none.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Batch {
    /// 1..=1000 endpoints, each as `POST /v1/endpoints` takes it.
    pub items: Vec<CreateEndpoint>,
}

/// One endpoint of a batch, after it.
#[derive(Debug, Serialize, ToSchema)]
pub struct BatchItem {
    pub id: String,
    /// `created`, `updated` or `unchanged` (already as asked: nothing written).
    pub outcome: String,
    #[schema(value_type = Object)]
    pub endpoint: Value,
    /// The secret generated for a new endpoint without one (shown only in this answer).
    pub secret: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct BatchResult {
    pub items: Vec<BatchItem>,
}

#[utoipa::path(
    post, path = "/v1/endpoints:batch", tag = "endpoints",
    request_body = Batch,
    responses(
        (status = 200, body = BatchResult, description = "every item created, updated or unchanged, in one transaction"),
        (status = 400, description = "a bad item, named as `items[i].field`; nothing written"),
        (status = 401),
        (status = 403, description = "a tenant token writing for another tenant"),
        (status = 409, description = "an item is file-managed; nothing written"),
        (status = 503),
    ),
    security(("bearer" = []))
)]
pub async fn batch(
    State(c): State<Control>,
    Extension(caller): Extension<Caller>,
    req: Result<Json<Batch>, JsonRejection>,
) -> ApiResult<Json<BatchResult>> {
    let req = body(req)?;
    if req.items.is_empty() || req.items.len() > MAX_BATCH {
        return Err(ApiError::field(
            "items",
            format!("must hold 1..={MAX_BATCH} endpoints (an import of more: `hookline endpoints import`)"),
        ));
    }
    let mut defs = Vec::with_capacity(req.items.len());
    for (i, mut item) in req.items.into_iter().enumerate() {
        item.tenant = tenant_for(&caller, item.tenant.take())?;
        let d = item
            .definition()
            .map_err(|e| ApiError::field(&format!("items[{i}].{}", e.field), e.reason))?;
        defs.push(d);
    }
    let done = c.registry.import(defs).await.map_err(|e| match e {
        WriteError::Invalid(f) => ApiError::field(&format!("items.{}", f.field), f.reason),
        e => write_error(e),
    })?;
    let now = now_ms();
    let counts = |o: Outcome| done.iter().filter(|d| d.outcome == o).count();
    tracing::info!(
        caller = %caller.name,
        created = counts(Outcome::Created),
        updated = counts(Outcome::Updated),
        unchanged = counts(Outcome::Unchanged),
        "endpoint batch written through the admin api"
    );
    Ok(Json(BatchResult {
        items: done
            .into_iter()
            .map(|d| BatchItem {
                id: d.endpoint.id.clone(),
                outcome: d.outcome.as_str().to_string(),
                endpoint: d.endpoint.to_json(now),
                secret: d.secret,
            })
            .collect(),
    }))
}

#[utoipa::path(
    get, path = "/v1/endpoints/{id}", tag = "endpoints",
    params(("id" = String, Path)),
    responses((status = 200, body = EndpointView), (status = 401), (status = 404)),
    security(("bearer" = []))
)]
pub async fn show(
    State(c): State<Control>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    visible(&c, &caller, &id).map(|e| view(&e))
}

/// Fields to change; absent fields keep their value, `null` clears an optional one.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateEndpoint {
    pub url: Option<String>,
    /// Admin tokens only (a tenant token cannot move an endpoint to another tenant).
    #[schema(value_type = Option<String>)]
    pub tenant: Option<Value>,
    pub event_types: Option<Vec<String>>,
    pub enabled: Option<bool>,
    #[schema(value_type = Option<String>)]
    pub timeout: Option<Value>,
    #[schema(value_type = Option<usize>)]
    pub max_concurrency: Option<Value>,
    /// The whole list of custom headers (`[]` removes them all).
    pub headers: Option<Vec<HeaderInput>>,
    /// The CEL payload filter; `null` removes it.
    #[schema(value_type = Option<String>)]
    pub filter: Option<Value>,
    /// Deliveries per second; `null` removes the limit (and its burst).
    #[schema(value_type = Option<f64>)]
    pub rate_limit: Option<Value>,
    #[schema(value_type = Option<u32>)]
    pub burst: Option<Value>,
    /// Whether requests carry `traceparent` while tracing is on (`true` or `false`).
    #[schema(value_type = Option<bool>)]
    pub trace_context: Option<Value>,
    /// The version you read: the write fails with 409 if the endpoint changed since.
    pub version: Option<u64>,
}

/// `null` → `Some(None)`, a string → `Some(Some(s))`.
fn nullable_text(field: &str, v: Option<Value>) -> ApiResult<Option<Option<String>>> {
    match v {
        None => Ok(None),
        Some(Value::Null) => Ok(Some(None)),
        Some(Value::String(s)) => Ok(Some(Some(s))),
        Some(_) => Err(ApiError::field(field, "must be a string or null")),
    }
}

#[utoipa::path(
    patch, path = "/v1/endpoints/{id}", tag = "endpoints",
    params(("id" = String, Path)),
    request_body = UpdateEndpoint,
    responses(
        (status = 200, body = EndpointView), (status = 400), (status = 401), (status = 403), (status = 404),
        (status = 409, description = "`version` is stale, or the endpoint is file-managed"),
    ),
    security(("bearer" = []))
)]
pub async fn update(
    State(c): State<Control>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    req: Result<Json<UpdateEndpoint>, JsonRejection>,
) -> ApiResult<Json<Value>> {
    let req = body(req)?;
    visible(&c, &caller, &id)?;
    let tenant = match (nullable_text("tenant", req.tenant)?, caller.tenant()) {
        (None, _) => None,
        (Some(t), None) => Some(t),
        // A tenant token may restate its own tenant (no change), nothing else.
        (Some(Some(t)), Some(mine)) if t == mine => None,
        (Some(t), Some(_)) => {
            tenant_for(&caller, Some(t.unwrap_or_default()))?;
            None
        }
    };
    let timeout = match nullable_text("timeout", req.timeout)? {
        None => None,
        Some(None) => Some(None),
        Some(Some(t)) => Some(Some(duration("timeout", &t)?)),
    };
    let max_concurrency = match req.max_concurrency {
        None => None,
        Some(Value::Null) => Some(None),
        Some(v) => Some(Some(
            v.as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| {
                    ApiError::field("max_concurrency", "must be a positive integer or null")
                })?,
        )),
    };
    let change = EndpointUpdate {
        url: req.url,
        tenant,
        event_types: req.event_types,
        timeout,
        max_concurrency,
        headers: req.headers.map(header_edits),
        filter: nullable_text("filter", req.filter)?,
        rate_limit: match req.rate_limit {
            None => None,
            Some(Value::Null) => Some(None),
            Some(v) => Some(Some(v.as_f64().ok_or_else(|| {
                ApiError::field(
                    "rate_limit",
                    "must be a number (deliveries per second) or null",
                )
            })?)),
        },
        burst: match req.burst {
            None => None,
            Some(Value::Null) => Some(None),
            Some(v) => Some(Some(
                v.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| {
                        ApiError::field("burst", "must be a positive integer or null")
                    })?,
            )),
        },
        trace_context: match req.trace_context {
            None => None,
            Some(Value::Bool(b)) => Some(b),
            Some(_) => return Err(ApiError::field("trace_context", "must be true or false")),
        },
    };
    let changes_definition = !change.is_empty();
    let mut expected = req.version;
    let mut e = visible(&c, &caller, &id)?;
    if changes_definition {
        e = c
            .registry
            .update(&id, change, expected)
            .await
            .map_err(write_error)?;
        expected = Some(e.version);
    }
    if let Some(enabled) = req.enabled.filter(|en| *en != e.enabled) {
        e = c
            .registry
            .set_enabled(&id, enabled, expected)
            .await
            .map_err(write_error)?;
    }
    tracing::info!(caller = %caller.name, endpoint = %id, "endpoint updated through the admin api");
    Ok(view(&e))
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct VersionQuery {
    /// The version you read (409 if it changed since); absent: delete whatever is there.
    pub version: Option<u64>,
}

#[utoipa::path(
    delete, path = "/v1/endpoints/{id}", tag = "endpoints",
    params(("id" = String, Path), VersionQuery),
    responses(
        (status = 204, description = "deleted: its queued retries end in the DLQ as `endpoint_removed`"),
        (status = 401), (status = 404), (status = 409),
    ),
    security(("bearer" = []))
)]
pub async fn delete(
    State(c): State<Control>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(q): Query<VersionQuery>,
) -> ApiResult<StatusCode> {
    visible(&c, &caller, &id)?;
    c.registry
        .delete(&id, q.version)
        .await
        .map_err(write_error)?;
    tracing::info!(caller = %caller.name, endpoint = %id, "endpoint deleted through the admin api");
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RotateSecret {
    /// The new `whsec_…`; absent: one is generated and returned once.
    pub secret: Option<String>,
    /// How long the current secrets keep signing beside the new one (default
    /// `control.secret_rotation_grace`, 24 h).
    pub grace: Option<String>,
    pub version: Option<u64>,
}

#[utoipa::path(
    post, path = "/v1/endpoints/{id}/rotate-secret", tag = "endpoints",
    params(("id" = String, Path)),
    request_body = RotateSecret,
    responses((status = 200, body = WithSecret), (status = 400), (status = 401), (status = 404), (status = 409)),
    security(("bearer" = []))
)]
pub async fn rotate_secret(
    State(c): State<Control>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    req: Result<Json<RotateSecret>, JsonRejection>,
) -> ApiResult<Json<WithSecret>> {
    let req = body(req)?;
    visible(&c, &caller, &id)?;
    let grace = req
        .grace
        .as_deref()
        .map(|g| duration("grace", g))
        .transpose()?;
    let generated = req.secret.is_none().then(generate_secret);
    let secret = req.secret.or_else(|| generated.clone());
    let e = c
        .registry
        .rotate_secret(&id, secret, grace, req.version)
        .await
        .map_err(write_error)?;
    tracing::info!(caller = %caller.name, endpoint = %id, "endpoint secret rotated through the admin api");
    Ok(Json(WithSecret {
        endpoint: e.to_json(now_ms()),
        secret: generated,
    }))
}

#[utoipa::path(
    get, path = "/v1/endpoints/{id}/health", tag = "endpoints",
    params(("id" = String, Path)),
    responses(
        (status = 200, description = "status, success rate, last attempt and error, consecutive failures, failing since, dead letters — the same on every pod", body = Object),
        (status = 401), (status = 404),
    ),
    security(("bearer" = []))
)]
pub async fn health(
    State(c): State<Control>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<Json<HealthReport>> {
    visible(&c, &caller, &id)?;
    Ok(Json(c.health.report(&id)))
}

/// What a test send needs: the registry (who may see the endpoint) and the process's replays
/// (the delivery engine and delivery log it attempts through).
#[derive(Clone)]
pub struct TestState {
    pub control: Control,
    pub replays: Arc<hookline_tools::replay::Replays>,
}

/// How a test send went: the attempt's outcome.
#[derive(Debug, Serialize, ToSchema)]
pub struct TestSendResult {
    pub endpoint_id: String,
    /// The test event's id (`webhook-id`), also in the endpoint's delivery log.
    pub event_id: String,
    /// Always `hookline.test`.
    pub event_type: String,
    pub delivered: bool,
    /// The response status, when one arrived.
    pub status: Option<u16>,
    /// `http_status`, `timeout`, `connect`, `tls`, `io`, `blocked` or `invalid_url`; null when
    /// delivered.
    pub failure_class: Option<String>,
    pub duration_ms: u64,
    /// The start of the response body, or the error of a failure (never the URL).
    pub detail: Option<String>,
}

impl From<hookline_tools::test_send::TestSend> for TestSendResult {
    fn from(t: hookline_tools::test_send::TestSend) -> Self {
        TestSendResult {
            endpoint_id: t.endpoint_id,
            event_id: t.event_id,
            event_type: hookline_tools::test_send::TEST_EVENT_TYPE.to_string(),
            delivered: t.delivered,
            status: t.status,
            failure_class: t.failure_class.map(str::to_string),
            duration_ms: t.duration_ms,
            detail: t.detail,
        }
    }
}

#[utoipa::path(
    post, path = "/v1/endpoints/{id}/test", tag = "endpoints",
    params(("id" = String, Path)),
    responses(
        (status = 200, description = "a signed `hookline.test` event was attempted once through the delivery engine (signing, SSRF guard, the endpoint's timeout) and logged in the endpoint's delivery log; the answer is the outcome — a failed test send is reported, never retried — sent whether or not the endpoint is enabled", body = TestSendResult),
        (status = 401), (status = 404),
    ),
    security(("bearer" = []))
)]
pub async fn test_send(
    State(s): State<TestState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<Json<TestSendResult>> {
    visible(&s.control, &caller, &id)?;
    let sent = s
        .replays
        .test_send(&id)
        .await
        .ok_or_else(|| ApiError::not_found("endpoint"))?;
    tracing::info!(
        caller = %caller.name,
        endpoint = %id,
        event = %sent.event_id,
        delivered = sent.delivered,
        failure_class = sent.failure_class.unwrap_or("-"),
        "test event sent through the admin api"
    );
    Ok(Json(sent.into()))
}
