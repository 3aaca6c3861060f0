//! The one error shape of every admin route (the same as `POST /v1/events`'):
//! `{"error":{"status":404,"code":"not_found","field":"…","message":"…"}}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub field: Option<String>,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            field: None,
            message: message.into(),
        }
    }

    /// 400 naming the bad field.
    pub fn field(field: &str, message: impl Into<String>) -> Self {
        ApiError {
            field: Some(field.to_string()),
            ..ApiError::new(StatusCode::BAD_REQUEST, "invalid_field", message)
        }
    }

    /// 404 — also the answer for another tenant's resource (never "forbidden": that would say
    /// it exists).
    pub fn not_found(what: &str) -> Self {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no such {what}"),
        )
    }

    /// 503: Kafka did not answer; the message says what was being done.
    pub fn unavailable(e: &anyhow::Error) -> Self {
        tracing::warn!(error = format!("{e:#}"), "admin request failed on kafka");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            format!("{e:#}"),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        hookline_ingest::http::error(self.status, self.code, self.field.as_deref(), &self.message)
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
