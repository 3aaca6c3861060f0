//! Command-line arguments of `hookline replay` and `hookline dead`, and their entry points. The
//! binary flattens these into its own parser and calls [`replay`] / [`dead`].

use std::sync::Arc;
use std::time::UNIX_EPOCH;

use anyhow::bail;

use hookline_common::config::Config;

use crate::dead::{self, DeadFilter, DlqPosition, Format};
use crate::replay::{self, ReplayOptions, ReplaySummary};

/// Which dead letters: every given filter must match.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct FilterArgs {
    /// Only deliveries to this endpoint id.
    #[arg(long, value_name = "ID")]
    pub endpoint: Option<String>,
    /// Only event types matching this glob (`*` matches any run of characters), e.g. `message.*`.
    #[arg(long = "type", value_name = "GLOB")]
    pub event_type: Option<String>,
    /// Only events of this tenant.
    #[arg(long)]
    pub tenant: Option<String>,
    /// Only this event id.
    #[arg(long, value_name = "ID")]
    pub event_id: Option<String>,
    /// Only deliveries declared dead at or after this time (RFC 3339, e.g. 2025-06-01T00:00:00Z,
    /// or unix milliseconds).
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub dead_after: Option<i64>,
    /// Only deliveries declared dead before this time (RFC 3339 or unix milliseconds).
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub dead_before: Option<i64>,
    /// Only this DLQ partition.
    #[arg(long)]
    pub partition: Option<i32>,
    /// First DLQ offset to consider (in every selected partition).
    #[arg(long, value_name = "OFFSET")]
    pub from_offset: Option<i64>,
    /// Last DLQ offset to consider, inclusive.
    #[arg(long, value_name = "OFFSET")]
    pub to_offset: Option<i64>,
}

impl From<FilterArgs> for DeadFilter {
    fn from(a: FilterArgs) -> DeadFilter {
        DeadFilter {
            endpoint: a.endpoint,
            event_type: a.event_type,
            tenant: a.tenant,
            event_id: a.event_id,
            dead_after_ms: a.dead_after,
            dead_before_ms: a.dead_before,
            partition: a.partition,
            from_offset: a.from_offset,
            to_offset: a.to_offset,
        }
    }
}

/// `hookline replay`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    pub filter: FilterArgs,
    /// List what would be replayed (one line per record); send and write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Start at most this many deliveries per second.
    #[arg(long, value_name = "PER_SECOND")]
    pub rate: Option<f64>,
    /// Give each delivery a fresh full retry schedule instead of one immediate attempt.
    #[arg(long)]
    pub with_retries: bool,
    /// Replays in flight at once. A crashed replay re-sends at most this many when run again.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub concurrency: usize,
    /// Allow replaying every dead delivery (no filter given).
    #[arg(long)]
    pub all: bool,
}

/// `hookline dead …`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum DeadCommand {
    /// List dead deliveries.
    List {
        #[command(flatten)]
        filter: FilterArgs,
        #[arg(long, value_enum, default_value_t = Format::Table)]
        format: Format,
    },
    /// Show one dead delivery: metadata, attempt history, replay status, body preview.
    Show {
        /// `<partition>:<offset>` in the DLQ, as printed by `dead list`.
        #[arg(value_name = "PARTITION:OFFSET")]
        position: DlqPosition,
        #[arg(long, value_enum, default_value_t = Format::Table)]
        format: Format,
    },
}

/// Runs `hookline replay`, printing to stdout; returns what it did (the binary exits
/// [`replay::EXIT_NOT_ALL_DELIVERED`] unless [`replay::ReplaySummary::all_done`]).
pub async fn replay(config: Arc<Config>, args: ReplayArgs) -> anyhow::Result<ReplaySummary> {
    let filter = DeadFilter::from(args.filter);
    if filter.is_unrestricted() && !args.all && !args.dry_run {
        bail!(
            "no filter given: pass --all to replay every dead delivery (or --dry-run to list them)"
        );
    }
    if args.rate.is_some_and(|r| !(r > 0.0 && r.is_finite())) {
        bail!("--rate must be a positive number of deliveries per second");
    }
    if args.concurrency == 0 {
        bail!("--concurrency must be at least 1");
    }
    let options = ReplayOptions {
        filter,
        dry_run: args.dry_run,
        rate: args.rate,
        with_retries: args.with_retries,
        concurrency: args.concurrency,
    };
    let mut stdout = std::io::stdout();
    replay::run(config, options, &mut stdout).await
}

/// Runs `hookline dead list|show`, printing to stdout.
pub async fn dead(config: Arc<Config>, command: DeadCommand) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout();
    match command {
        DeadCommand::List { filter, format } => {
            dead::list(&config, &filter.into(), format, &mut stdout).await?;
        }
        DeadCommand::Show { position, format } => {
            dead::show(&config, position, format, &mut stdout).await?;
        }
    }
    Ok(())
}

/// Unix milliseconds, or an RFC 3339 time (`Z` or a `±HH:MM` offset; no zone means UTC).
pub fn parse_time(s: &str) -> Result<i64, String> {
    let s = s.trim();
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return s
            .parse::<i64>()
            .map_err(|e| format!("`{s}` is not a unix millisecond time: {e}"));
    }
    let bad =
        |why: String| format!("`{s}` is neither unix milliseconds nor an RFC 3339 time: {why}");
    let (local, offset_minutes) = split_zone(s).map_err(bad)?;
    let t = humantime::parse_rfc3339_weak(local).map_err(|e| bad(e.to_string()))?;
    let ms = t
        .duration_since(UNIX_EPOCH)
        .map_err(|e| bad(e.to_string()))?
        .as_millis();
    let ms = i64::try_from(ms).map_err(|e| bad(e.to_string()))?;
    Ok(ms - offset_minutes * 60_000)
}

/// Splits `…Z` / `…+02:00` into the local time and the zone offset in minutes.
fn split_zone(s: &str) -> Result<(&str, i64), String> {
    if let Some(local) = s.strip_suffix(['Z', 'z']) {
        return Ok((local, 0));
    }
    let b = s.as_bytes();
    if b.len() > 6 && matches!(b[b.len() - 6], b'+' | b'-') && b[b.len() - 3] == b':' {
        let zone = &s[s.len() - 6..];
        let hours: i64 = zone[1..3]
            .parse()
            .map_err(|_| format!("bad zone offset `{zone}`"))?;
        let minutes: i64 = zone[4..6]
            .parse()
            .map_err(|_| format!("bad zone offset `{zone}`"))?;
        let sign = if b[b.len() - 6] == b'-' { -1 } else { 1 };
        return Ok((&s[..s.len() - 6], sign * (hours * 60 + minutes)));
    }
    Ok((s, 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_as_unix_ms_or_rfc3339() {
        assert_eq!(parse_time("1700000000000"), Ok(1_700_000_000_000));
        assert_eq!(parse_time("1970-01-01T00:00:01Z"), Ok(1_000));
        assert_eq!(parse_time("1970-01-01T00:00:01.5Z"), Ok(1_500));
        assert_eq!(parse_time("1970-01-01T02:00:00+02:00"), Ok(0));
        assert_eq!(parse_time("1970-01-01T00:00:00-01:30"), Ok(5_400_000));
        assert_eq!(parse_time("1970-01-01 00:01:00"), Ok(60_000));
        assert!(parse_time("yesterday").is_err());
        assert!(parse_time("").is_err());
    }

    #[test]
    fn arguments_parse() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct T {
            #[command(subcommand)]
            dead: DeadCommand,
        }
        let t = T::try_parse_from([
            "t",
            "list",
            "--type",
            "message.*",
            "--dead-after",
            "2025-01-01T00:00:00Z",
            "--format",
            "json",
        ])
        .expect("parse");
        match t.dead {
            DeadCommand::List { filter, format } => {
                assert_eq!(filter.event_type.as_deref(), Some("message.*"));
                assert_eq!(filter.dead_after, Some(1_735_689_600_000));
                assert_eq!(format, Format::Json);
            }
            DeadCommand::Show { .. } => panic!("expected list"),
        }
        let t = T::try_parse_from(["t", "show", "2:40"]).expect("parse");
        assert!(matches!(
            t.dead,
            DeadCommand::Show {
                position: DlqPosition {
                    partition: 2,
                    offset: 40
                },
                ..
            }
        ));
    }
}
