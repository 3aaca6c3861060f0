//! hookline's operator dashboard: server-rendered pages over the admin process's own calls.
//!
//! - `data.rs`  — what a page shows, and the [`Backend`] trait the admin process implements
//!   (tenant scoping lives there, once, for the JSON API and the pages alike);
//! - `views.rs` — the maud templates (every interpolation escaped);
//! - this file — the routes: token login into an `HttpOnly; SameSite=Strict` cookie, a CSRF
//!   field on every form that changes something, and the pages.
//!
//! Routes: `GET /` (endpoints with health and dead-delivery warnings), `GET /ui/endpoints/{id}`
//! (recent attempts, a test send button), `POST /ui/endpoints/{id}/test` (a test send), `GET /ui/dead` (filters, cursor), `GET /ui/dead/{position}` (history),
//! `POST /ui/dead/{position}/replay`, `POST /ui/dead/replay` (all matching the filter),
//! `GET /ui/counters.json` (live counters), `GET|POST /ui/login`, `POST /ui/logout`.

pub mod data;
pub mod views;

use std::sync::Arc;

use axum::extract::{Form, FromRequestParts, Path, Query, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, COOKIE, LOCATION, SET_COOKIE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use maud::Markup;
use serde::Deserialize;
use sha2::{Digest, Sha256};

pub use data::{
    AttemptRow, Backend, Counters, DeadDetail, DeadFilter, DeadPage, DeadRow, EndpointFilter,
    EndpointPage, EndpointRow, Health, Problem, ReplayOutcome, Scope, Settings, SettingsChange,
    TestSendOutcome, ENDPOINTS_PER_PAGE,
};

/// The session cookie: the token itself, readable by no script (`HttpOnly`) and sent by no other
/// site (`SameSite=Strict`).
pub const COOKIE_NAME: &str = "hookline_session";

/// The dashboard's routes; merge them into the admin router.
pub fn router<B: Backend>(backend: Arc<B>) -> Router {
    Router::new()
        .route("/", get(endpoints_page::<B>))
        .route("/ui/login", get(login_page).post(login::<B>))
        .route("/ui/logout", post(logout::<B>))
        .route("/ui/endpoints/{id}", get(endpoint_page::<B>))
        .route("/ui/endpoints/{id}/test", post(test_send::<B>))
        .route("/ui/endpoints/{id}/settings", post(update_settings::<B>))
        .route("/ui/dead", get(dead_page::<B>))
        .route("/ui/dead/replay", post(replay_matching::<B>))
        .route("/ui/dead/{position}", get(dead_one_page::<B>))
        .route("/ui/dead/{position}/replay", post(replay_one::<B>))
        .route("/ui/counters.json", get(counters::<B>))
        .with_state(backend)
}

/// The CSRF value of a session: derived from its token, so no server state is needed, and
/// unknowable to a page that cannot read the cookie.
pub fn csrf_of(token: &str) -> String {
    let digest = Sha256::digest(format!("hookline-dashboard-csrf:{token}").as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A signed-in request: its token and scope.
struct Session {
    token: String,
    scope: Scope,
}

impl Session {
    fn csrf(&self) -> String {
        csrf_of(&self.token)
    }

    /// Checks a form's CSRF field (constant-time enough: both are hex digests of fixed length).
    fn check(&self, csrf: &str) -> Result<(), Denied> {
        let expected = self.csrf();
        let same = expected.len() == csrf.len()
            && expected
                .bytes()
                .zip(csrf.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if same {
            Ok(())
        } else {
            Err(Denied::StaleForm)
        }
    }
}

fn cookie_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE_NAME)
        .map(|(_, value)| value.to_string())
        .filter(|v| !v.is_empty())
}

/// Why a request does not reach its page.
enum Denied {
    /// No session or a token no longer valid: to the login page.
    SignedOut,
    /// A changing form whose CSRF field does not match the session.
    StaleForm,
}

impl IntoResponse for Denied {
    fn into_response(self) -> Response {
        match self {
            Denied::SignedOut => (StatusCode::SEE_OTHER, [(LOCATION, "/ui/login")]).into_response(),
            Denied::StaleForm => page_error(
                StatusCode::FORBIDDEN,
                "This form is stale or did not come from the dashboard; reload the page and try again.",
            ),
        }
    }
}

/// The session of a request.
fn session<B: Backend>(backend: &B, headers: &HeaderMap) -> Result<Session, Denied> {
    let token = cookie_token(headers).ok_or(Denied::SignedOut)?;
    let scope = backend.authenticate(&token).ok_or(Denied::SignedOut)?;
    Ok(Session { token, scope })
}

/// Every page handler takes a [`Session`]: a request without one goes to the login page.
impl<B: Backend> FromRequestParts<Arc<B>> for Session {
    type Rejection = Denied;

    async fn from_request_parts(parts: &mut Parts, backend: &Arc<B>) -> Result<Self, Denied> {
        session(&**backend, &parts.headers)
    }
}

/// A page, or the problem that replaces it.
type PageResult = Result<Response, Problem>;

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        problem(self)
    }
}

fn html(status: StatusCode, markup: Markup) -> Response {
    (
        status,
        [
            (
                CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            ),
            (CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        markup.into_string(),
    )
        .into_response()
}

fn page_error(status: StatusCode, message: &str) -> Response {
    html(status, views::problem(message))
}

fn problem(p: Problem) -> Response {
    match p {
        Problem::NotFound => page_error(
            StatusCode::NOT_FOUND,
            "There is no such item, or it belongs to another tenant.",
        ),
        Problem::BadInput(m) => page_error(StatusCode::BAD_REQUEST, &m),
        Problem::Unavailable(m) => page_error(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!("Kafka did not answer in time ({m}); reload in a moment."),
        ),
    }
}

/// A full page in the layout, with fresh counters.
async fn page<B: Backend>(backend: &B, s: &Session, title: &str, body: Markup) -> Response {
    // Counters are decoration: a page still renders when they cannot be read.
    let counters = backend.counters(&s.scope).await.unwrap_or_default();
    html(
        StatusCode::OK,
        views::layout(title, &s.scope, &counters, &s.csrf(), body),
    )
}

async fn login_page() -> Response {
    html(StatusCode::OK, views::login(None))
}

#[derive(Deserialize)]
struct LoginForm {
    #[serde(default)]
    token: String,
}

async fn login<B: Backend>(State(b): State<Arc<B>>, Form(form): Form<LoginForm>) -> Response {
    let token = form.token.trim();
    // A cookie value may not hold `;`, `,`, spaces or controls: no valid token does either.
    let cookie_safe = token
        .bytes()
        .all(|c| c.is_ascii_graphic() && c != b';' && c != b',');
    if token.is_empty() || !cookie_safe || b.authenticate(token).is_none() {
        tracing::info!("dashboard sign-in refused");
        return html(
            StatusCode::UNAUTHORIZED,
            views::login(Some("That token is not valid.")),
        );
    }
    let cookie = format!("{COOKIE_NAME}={token}; Path=/; HttpOnly; SameSite=Strict");
    let mut response = (StatusCode::SEE_OTHER, [(LOCATION, "/")]).into_response();
    match HeaderValue::from_str(&cookie) {
        Ok(v) => {
            response.headers_mut().insert(SET_COOKIE, v);
            response
        }
        Err(_) => html(
            StatusCode::UNAUTHORIZED,
            views::login(Some("That token is not valid.")),
        ),
    }
}

#[derive(Deserialize)]
struct CsrfForm {
    #[serde(default)]
    csrf: String,
}

async fn logout<B: Backend>(
    State(b): State<Arc<B>>,
    headers: HeaderMap,
    Form(form): Form<CsrfForm>,
) -> Response {
    if let Ok(s) = session(&*b, &headers) {
        if let Err(d) = s.check(&form.csrf) {
            return d.into_response();
        }
    }
    let clear = format!("{COOKIE_NAME}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
    (
        StatusCode::SEE_OTHER,
        [(LOCATION, "/ui/login".to_string()), (SET_COOKIE, clear)],
    )
        .into_response()
}

async fn endpoints_page<B: Backend>(
    State(b): State<Arc<B>>,
    s: Session,
    Query(filter): Query<EndpointFilter>,
) -> PageResult {
    let filter = filter.normalized();
    let p = b.endpoints(&s.scope, &filter).await?;
    Ok(page(&*b, &s, "Endpoints", views::endpoints(&p, &filter)).await)
}

async fn endpoint_page<B: Backend>(
    State(b): State<Arc<B>>,
    s: Session,
    Path(id): Path<String>,
) -> PageResult {
    let (row, attempts) = b.endpoint(&s.scope, &id).await?;
    Ok(page(
        &*b,
        &s,
        &row.id,
        views::endpoint(&row, &attempts, &s.csrf()),
    )
    .await)
}

async fn test_send<B: Backend>(
    State(b): State<Arc<B>>,
    s: Session,
    Path(id): Path<String>,
    Form(form): Form<CsrfForm>,
) -> Result<Response, Response> {
    s.check(&form.csrf).map_err(IntoResponse::into_response)?;
    let o = b.test_send(&s.scope, &id).await.map_err(problem)?;
    Ok(page(&*b, &s, "Test send", views::test_sent(&o)).await)
}

#[derive(Deserialize)]
struct SettingsForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    version: String,
    #[serde(default)]
    rate_limit: String,
    #[serde(default)]
    burst: String,
    #[serde(default)]
    filter: String,
    #[serde(default)]
    headers: String,
    #[serde(default)]
    timeout: String,
    #[serde(default)]
    max_concurrency: String,
}

impl SettingsForm {
    /// The change the form asks for; a field that does not parse is named.
    fn parse(&self) -> Result<SettingsChange, String> {
        fn opt<T: std::str::FromStr>(
            field: &str,
            text: &str,
            what: &str,
        ) -> Result<Option<T>, String> {
            let text = text.trim();
            if text.is_empty() {
                return Ok(None);
            }
            text.parse()
                .map(Some)
                .map_err(|_| format!("{field}: `{text}` is not {what}"))
        }
        let headers = self
            .headers
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(|line| {
                let (secret, rest) = match line.strip_prefix("secret ") {
                    Some(rest) => (true, rest.trim()),
                    None => (false, line),
                };
                match rest.split_once(':') {
                    Some((name, value)) => (
                        name.trim().to_string(),
                        Some(value.trim_start().to_string()),
                        secret,
                    ),
                    None => (rest.to_string(), None, secret),
                }
            })
            .collect();
        let timeout = match self.timeout.trim() {
            "" => None,
            t => Some(
                humantime::parse_duration(t)
                    .map_err(|e| format!("timeout: `{t}` is not a duration: {e}"))?,
            ),
        };
        Ok(SettingsChange {
            version: opt("version", &self.version, "a version")?.unwrap_or(0),
            rate_limit: opt(
                "rate_limit",
                &self.rate_limit,
                "a number of deliveries per second",
            )?,
            burst: opt("burst", &self.burst, "a whole number")?,
            filter: Some(self.filter.trim().to_string()).filter(|f| !f.is_empty()),
            headers,
            timeout,
            max_concurrency: opt("max_concurrency", &self.max_concurrency, "a whole number")?,
        })
    }
}

async fn update_settings<B: Backend>(
    State(b): State<Arc<B>>,
    s: Session,
    Path(id): Path<String>,
    Form(form): Form<SettingsForm>,
) -> Result<Response, Response> {
    s.check(&form.csrf).map_err(IntoResponse::into_response)?;
    let change = form
        .parse()
        .map_err(|m| page_error(StatusCode::BAD_REQUEST, &m))?;
    b.update_settings(&s.scope, &id, change)
        .await
        .map_err(problem)?;
    let back = format!("/ui/endpoints/{}", views::urlencode(&id));
    Ok((StatusCode::SEE_OTHER, [(LOCATION, back)]).into_response())
}

async fn dead_page<B: Backend>(
    State(b): State<Arc<B>>,
    s: Session,
    Query(filter): Query<DeadFilter>,
) -> PageResult {
    let filter = filter.normalized();
    let p = b.dead(&s.scope, &filter).await?;
    let body = views::dead_list(&p, &filter, &s.csrf());
    Ok(page(&*b, &s, "Dead deliveries", body).await)
}

async fn dead_one_page<B: Backend>(
    State(b): State<Arc<B>>,
    s: Session,
    Path(position): Path<String>,
) -> PageResult {
    let d = b.dead_one(&s.scope, &position).await?;
    let body = views::dead_one(&d, &s.csrf());
    Ok(page(&*b, &s, "Dead delivery", body).await)
}

async fn replay_one<B: Backend>(
    State(b): State<Arc<B>>,
    s: Session,
    Path(position): Path<String>,
    Form(form): Form<CsrfForm>,
) -> Result<Response, Response> {
    s.check(&form.csrf).map_err(IntoResponse::into_response)?;
    let back = format!("/ui/dead/{}", views::urlencode(&position));
    let o = b
        .replay(&s.scope, Some(&position), &DeadFilter::default())
        .await
        .map_err(problem)?;
    Ok(page(&*b, &s, "Replay", views::replayed(&o, &back)).await)
}

#[derive(Deserialize)]
struct ReplayForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    endpoint: Option<String>,
    #[serde(default, rename = "type")]
    event_type: Option<String>,
    #[serde(default)]
    tenant: Option<String>,
}

async fn replay_matching<B: Backend>(
    State(b): State<Arc<B>>,
    s: Session,
    Form(form): Form<ReplayForm>,
) -> Result<Response, Response> {
    s.check(&form.csrf).map_err(IntoResponse::into_response)?;
    let filter = DeadFilter {
        endpoint: form.endpoint,
        event_type: form.event_type,
        tenant: form.tenant,
        cursor: None,
    }
    .normalized();
    let o = b.replay(&s.scope, None, &filter).await.map_err(problem)?;
    Ok(page(&*b, &s, "Replay", views::replayed(&o, "/ui/dead")).await)
}

async fn counters<B: Backend>(State(b): State<Arc<B>>, headers: HeaderMap) -> Response {
    let Some(scope) = cookie_token(&headers).and_then(|t| b.authenticate(&t)) else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    match b.counters(&scope).await {
        Ok(c) => ([(CACHE_CONTROL, "no-store")], Json(c)).into_response(),
        Err(_) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_settings_form_parses_naming_a_bad_field() {
        let form = |rate: &str, headers: &str, timeout: &str| SettingsForm {
            csrf: String::new(),
            version: "4".into(),
            rate_limit: rate.into(),
            burst: String::new(),
            filter: "  ".into(),
            headers: headers.into(),
            timeout: timeout.into(),
            max_concurrency: String::new(),
        };
        let c = form(
            " 25 ",
            "X-Team: core\r\nsecret Authorization: Bearer x\nsecret Keep\n\n",
            "5s",
        )
        .parse()
        .expect("valid");
        assert_eq!((c.version, c.rate_limit, c.filter), (4, Some(25.0), None));
        assert_eq!(c.timeout, Some(std::time::Duration::from_secs(5)));
        assert_eq!(
            c.headers,
            [
                ("X-Team".to_string(), Some("core".to_string()), false),
                (
                    "Authorization".to_string(),
                    Some("Bearer x".to_string()),
                    true
                ),
                ("Keep".to_string(), None, true),
            ]
        );
        assert!(form("fast", "", "")
            .parse()
            .unwrap_err()
            .starts_with("rate_limit:"));
        assert!(form("", "", "soon")
            .parse()
            .unwrap_err()
            .starts_with("timeout:"));
        assert_eq!(
            views::header_lines(&[
                ("x-team".into(), Some("core".into()), false),
                ("authorization".into(), None, true)
            ]),
            "x-team: core\nsecret authorization"
        );
    }

    #[test]
    fn csrf_is_stable_per_token_and_differs_between_tokens() {
        assert_eq!(csrf_of("a"), csrf_of("a"));
        assert_ne!(csrf_of("a"), csrf_of("b"));
        assert_eq!(csrf_of("a").len(), 64);
    }

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let mut h = HeaderMap::new();
        h.append(
            COOKIE,
            HeaderValue::from_static("x=1; hookline_session=tok; y=2"),
        );
        assert_eq!(cookie_token(&h).as_deref(), Some("tok"));
        let mut h = HeaderMap::new();
        h.append(COOKIE, HeaderValue::from_static("hookline_session="));
        assert_eq!(cookie_token(&h), None);
    }
}
