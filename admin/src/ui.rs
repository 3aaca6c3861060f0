//! The dashboard's data: the same reads and replays as the API routes, through the same tenant
//! scoping (`auth::Caller`), shaped for the pages of `hookline-dashboard`.

use std::collections::HashMap;
use std::sync::Arc;

use axum::http::StatusCode;

use hookline_common::config::admin::TokenScope;
use hookline_common::config::Config;
use hookline_common::contract::delivery::now_ms;
use hookline_common::contract::replays::ReplayRecord;
use hookline_control::attempts::{Attempt, Outcome};
use hookline_control::health::{HealthReport, Seen};
use hookline_control::{Endpoint, EndpointUpdate, HeaderEdit, WriteError};
use hookline_dashboard::data::{Activity, Settings, SettingsChange};
use hookline_dashboard::{
    AttemptRow, Backend, Counters, DeadDetail, DeadFilter, DeadPage, DeadRow, EndpointFilter,
    EndpointPage, EndpointRow, Health, Problem, ReplayOutcome, Scope, TestSendOutcome,
    ENDPOINTS_PER_PAGE,
};
use hookline_tools::dead::{self, DeadRecord};
use hookline_tools::dead_page::{self, Cursor};
use hookline_tools::replay::{self, ReplayOptions, Replays};

use crate::auth::{Caller, Tokens};
use crate::endpoints::Control;
use crate::error::ApiError;

/// Dead letters per dashboard page.
const PAGE: usize = 50;
/// Bytes of the body shown on a dead letter's page.
const PREVIEW: usize = 1024;

pub struct DashboardData {
    pub config: Arc<Config>,
    pub tokens: Arc<Tokens>,
    pub control: Control,
    pub replays: Arc<Replays>,
}

fn caller(scope: &Scope) -> Caller {
    Caller {
        name: "dashboard".into(),
        scope: match scope {
            Scope::Admin => TokenScope::Admin,
            Scope::Tenant(t) => TokenScope::Tenant(t.clone()),
        },
    }
}

fn problem(e: ApiError) -> Problem {
    match e.status {
        StatusCode::NOT_FOUND => Problem::NotFound,
        StatusCode::BAD_REQUEST => Problem::BadInput(match e.field {
            Some(f) => format!("{f}: {}", e.message),
            None => e.message,
        }),
        _ => Problem::Unavailable(e.message),
    }
}

fn unavailable(e: anyhow::Error) -> Problem {
    problem(ApiError::unavailable(&e))
}

fn seen_status(s: &Seen) -> String {
    match s.status {
        Some(code) if s.class == "ok" => code.to_string(),
        Some(code) => format!("{} {code}", s.class),
        None => s.class.clone(),
    }
}

fn health(h: &HealthReport) -> Health {
    Health {
        success_rate: h.success_rate,
        attempts_last_hour: h.attempts_in_window as u64,
        last_status: h.last_attempt.as_ref().map(seen_status),
        last_error: h.last_error.as_ref().map(|e| {
            let what = seen_status(e);
            match &e.error {
                Some(text) => format!("{what}: {text} ({})", dead::rfc3339_ms(e.at_ms)),
                None => format!("{what} ({})", dead::rfc3339_ms(e.at_ms)),
            }
        }),
        last_attempt_at: h.last_attempt.as_ref().map(|a| dead::rfc3339_ms(a.at_ms)),
        consecutive_failures: h.consecutive_failures,
        failing_since: h.failing_since_ms.map(dead::rfc3339_ms),
        pending_retries: h.pending_retries,
        oldest_pending_retry: h.oldest_pending_retry_ms.map(dead::rfc3339_ms),
        throttled: h.status == "throttled",
        throttled_last_hour: h.throttled_in_window as u64,
    }
}

fn endpoint_row(e: &Endpoint, h: &HealthReport, dead: u64, activity: Activity) -> EndpointRow {
    EndpointRow {
        id: e.id.clone(),
        url: e.url.to_string(),
        tenant: e.tenant.clone(),
        event_types: e.event_types.clone(),
        enabled: e.enabled,
        health: health(h),
        dead,
        activity,
        settings: Settings {
            rate_limit: e.rate_limit,
            burst: e.burst,
            filter: e.filter.as_ref().map(|f| f.source().to_string()),
            headers: e
                .headers
                .iter()
                .map(|h| {
                    let value = (!h.secret).then(|| h.value_text().to_string());
                    (h.name.as_str().to_string(), value, h.secret)
                })
                .collect(),
            timeout: e.timeout.map(|t| humantime::format_duration(t).to_string()),
            max_concurrency: e.max_concurrency,
            file_managed: e.managed_by == hookline_control::record::ManagedBy::File,
            version: e.version,
        },
    }
}

fn attempt_row(a: &Attempt) -> AttemptRow {
    AttemptRow {
        at: dead::rfc3339_ms(a.at_ms),
        event_id: a.event_id.clone(),
        endpoint: a.endpoint_id.clone(),
        attempt: a.attempt,
        stage: a.stage.clone(),
        outcome: match a.outcome {
            Outcome::Delivered => "delivered",
            Outcome::Failed => "failed",
        }
        .into(),
        status: match (a.status, a.class.as_str()) {
            (Some(code), "ok") => code.to_string(),
            (Some(code), class) => format!("{class} {code}"),
            (None, class) => class.to_string(),
        },
        duration_ms: a.duration_ms,
        next: a.next.clone().unwrap_or_else(|| "done".into()),
    }
}

fn replayed(r: Option<&ReplayRecord>) -> Option<String> {
    r.map(|r| {
        if r.result.is_empty() {
            "replayed".to_string()
        } else {
            r.result.clone()
        }
    })
}

fn dead_row(r: &DeadRecord, replays: &HashMap<String, ReplayRecord>) -> DeadRow {
    let replayed = replayed(replays.get(&r.replay_key()));
    match &r.meta {
        Ok(m) => DeadRow {
            position: r.position(),
            dead_at: m.dead_at_ms.map(dead::rfc3339_ms).unwrap_or_default(),
            endpoint: m.endpoint_id.clone(),
            event_id: m.event_id.clone(),
            event_type: m.event_type.clone(),
            tenant: m.tenant.clone(),
            reason: m.dead_reason.map_or("-", |d| d.as_str()).to_string(),
            attempts: dead::attempts_made(m),
            last_error: dead::last_error(m),
            replayed,
        },
        Err(e) => DeadRow {
            position: r.position(),
            reason: "unreadable".into(),
            last_error: e.clone(),
            replayed,
            ..DeadRow::default()
        },
    }
}

impl DashboardData {
    fn scoped_filter(&self, scope: &Scope, f: &DeadFilter) -> dead::DeadFilter {
        dead::DeadFilter {
            endpoint: f.endpoint.clone(),
            event_type: f.event_type.clone(),
            tenant: scope.tenant().map(str::to_string).or(f.tenant.clone()),
            ..dead::DeadFilter::default()
        }
    }

    /// The endpoint `id` if the scope sees it, from the live registry (an endpoint of every
    /// tenant is an admin's).
    fn visible_one(&self, scope: &Scope, id: &str) -> Option<Endpoint> {
        let who = caller(scope);
        self.control
            .registry
            .get(id)
            .filter(|e| who.sees(e.tenant.as_deref()))
    }

    /// An endpoint's attempts per minute over the last 24 h (the health tracker's counts).
    fn activity(&self, id: &str) -> Activity {
        Activity {
            now_minute: now_ms().div_euclid(60_000),
            minutes: self
                .control
                .health
                .per_minute(id, hookline_control::tracker::COUNT_MINUTES),
        }
    }

    async fn open_dead(&self, scope: &Scope) -> Result<HashMap<String, u64>, Problem> {
        let replays = replay::finished(&self.config).await.map_err(unavailable)?;
        let filter = self.scoped_filter(scope, &DeadFilter::default());
        dead_page::open_by_endpoint(&self.config, &filter, &replays)
            .await
            .map_err(unavailable)
    }
}

impl Backend for DashboardData {
    fn authenticate(&self, token: &str) -> Option<Scope> {
        self.tokens.check(token).map(|c| match c.scope {
            TokenScope::Admin => Scope::Admin,
            TokenScope::Tenant(t) => Scope::Tenant(t),
        })
    }

    async fn endpoints(
        &self,
        scope: &Scope,
        filter: &EndpointFilter,
    ) -> Result<EndpointPage, Problem> {
        let who = caller(scope);
        let state = filter
            .state
            .as_deref()
            .map(hookline_control::set::State::parse)
            .transpose()
            .map_err(Problem::BadInput)?;
        let query = hookline_control::set::Query {
            tenant: filter.tenant.clone(),
            state,
            url_prefix: filter.url_prefix.clone(),
            after: filter.cursor.clone(),
            limit: ENDPOINTS_PER_PAGE,
        };
        let set = self.control.registry.current();
        let page = set.page(&query, |t| who.sees(t));
        let dead = self.open_dead(scope).await?;
        let rows = page
            .items
            .iter()
            .map(|e| {
                let h = self.control.health.report(&e.id);
                endpoint_row(
                    e,
                    &h,
                    dead.get(&e.id).copied().unwrap_or(0),
                    self.activity(&e.id),
                )
            })
            .collect();
        Ok(EndpointPage {
            rows,
            next_cursor: page.next,
        })
    }

    async fn endpoint(
        &self,
        scope: &Scope,
        id: &str,
    ) -> Result<(EndpointRow, Vec<AttemptRow>), Problem> {
        let Some(e) = self.visible_one(scope, id) else {
            return Err(Problem::NotFound);
        };
        let dead = self.open_dead(scope).await?;
        let h = self.control.health.report(&e.id);
        let row = endpoint_row(
            &e,
            &h,
            dead.get(&e.id).copied().unwrap_or(0),
            self.activity(&e.id),
        );
        let attempts = self
            .control
            .health
            .recent(&e.id)
            .iter()
            .map(attempt_row)
            .collect();
        Ok((row, attempts))
    }

    async fn dead(&self, scope: &Scope, filter: &DeadFilter) -> Result<DeadPage, Problem> {
        let after = match &filter.cursor {
            None => None,
            Some(c) => Some(
                c.parse::<Cursor>()
                    .map_err(|e| Problem::BadInput(format!("cursor: {e}")))?,
            ),
        };
        let f = self.scoped_filter(scope, filter);
        let page = dead_page::page(&self.config, &f, after, PAGE)
            .await
            .map_err(unavailable)?;
        let replays = replay::finished(&self.config).await.map_err(unavailable)?;
        Ok(DeadPage {
            rows: page.records.iter().map(|r| dead_row(r, &replays)).collect(),
            next_cursor: page.next.map(|c| c.to_string()),
        })
    }

    async fn dead_one(&self, scope: &Scope, position: &str) -> Result<DeadDetail, Problem> {
        let r = crate::dead::find(&self.config, &caller(scope), position)
            .await
            .map_err(problem)?;
        let replays = replay::finished(&self.config).await.map_err(unavailable)?;
        let row = dead_row(&r, &replays);
        let history = match &r.meta {
            Ok(m) => m
                .history
                .iter()
                .map(|a| AttemptRow {
                    at: dead::rfc3339_ms(a.at_ms),
                    event_id: m.event_id.clone(),
                    endpoint: m.endpoint_id.clone(),
                    attempt: a.n,
                    stage: String::new(),
                    outcome: if a.class == "ok" {
                        "delivered"
                    } else {
                        "failed"
                    }
                    .into(),
                    status: a
                        .status
                        .map_or_else(|| a.class.clone(), |s| format!("{} {s}", a.class)),
                    duration_ms: a.duration_ms,
                    next: String::new(),
                })
                .collect(),
            Err(_) => Vec::new(),
        };
        let body_preview = String::from_utf8_lossy(&r.value[..r.value.len().min(PREVIEW)]).into();
        Ok(DeadDetail {
            row,
            history,
            body_preview,
        })
    }

    async fn test_send(&self, scope: &Scope, id: &str) -> Result<TestSendOutcome, Problem> {
        if self.visible_one(scope, id).is_none() {
            return Err(Problem::NotFound);
        }
        let t = self.replays.test_send(id).await.ok_or(Problem::NotFound)?;
        tracing::info!(
            scope = ?scope,
            endpoint = %id,
            event = %t.event_id,
            delivered = t.delivered,
            failure_class = t.failure_class.unwrap_or("-"),
            "test event sent from the dashboard"
        );
        Ok(TestSendOutcome {
            endpoint_id: t.endpoint_id,
            event_id: t.event_id,
            delivered: t.delivered,
            status: t.status,
            failure_class: t.failure_class.map(str::to_string),
            duration_ms: t.duration_ms,
            detail: t.detail,
        })
    }

    async fn update_settings(
        &self,
        scope: &Scope,
        id: &str,
        change: SettingsChange,
    ) -> Result<(), Problem> {
        if self.visible_one(scope, id).is_none() {
            return Err(Problem::NotFound);
        }
        let update = EndpointUpdate {
            rate_limit: Some(change.rate_limit),
            burst: Some(change.burst),
            filter: Some(change.filter),
            headers: Some(
                change
                    .headers
                    .into_iter()
                    .map(|(name, value, secret)| HeaderEdit {
                        name,
                        value,
                        secret,
                    })
                    .collect(),
            ),
            timeout: Some(change.timeout),
            max_concurrency: Some(change.max_concurrency),
            ..EndpointUpdate::default()
        };
        let e = self
            .control
            .registry
            .update(id, update, Some(change.version))
            .await
            .map_err(|e| match e {
                WriteError::NotFound { .. } => Problem::NotFound,
                WriteError::Invalid(f) => Problem::BadInput(format!("{}: {}", f.field, f.reason)),
                WriteError::Kafka(k) => Problem::Unavailable(format!("{k:#}")),
                other => Problem::BadInput(other.to_string()),
            })?;
        tracing::info!(scope = ?scope, endpoint = %id, version = e.version, "endpoint settings changed from the dashboard");
        Ok(())
    }

    async fn replay(
        &self,
        scope: &Scope,
        position: Option<&str>,
        filter: &DeadFilter,
    ) -> Result<ReplayOutcome, Problem> {
        let who = caller(scope);
        let f = match position {
            Some(p) => {
                let r = crate::dead::find(&self.config, &who, p)
                    .await
                    .map_err(problem)?;
                dead::DeadFilter {
                    partition: Some(r.partition),
                    from_offset: Some(r.offset),
                    to_offset: Some(r.offset),
                    tenant: scope.tenant().map(str::to_string),
                    ..dead::DeadFilter::default()
                }
            }
            None => self.scoped_filter(scope, filter),
        };
        let options = ReplayOptions {
            filter: f,
            ..ReplayOptions::default()
        };
        let r = crate::dead::run(&self.replays, &who, options)
            .await
            .map_err(problem)?;
        Ok(ReplayOutcome {
            selected: r.selected as u64,
            delivered: r.delivered as u64,
            failed: r.failed as u64,
            already_replayed: r.already_replayed as u64,
            skipped: r.skipped as u64,
            lines: r.lines,
        })
    }

    async fn counters(&self, scope: &Scope) -> Result<Counters, Problem> {
        let dead = self.open_dead(scope).await?;
        let who = caller(scope);
        let (delivered, failed) = self
            .control
            .registry
            .current()
            .iter()
            .filter(|e| who.sees(e.tenant.as_deref()))
            .map(|e| self.control.health.counts(&e.id, 5))
            .fold((0, 0), |(d, f), (d2, f2)| (d + d2, f + f2));
        Ok(Counters {
            delivered_last_5m: delivered,
            failed_last_5m: failed,
            dead: dead.values().sum(),
        })
    }
}
