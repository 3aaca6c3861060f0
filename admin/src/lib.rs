//! The admin process (`hookline run admin`): one HTTP listener (`admin.listen`, loopback by
//! default) serving
//!
//! - `/v1/…` — the API, every route behind a bearer token (`auth.rs`): `POST /v1/events`
//!   (REST ingest with `Idempotency-Key`, the `hookline-ingest` crate), dead letters and replay
//!   (`dead.rs`);
//! - `/openapi.json` — the OpenAPI 3 document, generated from the same route table that serves
//!   (`utoipa-axum`), so the two cannot disagree;
//! - `/` and `/ui/…` — the dashboard (`hookline-dashboard`), its data from `ui.rs`.
//!
//! Without a configured token the process refuses to start, unless it listens on loopback and
//! was started with the dev flag: then it makes a random token and prints it once.

pub mod auth;
pub mod dead;
pub mod error;
pub mod ui;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use axum::Router;
use prometheus::Registry;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use hookline_common::admin_config::TokenScope;
use hookline_common::config::Config;
use hookline_common::ops::{Readiness, StageProbe};
use hookline_common::shutdown::Shutdown;
use hookline_ingest::Ingest;
use hookline_tools::replay::Replays;

use crate::auth::Tokens;

/// The stage name of the admin process's probe.
pub const STAGE: &str = "admin";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "hookline admin API",
        description = "Publish events (with Idempotency-Key), browse and replay dead deliveries. \
                       Every route takes `Authorization: Bearer <token>`; a tenant-scoped token \
                       sees only its tenant (another tenant's resource is a 404). Errors are \
                       `{\"error\":{\"status\",\"code\",\"field\",\"message\"}}`."
    ),
    modifiers(&BearerAuth)
)]
struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// What the routes share.
pub struct App {
    pub config: Arc<Config>,
    pub tokens: Arc<Tokens>,
    pub ingest: Arc<Ingest>,
    /// Every replay of the process (API and dashboard) attempts through these.
    pub replays: Arc<Replays>,
}

/// The API routes and their OpenAPI document, from one table.
pub fn api(app: &App) -> (Router, utoipa::openapi::OpenApi) {
    let events = OpenApiRouter::new()
        .routes(routes!(publish_event))
        .layer(hookline_ingest::http::body_limit(
            app.config.input.max_payload_bytes,
        ))
        .with_state(app.ingest.clone());
    let dead_letters = OpenApiRouter::new()
        .routes(routes!(dead::list))
        .routes(routes!(dead::replay_matching))
        .routes(routes!(dead::show))
        .routes(routes!(dead::replay_one))
        .with_state(dead::DeadState {
            config: app.config.clone(),
            replays: app.replays.clone(),
        });
    let (router, doc) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(events)
        .merge(dead_letters)
        .split_for_parts();
    let router = router.layer(axum::middleware::from_fn_with_state(
        app.tokens.clone(),
        auth::require,
    ));
    (router, doc)
}

/// The whole admin router: API behind auth, `/openapi.json`, dashboard.
pub fn router(app: &App) -> Router {
    let (api, doc) = api(app);
    let doc = Arc::new(doc);
    let openapi = Router::new().route(
        "/openapi.json",
        axum::routing::get(move || {
            let doc = doc.clone();
            async move { axum::Json((*doc).clone()) }
        }),
    );
    let ui = hookline_dashboard::router(Arc::new(ui::DashboardData {
        config: app.config.clone(),
        tokens: app.tokens.clone(),
        replays: app.replays.clone(),
    }));
    api.merge(openapi).merge(ui)
}

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
async fn publish_event(
    state: axum::extract::State<Arc<Ingest>>,
    scope: Option<axum::extract::Extension<hookline_ingest::http::TenantScope>>,
    headers: axum::http::HeaderMap,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> axum::response::Response {
    hookline_ingest::http::publish(state, scope, headers, body).await
}

/// The tokens the process accepts: the configured ones, or (only with `dev` on loopback and
/// none configured) a fresh random one, returned so the caller can print it.
pub fn tokens(config: &Config, dev: bool) -> anyhow::Result<(Tokens, Option<String>)> {
    let tokens = Tokens::from_config(&config.admin);
    if !tokens.is_empty() {
        return Ok((tokens, None));
    }
    let listen = config.admin.listen;
    if !dev {
        bail!(
            "admin.tokens is empty: configure at least one token (`hookline admin token` prints \
             one), or pass --dev to run with a printed random token on loopback"
        );
    }
    if !listen.ip().is_loopback() {
        bail!(
            "the dev token is only for loopback, and admin.listen is {listen}: configure \
             admin.tokens to listen there"
        );
    }
    let token = auth::generate();
    Ok((tokens.with("dev", &token, TokenScope::Admin), Some(token)))
}

/// Runs the admin process until shutdown. `dev`: see [`tokens`].
pub async fn run(
    config: Arc<Config>,
    registry: Registry,
    readiness: Readiness,
    shutdown: Shutdown,
    dev: bool,
) -> anyhow::Result<()> {
    let probe = readiness.register(STAGE);
    let result = async {
        let bound = Bound::bind(config, &registry, dev).await?;
        announce(bound.addr, bound.dev_token.as_deref());
        bound.serve(&probe, shutdown).await
    }
    .await;
    probe.stopped();
    result
}

/// The admin process, listening, not serving yet (tests bind port 0 and read [`Bound::addr`]).
pub struct Bound {
    pub addr: SocketAddr,
    /// The printed dev token, when one was made.
    pub dev_token: Option<String>,
    listener: tokio::net::TcpListener,
    router: Router,
}

impl Bound {
    /// Checks the tokens, binds `admin.listen`, and starts the ingest (which first reads the
    /// window's idempotency claims: until then a reused key could not be checked).
    pub async fn bind(
        config: Arc<Config>,
        registry: &Registry,
        dev: bool,
    ) -> anyhow::Result<Bound> {
        let (tokens, dev_token) = tokens(&config, dev)?;
        let listen = config.admin.listen;
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding the admin API to {listen} (admin.listen)"))?;
        let addr = listener.local_addr()?;
        let ingest = Ingest::start(&config, registry, config.admin.idempotency_keys)
            .await
            .context("starting the ingest (POST /v1/events)")?;
        let replays = Replays::new(config.clone(), registry).context("setting up replays")?;
        let app = App {
            config,
            tokens: Arc::new(tokens),
            ingest: Arc::new(ingest),
            replays: Arc::new(replays),
        };
        Ok(Bound {
            addr,
            dev_token,
            listener,
            router: router(&app),
        })
    }

    /// Serves until shutdown (in-flight requests finish first).
    pub async fn serve(self, probe: &StageProbe, mut shutdown: Shutdown) -> anyhow::Result<()> {
        probe.set_ready(true);
        let beats = {
            let probe = probe.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(1));
                loop {
                    tick.tick().await;
                    probe.beat();
                }
            })
        };
        let result = axum::serve(self.listener, self.router)
            .with_graceful_shutdown(async move { shutdown.wait().await })
            .await;
        beats.abort();
        result.context("serving the admin API")
    }
}

fn announce(bound: SocketAddr, dev_token: Option<&str>) {
    tracing::info!(addr = %bound, "admin api listening (/v1, /openapi.json, dashboard at /)");
    if let Some(token) = dev_token {
        // Printed, not logged: it is a credential, and log pipelines keep lines forever.
        println!(
            "\nhookline admin (dev): dashboard http://{bound}/  API http://{bound}/v1/\n\
             dev token (loopback only, new at every start): {token}\n"
        );
    }
}
