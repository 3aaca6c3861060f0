//! The admin process (`hookline run admin`): one HTTP listener (`admin.listen`, loopback by
//! default) serving
//!
//! - `/v1/…` — the API, every route behind a bearer token (`auth.rs`): `POST /v1/events`
//!   (REST ingest with `Idempotency-Key`, the `hookline-ingest` crate) and an event's attempts
//!   (`events.rs`), endpoints with health (`endpoints.rs`, the `hookline-control` registry),
//!   dead letters and replay (`dead.rs`);
//! - `/openapi.json` — the OpenAPI 3 document, generated from the same route table that serves
//!   (`utoipa-axum`), so the two cannot disagree;
//! - `/` and `/ui/…` — the dashboard (`hookline-dashboard`), its data from `ui.rs`.
//!
//! Without a configured token the process refuses to start, unless it listens on loopback and
//! was started with the dev flag: then it makes a random token and prints it once.

pub mod auth;
pub mod dead;
pub mod endpoints;
pub mod error;
pub mod events;
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

use hookline_common::config::admin::TokenScope;
use hookline_common::config::Config;
use hookline_common::runtime::ops::{Readiness, StageProbe};
use hookline_common::runtime::shutdown::Shutdown;
use hookline_control::Plane;
use hookline_ingest::Ingest;
use hookline_tools::replay::Replays;

use crate::auth::Tokens;

/// The stage name of the admin process's probe.
pub const STAGE: &str = "admin";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "hookline admin API",
        description = "Publish events (with Idempotency-Key), manage endpoints and read their health, \
                       trace an event's attempts, browse and replay dead deliveries. \
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
    pub control: endpoints::Control,
    /// Every replay of the process (API and dashboard) attempts through these.
    pub replays: Arc<Replays>,
}

/// The API routes and their OpenAPI document, from one table.
pub fn api(app: &App) -> (Router, utoipa::openapi::OpenApi) {
    let events = OpenApiRouter::new()
        .routes(routes!(events::publish))
        .layer(hookline_ingest::http::body_limit(
            app.config.input.max_payload_bytes,
        ))
        .with_state(app.ingest.clone());
    let trace = OpenApiRouter::new()
        .routes(routes!(events::attempts))
        .with_state(app.config.clone());
    let endpoints = OpenApiRouter::new()
        .routes(routes!(endpoints::list, endpoints::create))
        .routes(routes!(endpoints::batch))
        .routes(routes!(
            endpoints::show,
            endpoints::update,
            endpoints::delete
        ))
        .routes(routes!(endpoints::rotate_secret))
        .routes(routes!(endpoints::health))
        .with_state(app.control.clone());
    let test_sends = OpenApiRouter::new()
        .routes(routes!(endpoints::test_send))
        .with_state(endpoints::TestState {
            control: app.control.clone(),
            replays: app.replays.clone(),
        });
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
        .merge(trace)
        .merge(endpoints)
        .merge(test_sends)
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
        control: app.control.clone(),
        replays: app.replays.clone(),
    }));
    api.merge(openapi).merge(ui)
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

/// Runs the admin process until shutdown, on a control plane of its own. `dev`: see [`tokens`].
pub async fn run(
    config: Arc<Config>,
    registry: Registry,
    readiness: Readiness,
    shutdown: Shutdown,
    dev: bool,
) -> anyhow::Result<()> {
    Plane::run_own(&config.clone(), &registry.clone(), |plane| {
        run_with(config, registry, readiness, shutdown, dev, plane)
    })
    .await
}

/// [`run`] on the process's control plane (`run all` shares one between its stages).
pub async fn run_with(
    config: Arc<Config>,
    registry: Registry,
    readiness: Readiness,
    shutdown: Shutdown,
    dev: bool,
    plane: Plane,
) -> anyhow::Result<()> {
    let probe = readiness.register(STAGE);
    let result = async {
        let bound = Bound::bind(config, &registry, dev, plane).await?;
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
    /// window's idempotency claims: until then a reused key could not be checked) and the
    /// endpoint health tracker, on `plane`'s registry.
    pub async fn bind(
        config: Arc<Config>,
        registry: &Registry,
        dev: bool,
        plane: Plane,
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
        let live = plane.registry.clone();
        let health =
            hookline_control::tracker::Health::start(&config, Some(live.clone()), registry)
                .await
                .context("starting the endpoint health tracker")?;
        let replays =
            Replays::new(config.clone(), registry, plane).context("setting up replays")?;
        let app = App {
            config,
            tokens: Arc::new(tokens),
            ingest: Arc::new(ingest),
            control: endpoints::Control {
                registry: live,
                health: Arc::new(health),
            },
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

#[cfg(test)]
mod tests {
    use super::*;

    fn config(listen: &str, tokens: &str) -> Config {
        let text = format!(
            "[kafka]\nbootstrap_servers = \"127.0.0.1:9092\"\n[admin]\nlisten = \"{listen}\"\n{tokens}"
        );
        Config::from_toml_with_env(&text, "test", Vec::new()).expect("valid config")
    }

    #[test]
    fn no_token_refuses_to_start_unless_dev_on_loopback() {
        let none = config("127.0.0.1:8090", "");
        let e = tokens(&none, false).err().expect("refused").to_string();
        assert!(e.contains("admin.tokens is empty"), "{e}");
        let (t, dev) = tokens(&none, true).expect("dev token on loopback");
        let dev = dev.expect("a printed token");
        assert!(t.check(&dev).is_some_and(|c| c.scope == TokenScope::Admin));
        let exposed = config("0.0.0.0:8090", "");
        let e = tokens(&exposed, true).err().expect("refused").to_string();
        assert!(e.contains("only for loopback"), "{e}");
        let hash = auth::hex(&auth::sha256("t"));
        let configured = config(
            "0.0.0.0:8090",
            &format!("[[admin.tokens]]\nname = \"ops\"\nsha256 = \"{hash}\"\nscope = \"admin\"\n"),
        );
        let (t, dev) = tokens(&configured, true).expect("configured tokens");
        assert!(dev.is_none(), "no dev token once tokens are configured");
        assert!(t.check("t").is_some());
    }
}
