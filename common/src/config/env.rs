//! Environment overrides of the configuration: `HOOKLINE_<SECTION>__<KEY>` sets `section.key`
//! (double underscore between levels, case-insensitive); under `kafka.options` single
//! underscores become dots. Kubernetes service-link variables that share the prefix are told
//! apart and ignored; any other `HOOKLINE_…` variable without `__` is an error naming the key it
//! probably meant.

use super::ConfigError;

/// `HOOKLINE_…` variables that are not config overrides: the config path, the demo switch of
/// `make run`, and the test and benchmark harnesses' settings.
pub(super) fn is_reserved_env(key: &str) -> bool {
    key == "HOOKLINE_CONFIG"
        || key == "HOOKLINE_DEMO"
        || key.starts_with("HOOKLINE_TEST_")
        || key.starts_with("HOOKLINE_BENCH_")
        || crate::config::control::is_reserved_env(key)
}

/// Whether `key` is a variable Kubernetes injects for a Service named `hookline` or
/// `hookline-<svc>` (`enableServiceLinks`, on by default):
/// `HOOKLINE_[<SVC>_]SERVICE_HOST`, `…SERVICE_PORT[_<PORT NAME>]`, `…PORT`,
/// `…PORT_<n>_<TCP|UDP|SCTP>[_PROTO|_PORT|_ADDR]`. No config key ends like these, and overrides
/// always contain `__`, which a service link never does.
pub(super) fn is_kubernetes_service_link(key: &str) -> bool {
    let Some(rest) = key.strip_prefix("HOOKLINE_") else {
        return false;
    };
    if rest.contains("__") {
        return false;
    }
    let parts: Vec<&str> = rest.split('_').collect();
    let word = |p: &str| {
        !p.is_empty()
            && p.chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
    };
    if !parts.iter().all(|p| word(p)) {
        return false;
    }
    // `i` is where the part after the service name starts (0 for the Service `hookline`).
    (0..parts.len()).any(|i| match &parts[i..] {
        ["SERVICE", "HOST"] | ["SERVICE", "PORT", ..] | ["PORT"] => true,
        ["PORT", number, proto, suffix @ ..] => {
            number.chars().all(|c| c.is_ascii_digit())
                && matches!(*proto, "TCP" | "UDP" | "SCTP")
                && matches!(suffix, [] | ["PROTO" | "PORT" | "ADDR"])
        }
        _ => false,
    })
}

/// Top-level sections an environment override can address (`HOOKLINE_<SECTION>__<KEY>`); used
/// to tell which key a single-underscore variable meant.
pub(super) const OVERRIDE_SECTIONS: &[&str] = &[
    "kafka",
    "topics",
    "input",
    "dedupe",
    "retry",
    "http",
    "dispatcher",
    "tiers",
    "server",
    "log",
    "admin",
    "control",
];

/// The override a single-underscore variable most likely meant:
/// `HOOKLINE_KAFKA_BOOTSTRAP_SERVERS` → `HOOKLINE_KAFKA__BOOTSTRAP_SERVERS`.
fn intended_override(key: &str) -> Option<String> {
    let rest = key.strip_prefix("HOOKLINE_")?;
    let lower = rest.to_ascii_lowercase();
    if let Some(option) = lower.strip_prefix("kafka_options_") {
        return Some(format!(
            "HOOKLINE_KAFKA__OPTIONS__{}",
            option.to_ascii_uppercase()
        ));
    }
    OVERRIDE_SECTIONS.iter().find_map(|section| {
        let field = lower.strip_prefix(section)?.strip_prefix('_')?;
        (!field.is_empty()).then(|| {
            format!(
                "HOOKLINE_{}__{}",
                section.to_ascii_uppercase(),
                field.to_ascii_uppercase()
            )
        })
    })
}

/// Most levels an environment override may address (`HOOKLINE_KAFKA__OPTIONS__SASL_PASSWORD` is
/// 3; no configuration key is deeper). Each level becomes a nested table, built and dropped by
/// recursion: a 60 KB variable of `__A` repeated overflowed the stack and aborted the process.
const MAX_OVERRIDE_LEVELS: usize = 8;

pub(super) fn apply_env_override(
    root: &mut toml::Table,
    key: &str,
    value: &str,
) -> Result<(), ConfigError> {
    if !key.contains("__") {
        let shape = "environment overrides look like HOOKLINE_<SECTION>__<KEY> (double underscore between levels)";
        return Err(ConfigError::field(
            key,
            match intended_override(key) {
                Some(intended) => format!("did you mean {intended}? {shape}"),
                None => shape.to_string(),
            },
        ));
    }
    let path: Vec<String> = key["HOOKLINE_".len()..]
        .split("__")
        .map(|p| p.to_ascii_lowercase())
        .collect();
    if path.iter().any(|p| p.is_empty()) {
        return Err(ConfigError::field(
            key,
            "environment override has an empty path segment",
        ));
    }
    if path.len() > MAX_OVERRIDE_LEVELS {
        let shown: String = key.chars().take(100).collect();
        return Err(ConfigError::field(
            if shown.len() < key.len() {
                format!("{shown}…")
            } else {
                shown
            },
            format!(
                "environment override has more than {MAX_OVERRIDE_LEVELS} levels; no configuration key is that deep"
            ),
        ));
    }
    let is_kafka_option = path.len() == 3 && path[0] == "kafka" && path[1] == "options";
    let parsed = if is_kafka_option {
        toml::Value::String(value.to_string())
    } else {
        parse_env_value(value)
    };
    let mut table = root;
    for (depth, segment) in path.iter().enumerate() {
        let last = depth == path.len() - 1;
        let segment = if is_kafka_option && last {
            segment.replace('_', ".")
        } else {
            segment.clone()
        };
        if last {
            table.insert(segment, parsed);
            return Ok(());
        }
        let entry = table
            .entry(segment.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        table = match entry {
            toml::Value::Table(t) => t,
            _ => {
                return Err(ConfigError::field(
                    path[..=depth].join("."),
                    format!("{key} overrides inside a value that is not a table"),
                ))
            }
        };
    }
    Ok(())
}

fn parse_env_value(value: &str) -> toml::Value {
    // `x = <value>` parses only if value is a TOML literal (number, bool, array, inline table).
    match toml::from_str::<toml::Table>(&format!("x = {value}")) {
        Ok(mut t) => t
            .remove("x")
            .unwrap_or_else(|| toml::Value::String(value.into())),
        Err(_) => toml::Value::String(value.to_string()),
    }
}
