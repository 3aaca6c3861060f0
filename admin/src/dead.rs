//! `/v1/dead-letters`: list (filters, cursor), show, replay one, replay by filter — the same
//! reads and the same replay as `hookline dead` / `hookline replay`, so an API replay and a
//! CLI replay of one dead letter are one replay (idempotent by DLQ position on `<p>.replays`).
//!
//! Tenant tokens: the list is filtered to their tenant whatever they ask; one dead letter of
//! another tenant (or of none) is a 404.

use std::sync::Arc;

use axum::extract::{Extension, Path, Query, State};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use hookline_common::config::Config;
use hookline_tools::dead::{self, DeadFilter, DeadRecord, DlqPosition};
use hookline_tools::dead_page::{self, Cursor};
use hookline_tools::replay::{self, ReplayOptions, ReplaySummary, Replays};

use crate::auth::Caller;

/// What the dead-letter routes share: the config (reads) and the process's replays (their
/// engine and `hookline_delivery_*{stage="replay"}` series).
#[derive(Clone)]
pub struct DeadState {
    pub config: Arc<Config>,
    pub replays: Arc<Replays>,
}

impl axum::extract::FromRef<DeadState> for Arc<Config> {
    fn from_ref(state: &DeadState) -> Self {
        state.config.clone()
    }
}

impl axum::extract::FromRef<DeadState> for Arc<Replays> {
    fn from_ref(state: &DeadState) -> Self {
        state.replays.clone()
    }
}
use crate::error::{ApiError, ApiResult};

/// Longest page.
pub const MAX_LIMIT: usize = 500;
const DEFAULT_LIMIT: usize = 50;
/// Most replays in flight for one API call.
const MAX_CONCURRENCY: usize = 16;

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only this endpoint id.
    pub endpoint: Option<String>,
    /// Event-type glob (`order.*`).
    #[serde(rename = "type")]
    #[param(rename = "type")]
    pub event_type: Option<String>,
    /// Only this tenant (a tenant token always sees only its own).
    pub tenant: Option<String>,
    pub event_id: Option<String>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
    /// Page size, 1..=500 (default 50).
    pub limit: Option<usize>,
}

/// A page of dead letters, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeadLetterPage {
    /// Each as `hookline dead list --format json` prints it (`position`, `endpoint_id`,
    /// `event_id`, `event_type`, `tenant`, `dead_reason`, `dead_at`, `attempts`, `last_error`,
    /// `history`, `replayed`, …).
    #[schema(value_type = Vec<Object>)]
    pub items: Vec<Value>,
    /// Pass as `cursor` for the next page; absent on the last page.
    pub next_cursor: Option<String>,
}

/// What a replay did, with one line per dead letter as the CLI prints them.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReplayResult {
    pub selected: usize,
    pub delivered: usize,
    /// Attempted and failed again: a new dead letter (or the first tier with `with_retries`).
    pub failed: usize,
    /// Replayed before (by the API, the dashboard or the CLI): not sent again.
    pub already_replayed: usize,
    /// Not attempted: endpoint gone, disabled or no longer subscribed, or unreadable metadata.
    pub skipped: usize,
    /// Listed by a dry run.
    pub would_replay: usize,
    pub verdict: String,
    pub lines: Vec<String>,
}

/// Replay by filter. At least one filter, or `all: true`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplayRequest {
    pub endpoint: Option<String>,
    #[serde(rename = "type")]
    #[schema(rename = "type")]
    pub event_type: Option<String>,
    pub tenant: Option<String>,
    pub event_id: Option<String>,
    /// Replay every dead letter in scope (a tenant token: every one of its tenant).
    #[serde(default)]
    pub all: bool,
    /// List what would be replayed; send nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// A fresh full retry schedule instead of one immediate attempt.
    #[serde(default)]
    pub with_retries: bool,
    /// Replays in flight at once (1..=16, default 1).
    pub concurrency: Option<usize>,
}

/// The caller's view of a filter: a tenant token's tenant always wins.
fn scoped(caller: &Caller, mut filter: DeadFilter) -> DeadFilter {
    if let Some(t) = caller.tenant() {
        filter.tenant = Some(t.to_string());
    }
    filter
}

fn non_empty(v: Option<String>) -> Option<String> {
    v.filter(|s| !s.trim().is_empty())
}

#[utoipa::path(
    get, path = "/v1/dead-letters", tag = "dead letters",
    params(ListQuery),
    responses(
        (status = 200, body = DeadLetterPage),
        (status = 400, description = "a bad `cursor` or `limit` (named in `error.field`)"),
        (status = 401), (status = 503, description = "Kafka did not answer"),
    ),
    security(("bearer" = []))
)]
pub async fn list(
    State(config): State<Arc<Config>>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<ListQuery>,
) -> ApiResult<Json<DeadLetterPage>> {
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(ApiError::field("limit", format!("must be 1..={MAX_LIMIT}")));
    }
    let after = match non_empty(q.cursor) {
        None => None,
        Some(c) => Some(
            c.parse::<Cursor>()
                .map_err(|e| ApiError::field("cursor", e))?,
        ),
    };
    let filter = scoped(
        &caller,
        DeadFilter {
            endpoint: non_empty(q.endpoint),
            event_type: non_empty(q.event_type),
            tenant: non_empty(q.tenant),
            event_id: non_empty(q.event_id),
            ..DeadFilter::default()
        },
    );
    let page = dead_page::page(&config, &filter, after, limit)
        .await
        .map_err(|e| ApiError::unavailable(&e))?;
    let replays = replay::finished(&config)
        .await
        .map_err(|e| ApiError::unavailable(&e))?;
    let items = page
        .records
        .iter()
        .map(|r| dead::to_json(r, replays.get(&r.replay_key()), false))
        .collect();
    Ok(Json(DeadLetterPage {
        items,
        next_cursor: page.next.map(|c| c.to_string()),
    }))
}

/// The dead letter at `position` if the caller may see it.
pub async fn find(config: &Config, caller: &Caller, position: &str) -> ApiResult<DeadRecord> {
    let at: DlqPosition = position
        .parse()
        .map_err(|_| ApiError::field("position", "must be `<partition>:<offset>`"))?;
    let found = dead_page::one(config, at)
        .await
        .map_err(|e| ApiError::unavailable(&e))?;
    match found {
        Some(r) if caller.sees(r.meta.as_ref().ok().and_then(|m| m.tenant.as_deref())) => Ok(r),
        _ => Err(ApiError::not_found("dead letter")),
    }
}

#[utoipa::path(
    get, path = "/v1/dead-letters/{position}", tag = "dead letters",
    params(("position" = String, Path, description = "`<partition>:<offset>` on `<p>.dlq`")),
    responses(
        (status = 200, description = "the dead letter with history, headers, body preview and replay status", body = Object),
        (status = 400), (status = 401), (status = 404, description = "no such dead letter, or another tenant's"),
    ),
    security(("bearer" = []))
)]
pub async fn show(
    State(config): State<Arc<Config>>,
    Extension(caller): Extension<Caller>,
    Path(position): Path<String>,
) -> ApiResult<Json<Value>> {
    let r = find(&config, &caller, &position).await?;
    let replays = replay::finished(&config)
        .await
        .map_err(|e| ApiError::unavailable(&e))?;
    Ok(Json(dead::to_json(&r, replays.get(&r.replay_key()), true)))
}

#[utoipa::path(
    post, path = "/v1/dead-letters/{position}/replay", tag = "dead letters",
    params(("position" = String, Path, description = "`<partition>:<offset>` on `<p>.dlq`")),
    responses(
        (status = 200, body = ReplayResult, description = "one fresh attempt now; a second call does not send again"),
        (status = 401), (status = 404),
    ),
    security(("bearer" = []))
)]
pub async fn replay_one(
    State(config): State<Arc<Config>>,
    State(replays): State<Arc<Replays>>,
    Extension(caller): Extension<Caller>,
    Path(position): Path<String>,
) -> ApiResult<Json<ReplayResult>> {
    let r = find(&config, &caller, &position).await?;
    let filter = scoped(
        &caller,
        DeadFilter {
            partition: Some(r.partition),
            from_offset: Some(r.offset),
            to_offset: Some(r.offset),
            ..DeadFilter::default()
        },
    );
    run(
        &replays,
        &caller,
        ReplayOptions {
            filter,
            ..ReplayOptions::default()
        },
    )
    .await
    .map(Json)
}

#[utoipa::path(
    post, path = "/v1/dead-letters/replay", tag = "dead letters",
    request_body = ReplayRequest,
    responses(
        (status = 200, body = ReplayResult),
        (status = 400, description = "no filter and not `all`, or a bad field"), (status = 401),
    ),
    security(("bearer" = []))
)]
pub async fn replay_matching(
    State(replays): State<Arc<Replays>>,
    Extension(caller): Extension<Caller>,
    body: Result<Json<ReplayRequest>, axum::extract::rejection::JsonRejection>,
) -> ApiResult<Json<ReplayResult>> {
    let Json(req) = body.map_err(|e| ApiError::field("body", e.body_text()))?;
    let concurrency = req.concurrency.unwrap_or(1);
    if !(1..=MAX_CONCURRENCY).contains(&concurrency) {
        return Err(ApiError::field(
            "concurrency",
            format!("must be 1..={MAX_CONCURRENCY}"),
        ));
    }
    let filter = DeadFilter {
        endpoint: non_empty(req.endpoint),
        event_type: non_empty(req.event_type),
        tenant: non_empty(req.tenant),
        event_id: non_empty(req.event_id),
        ..DeadFilter::default()
    };
    if filter.is_unrestricted() && !req.all && !req.dry_run {
        return Err(ApiError::field(
            "all",
            "no filter given: set `all: true` to replay every dead delivery in scope",
        ));
    }
    let options = ReplayOptions {
        filter: scoped(&caller, filter),
        dry_run: req.dry_run,
        with_retries: req.with_retries,
        concurrency,
        ..ReplayOptions::default()
    };
    run(&replays, &caller, options).await.map(Json)
}

/// Runs a replay as the CLI does, capturing its lines.
pub async fn run(
    replays: &Replays,
    caller: &Caller,
    options: ReplayOptions,
) -> ApiResult<ReplayResult> {
    let dry_run = options.dry_run;
    let mut out: Vec<u8> = Vec::new();
    tracing::info!(caller = %caller.name, dry_run, "replay requested through the admin api");
    let summary: ReplaySummary = replays
        .run(options, &mut out)
        .await
        .map_err(|e| ApiError::unavailable(&e))?;
    let lines = String::from_utf8_lossy(&out)
        .lines()
        .map(str::to_string)
        .collect();
    Ok(ReplayResult {
        selected: summary.selected,
        delivered: summary.delivered,
        failed: summary.failed,
        already_replayed: summary.already_replayed,
        skipped: summary.skipped,
        would_replay: summary.would_replay,
        verdict: summary.verdict(dry_run),
        lines,
    })
}
