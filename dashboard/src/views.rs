//! The pages, as maud templates (every interpolation is HTML-escaped).

use maud::{html, Markup, PreEscaped, DOCTYPE};

use crate::data::Activity;
use crate::data::{
    AttemptRow, Counters, DeadDetail, DeadFilter, DeadPage, DeadRow, EndpointFilter, EndpointPage,
    EndpointRow, ReplayOutcome, Scope, TestSendOutcome,
};

const CSS: &str = r#"
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:10px 24px;display:flex;gap:24px;align-items:center}
header a{color:#cfd6e4;text-decoration:none}header a.brand{color:#fff;font-weight:600}
main{padding:20px 24px;max-width:1200px}
table{border-collapse:collapse;width:100%;background:#fff}
th,td{text-align:left;padding:6px 8px;border-bottom:1px solid #e3e6eb;vertical-align:top}
th{font-weight:600;background:#eef0f4}
.warn{background:#fff4e5;border:1px solid #f0b45a;padding:8px 12px;margin:8px 0;border-radius:4px}
.bad{color:#b3261e}.ok{color:#1e7b34}.muted{color:#6b7280}.thr{color:#b45309}
.counters{display:flex;gap:16px;margin:0 0 16px}
.counter{background:#fff;border:1px solid #e3e6eb;border-radius:4px;padding:8px 14px}
.counter b{display:block;font-size:20px}
button,input[type=submit]{background:#2456c8;color:#fff;border:0;border-radius:4px;padding:6px 14px;cursor:pointer}
form.inline{display:inline}
pre{background:#fff;border:1px solid #e3e6eb;padding:8px;overflow:auto;max-height:240px}
.help{color:#4b5563;max-width:800px}
"#;

/// Polls the counters every 2 s.
const COUNTERS_JS: &str = r#"
(function(){
  async function tick(){
    try{
      const r = await fetch('/ui/counters.json',{credentials:'same-origin'});
      if(!r.ok) return;
      const c = await r.json();
      for (const k of Object.keys(c)) {
        const el = document.getElementById('c-'+k);
        if (el) el.textContent = c[k];
      }
    }catch(e){}
  }
  setInterval(tick, 2000);
})();
"#;

/// The frame of every page after login.
pub fn layout(title: &str, scope: &Scope, counters: &Counters, csrf: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { (title) " · hookline" }
                style { (PreEscaped(CSS)) }
            }
            body {
                header {
                    a.brand href="/" { "hookline" }
                    a href="/" { "Endpoints" }
                    a href="/ui/dead" { "Dead deliveries" }
                    span.muted style="margin-left:auto" {
                        @match scope {
                            Scope::Admin => "signed in: admin (every tenant)",
                            Scope::Tenant(t) => { "signed in: tenant " (t) }
                        }
                    }
                    form.inline method="post" action="/ui/logout" {
                        input type="hidden" name="csrf" value=(csrf);
                        input type="submit" value="Sign out";
                    }
                }
                main {
                    div.counters {
                        (counter("delivered_last_5m", "delivered (5 min)", counters.delivered_last_5m))
                        (counter("failed_last_5m", "failed attempts (5 min)", counters.failed_last_5m))
                        (counter("dead", "dead deliveries", counters.dead))
                    }
                    (body)
                }
                script { (PreEscaped(COUNTERS_JS)) }
            }
        }
    }
}

fn counter(id: &str, label: &str, value: u64) -> Markup {
    html! { div.counter { b id=(format!("c-{id}")) { (value) } span.muted { (label) } } }
}

pub fn login(error: Option<&str>) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head { meta charset="utf-8"; title { "Sign in · hookline" } style { (PreEscaped(CSS)) } }
            body {
                header { span.brand { "hookline" } }
                main {
                    h1 { "Sign in" }
                    p.help { "Paste an API token: an admin token shows every tenant, a tenant token only that tenant's endpoints and deliveries." }
                    @if let Some(e) = error { p.bad id="login-error" { (e) } }
                    form method="post" action="/ui/login" {
                        input type="password" name="token" id="token" size="60" autocomplete="off" placeholder="token";
                        " "
                        input type="submit" id="sign-in" value="Sign in";
                    }
                }
            }
        }
    }
}

const DEAD_HELP: &str = "A delivery is dead when every attempt of the retry schedule failed \
(the first attempt and retries after 1 min, 5 min, 30 min, 2 h, 6 h and 24 h). The event is kept \
forever. Replay sends it once more, now, with the endpoint's current URL and secret; if that \
attempt fails too, it becomes a new dead delivery. Replaying the same dead delivery twice sends it once.";

pub fn endpoints(page: &EndpointPage, filter: &EndpointFilter) -> Markup {
    let rows = &page.rows;
    let with_dead: Vec<&EndpointRow> = rows.iter().filter(|r| r.dead > 0).collect();
    let f = |v: &Option<String>| v.clone().unwrap_or_default();
    let state = f(&filter.state);
    html! {
        h1 { "Endpoints" }
        form #endpoint-filter method="get" action="/" {
            "tenant " input name="tenant" value=(f(&filter.tenant)) size="12";
            " state " select name="state" {
                @for (v, label) in [("", "any"), ("enabled", "enabled"), ("disabled", "disabled"), ("unusable", "unusable")] {
                    @if v == state { option value=(v) selected { (label) } } @else { option value=(v) { (label) } }
                }
            }
            " URL starts with " input name="url_prefix" value=(f(&filter.url_prefix)) size="28" placeholder="https://";
            " " input type="submit" value="Filter";
        }
        @for r in &with_dead {
            div.warn data-endpoint=(r.id) {
                "⚠ Endpoint " b { (r.id) } " has " b { (r.dead) } " dead "
                (if r.dead == 1 { "delivery" } else { "deliveries" })
                " — events it never received. "
                a href=(format!("/ui/dead?endpoint={}", urlencode(&r.id))) { "See them and replay" }
            }
        }
        @if rows.is_empty() { p.muted { "No endpoints." } }
        @else {
            table #endpoints {
                tr { th { "Endpoint" } th { "URL" } th { "Tenant" } th { "State" } th { "Success (1 h)" }
                     th { "Attempts (24 h)" } th { "Last attempt" } th { "Failing" } th { "Dead" } }
                @for r in rows {
                    tr data-endpoint=(r.id) {
                        td { a href=(format!("/ui/endpoints/{}", urlencode(&r.id))) { (r.id) } }
                        td.muted { (r.url) }
                        td { (r.tenant.as_deref().unwrap_or("(all)")) }
                        td {
                            @if r.enabled { span.ok { "enabled" } } @else { span.bad { "disabled" } }
                            @if r.health.throttled { br; span.thr.throttled-state { "throttled" } }
                        }
                        td { (rate(&r.health)) }
                        td { (chart(&r.activity, 24, 60, 96.0, 20.0, "trend", &r.id)) }
                        td {
                            @if let Some(s) = &r.health.last_status { (s) " " }
                            @if let Some(at) = &r.health.last_attempt_at { span.muted { (at) } }
                            @if let Some(e) = &r.health.last_error { br; span.bad { (e) } }
                        }
                        td {
                            @if r.health.consecutive_failures > 0 {
                                span.bad { (r.health.consecutive_failures) " in a row" }
                                @if let Some(s) = &r.health.failing_since { br; span.muted { "since " (s) } }
                            } @else { span.muted { "—" } }
                        }
                        td { @if r.dead > 0 { span.bad { (r.dead) } } @else { "0" } }
                    }
                }
            }
        }
        @if let Some(c) = &page.next_cursor {
            p { a #next href=(endpoints_next_link(filter, c)) { "Next page →" } }
        }
    }
}

fn rate(h: &crate::data::Health) -> Markup {
    match h.success_rate {
        Some(r) => {
            let pct = format!("{:.1}%", r * 100.0);
            html! {
                @if r < 0.9 { span.bad { (pct) } } @else { span.ok { (pct) } }
                span.muted { " of " (h.attempts_last_hour) }
            }
        }
        None => html! { span.muted { "no attempts" } },
    }
}

fn endpoints_next_link(filter: &EndpointFilter, cursor: &str) -> String {
    page_link(
        "/",
        cursor,
        &[
            ("tenant", &filter.tenant),
            ("state", &filter.state),
            ("url_prefix", &filter.url_prefix),
        ],
    )
}

pub fn endpoint(row: &EndpointRow, attempts: &[AttemptRow], csrf: &str) -> Markup {
    html! {
        h1 { "Endpoint " (row.id) }
        p { (row.url) " · tenant " (row.tenant.as_deref().unwrap_or("(all)"))
            " · types " (if row.event_types.is_empty() { "(all)".to_string() } else { row.event_types.join(", ") }) }
        form method="post" action=(format!("/ui/endpoints/{}/test", urlencode(&row.id))) {
            input type="hidden" name="csrf" value=(csrf);
            button #test-send type="submit" { "Send a test event" }
            span.muted { " a signed hookline.test event, once (never retried)" }
        }
        @if row.dead > 0 {
            div.warn { "⚠ " b { (row.dead) } " dead deliveries. "
                a href=(format!("/ui/dead?endpoint={}", urlencode(&row.id))) { "See them and replay" } }
        }
        h2 { "Health" }
        table {
            tr { th { "success (1 h)" } td { (rate(&row.health)) } }
            tr { th { "last status" } td { (row.health.last_status.as_deref().unwrap_or("—")) } }
            tr { th { "last error" } td { (row.health.last_error.as_deref().unwrap_or("—")) } }
            tr { th { "failures in a row" } td { (row.health.consecutive_failures) } }
            tr { th { "failing since" } td { (row.health.failing_since.as_deref().unwrap_or("—")) } }
            tr { th { "rate limit" } td {
                @match row.settings.rate_limit {
                    Some(r) => { (r) "/s, burst " (row.settings.burst.unwrap_or(1))
                        @if row.health.throttled { " — " span.thr #throttled { "throttled" } " (deliveries are waiting for the limit)" }
                        @if row.health.throttled_last_hour > 0 { span.muted { "; " (row.health.throttled_last_hour) " attempts held back in the last hour" } } }
                    None => { span.muted { "none" } }
                } } }
            tr { th { "waiting to retry" } td { (row.health.pending_retries)
                @if let Some(at) = &row.health.oldest_pending_retry { span.muted { ", the oldest since " (at) } } } }
        }
        h2 { "Attempts per hour, last 24 h" }
        @let (delivered, failed, throttled) = row.activity.totals();
        p.muted { (delivered) " delivered, " (failed) " failed (every stage: first attempts, retries, replays, test sends), "
            (throttled) " of them throttled (held back by the rate limit first); "
            span.ok { "■" } " delivered " span.bad { "■" } " failed " span.thr { "▬" } " throttled" }
        // Per hour: past the last hour the tracker keeps hourly counts (bounded memory per endpoint).
        (chart(&row.activity, 24, 60, 720.0, 120.0, "activity", &row.id))
        div.muted style="width:720px;display:flex;justify-content:space-between" { span { "24 h ago" } span { "now" } }
        h2 { "Attempts per minute, last hour" }
        (chart(&row.activity, 60, 1, 720.0, 120.0, "activity-hour", &row.id))
        div.muted style="width:720px;display:flex;justify-content:space-between" { span { "1 h ago" } span { "30 min" } span { "now" } }
        h2 { "Recent attempts" }
        (attempt_table(attempts, "attempts"))
        h2 { "Delivery settings" }
        (settings_form(row, csrf))
    }
}

/// The header lines of the settings form: `Name: value`, and `secret Name` for a secret one
/// (its value never shown; left as it is, it is kept).
pub fn header_lines(headers: &[(String, Option<String>, bool)]) -> String {
    headers
        .iter()
        .map(|(name, value, secret)| match (secret, value) {
            (true, _) | (false, None) => format!("secret {name}"),
            (false, Some(v)) => format!("{name}: {v}"),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The endpoint's delivery settings, editable by whoever sees the endpoint (a file-managed one
/// is shown read-only: the config file owns it).
fn settings_form(row: &EndpointRow, csrf: &str) -> Markup {
    let st = &row.settings;
    let text = |v: Option<String>| v.unwrap_or_default();
    let disabled = st.file_managed;
    html! {
        @if disabled {
            p.muted { "Managed by the config file ([[endpoints]]): change it there and restart." }
        }
        form #settings method="post" action=(format!("/ui/endpoints/{}/settings", urlencode(&row.id))) {
            input type="hidden" name="csrf" value=(csrf);
            input type="hidden" name="version" value=(st.version);
            table {
                tr { th { "rate limit" } td {
                    input name="rate_limit" size="8" value=(text(st.rate_limit.map(|r| r.to_string()))) disabled[disabled];
                    " deliveries/s for the whole cluster, burst "
                    input name="burst" size="5" value=(text(st.burst.map(|b| b.to_string()))) disabled[disabled];
                    span.muted { " (empty: no limit; burst 1)" } } }
                tr { th { "payload filter" } td {
                    textarea name="filter" rows="2" cols="70" disabled[disabled] { (text(st.filter.clone())) }
                    br; span.muted { "CEL over id, type, tenant, data, e.g. data.amount > 100 && data.region.startsWith('eu-') (empty: every event)" } } }
                tr { th { "custom headers" } td {
                    textarea name="headers" rows="3" cols="70" disabled[disabled] { (header_lines(&st.headers)) }
                    br; span.muted { "one per line, Name: value; prefix secret to seal a value (secret Authorization: Bearer …); a secret line without a value keeps it. Not covered by the signature." } } }
                tr { th { "timeout" } td {
                    input name="timeout" size="8" value=(text(st.timeout.clone())) disabled[disabled];
                    span.muted { " e.g. 5s (empty: http.timeout)" } } }
                tr { th { "max concurrency" } td {
                    input name="max_concurrency" size="5" value=(text(st.max_concurrency.map(|m| m.to_string()))) disabled[disabled];
                    span.muted { " requests in flight per process (empty: the default)" } } }
            }
            @if !disabled { button #save-settings type="submit" { "Save settings" } }
        }
    }
}

/// A stacked bar chart of `activity` (delivered below, failed above), `buckets` bars of
/// `bucket_minutes` each ending now, as server-rendered SVG. The totals it draws are in
/// `data-delivered` / `data-failed` (the browser test reads them).
pub fn chart(
    activity: &Activity,
    buckets: usize,
    bucket_minutes: i64,
    width: f64,
    height: f64,
    class: &str,
    endpoint: &str,
) -> Markup {
    let bars = activity.buckets(buckets, bucket_minutes);
    let (delivered, failed, throttled) = bars
        .iter()
        .fold((0u64, 0u64, 0u64), |(d, f, t), (d2, f2, t2)| {
            (d + d2, f + f2, t + t2)
        });
    let top = bars.iter().map(|(d, f, _)| d + f).max().unwrap_or(0).max(1) as f64;
    let w = width / buckets.max(1) as f64;
    // A minute of a day-wide chart is half a pixel: a bar is drawn at least 2 px wide.
    let bw = w.max(2.0);
    let label = format!(
        "{delivered} delivered and {failed} failed attempts in the last {} h, {throttled} throttled",
        buckets as i64 * bucket_minutes / 60
    );
    html! {
        svg class=(class) data-endpoint=(endpoint) data-delivered=(delivered) data-failed=(failed)
            data-throttled=(throttled)
            width=(width) height=(height) viewBox=(format!("0 0 {width} {height}"))
            role="img" aria-label=(label) style="background:#fff;border:1px solid #e5e7eb" {
            title { (label) }
            @for (i, (d, f, t)) in bars.iter().enumerate() {
                @if d + f > 0 {
                    @let x = (i as f64 * w).min(width - bw).max(0.0);
                    @let hd = *d as f64 / top * height;
                    @let hf = *f as f64 / top * height;
                    @let ht = *t as f64 / top * height;
                    @if *d > 0 {
                        rect x=(format!("{x:.2}")) y=(format!("{:.2}", height - hd)) width=(format!("{bw:.2}"))
                            height=(format!("{hd:.2}")) fill="#15803d" {}
                    }
                    @if *f > 0 {
                        rect x=(format!("{x:.2}")) y=(format!("{:.2}", height - hd - hf)) width=(format!("{bw:.2}"))
                            height=(format!("{hf:.2}")) fill="#b91c1c" {}
                    }
                    // Throttled attempts are among those drawn: an amber band over them.
                    @if *t > 0 {
                        rect.throttled x=(format!("{x:.2}")) y=(format!("{:.2}", height - ht)) width=(format!("{bw:.2}"))
                            height=(format!("{ht:.2}")) fill="#d97706" fill-opacity="0.6" {}
                    }
                }
            }
        }
    }
}

fn attempt_table(attempts: &[AttemptRow], id: &str) -> Markup {
    html! {
        @if attempts.is_empty() { p.muted { "No attempts recorded." } }
        @else {
            table id=(id) {
                tr { th { "time" } th { "event" } th { "attempt" } th { "by" } th { "result" } th { "duration" } th { "then" } }
                @for a in attempts {
                    tr {
                        td { (a.at) }
                        td { (a.event_id) }
                        td { (a.attempt) }
                        td { (a.stage) }
                        td { @if a.outcome == "delivered" { span.ok { (a.status) } } @else { span.bad { (a.status) } } }
                        td { (a.duration_ms) " ms" }
                        td { (a.next) }
                    }
                }
            }
        }
    }
}

pub fn dead_list(page: &DeadPage, filter: &DeadFilter, csrf: &str) -> Markup {
    let f = |v: &Option<String>| v.clone().unwrap_or_default();
    html! {
        h1 { "Dead deliveries" }
        p.help { (DEAD_HELP) }
        form method="get" action="/ui/dead" {
            "endpoint " input name="endpoint" value=(f(&filter.endpoint)) size="16";
            " type " input name="type" value=(f(&filter.event_type)) size="16" placeholder="order.*";
            " tenant " input name="tenant" value=(f(&filter.tenant)) size="12";
            " " input type="submit" value="Filter";
        }
        @if page.rows.is_empty() { p.muted #no-dead { "No dead deliveries match." } }
        @else {
            form method="post" action="/ui/dead/replay" onsubmit="return confirm('Replay every dead delivery matching this filter?')" {
                input type="hidden" name="csrf" value=(csrf);
                input type="hidden" name="endpoint" value=(f(&filter.endpoint));
                input type="hidden" name="type" value=(f(&filter.event_type));
                input type="hidden" name="tenant" value=(f(&filter.tenant));
                p { button #replay-all type="submit" { "Replay all matching" } }
            }
            table #dead {
                tr { th { "position" } th { "dead at" } th { "endpoint" } th { "event" } th { "type" } th { "tenant" }
                     th { "reason" } th { "attempts" } th { "last error" } th { "replayed" } }
                @for r in &page.rows { (dead_row(r)) }
            }
            @if let Some(c) = &page.next_cursor {
                p { a #next href=(next_link(filter, c)) { "Next page →" } }
            }
        }
    }
}

fn dead_row(r: &DeadRow) -> Markup {
    html! {
        tr data-position=(r.position) {
            td { a href=(format!("/ui/dead/{}", urlencode(&r.position))) { (r.position) } }
            td { (r.dead_at) }
            td { (r.endpoint) }
            td { (r.event_id) }
            td { (r.event_type) }
            td { (r.tenant.as_deref().unwrap_or("—")) }
            td { (r.reason) }
            td { (r.attempts) }
            td.bad { (r.last_error) }
            td { (r.replayed.as_deref().unwrap_or("—")) }
        }
    }
}

fn next_link(filter: &DeadFilter, cursor: &str) -> String {
    page_link(
        "/ui/dead",
        cursor,
        &[
            ("endpoint", &filter.endpoint),
            ("type", &filter.event_type),
            ("tenant", &filter.tenant),
        ],
    )
}

/// `path` with the next page's `cursor` and the filters that are set, URL-encoded.
fn page_link(path: &str, cursor: &str, filters: &[(&str, &Option<String>)]) -> String {
    let mut q = vec![format!("cursor={}", urlencode(cursor))];
    for (k, v) in filters {
        if let Some(v) = v {
            q.push(format!("{k}={}", urlencode(v)));
        }
    }
    format!("{path}?{}", q.join("&"))
}

pub fn dead_one(d: &DeadDetail, csrf: &str) -> Markup {
    html! {
        h1 { "Dead delivery " (d.row.position) }
        p.help { (DEAD_HELP) }
        table {
            tr { th { "event" } td #event-id { (d.row.event_id) } }
            tr { th { "type" } td { (d.row.event_type) } }
            tr { th { "tenant" } td { (d.row.tenant.as_deref().unwrap_or("—")) } }
            tr { th { "endpoint" } td { (d.row.endpoint) } }
            tr { th { "dead at" } td { (d.row.dead_at) } }
            tr { th { "reason" } td { (d.row.reason) } }
            tr { th { "replayed" } td #replayed { (d.row.replayed.as_deref().unwrap_or("not yet")) } }
        }
        form method="post" action=(format!("/ui/dead/{}/replay", urlencode(&d.row.position))) {
            input type="hidden" name="csrf" value=(csrf);
            p { button #replay type="submit" { "Replay" } " " span.muted { "sends it once more, now" } }
        }
        h2 { "Attempts" }
        (attempt_table(&d.history, "history"))
        h2 { "Body (start)" }
        pre { (d.body_preview) }
    }
}

pub fn replayed(outcome: &ReplayOutcome, back: &str) -> Markup {
    html! {
        h1 { "Replay" }
        p #replay-summary {
            (outcome.selected) " selected: " (outcome.delivered) " delivered, " (outcome.failed) " failed again, "
            (outcome.already_replayed) " already replayed, " (outcome.skipped) " skipped."
        }
        @if outcome.failed > 0 { p.bad { "What failed again is a new dead delivery; it can be replayed later." } }
        pre { @for l in &outcome.lines { (l) "\n" } }
        p { a href=(back) { "← back" } }
    }
}

pub fn test_sent(o: &TestSendOutcome) -> Markup {
    let back = format!("/ui/endpoints/{}", urlencode(&o.endpoint_id));
    let status = o
        .status
        .map_or_else(|| "no response".to_string(), |s| format!("status {s}"));
    html! {
        h1 { "Test send to " (o.endpoint_id) }
        @if o.delivered {
            p #test-result { span.ok { "Delivered" } ": test event " (o.event_id) ", " (status) ", " (o.duration_ms) " ms." }
        } @else {
            p #test-result { span.bad { "Failed (" (o.failure_class.as_deref().unwrap_or("unknown")) ")" } ": test event " (o.event_id) ", " (status) ", " (o.duration_ms) " ms." }
            @if let Some(d) = o.detail.as_deref().filter(|d| !d.is_empty()) { pre { (d) } }
        }
        p { a href=(back) { "← back to the endpoint" } }
    }
}

pub fn problem(message: &str) -> Markup {
    html! { h1 { "Not available" } p.bad #problem { (message) } p { a href="/" { "← endpoints" } } }
}

/// Percent-encodes everything but unreserved characters (RFC 3986).
pub fn urlencode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn everything_interpolated_is_escaped() {
        let row = EndpointRow {
            id: "<script>x</script>".into(),
            url: "https://e.example/\"><img>".into(),
            dead: 2,
            ..EndpointRow::default()
        };
        let page = EndpointPage {
            rows: vec![row],
            next_cursor: Some("<b>next".into()),
        };
        let filter = EndpointFilter {
            url_prefix: Some("\"><i>".into()),
            ..EndpointFilter::default()
        };
        let html = endpoints(&page, &filter).into_string();
        assert!(!html.contains("<script>x"), "{html}");
        assert!(!html.contains("\"><img>"), "{html}");
        assert!(
            !html.contains("\"><i>") && !html.contains("<b>next"),
            "{html}"
        );
        assert!(html.contains("&lt;script&gt;"));
        assert!(html.contains("2</b> dead deliveries"), "{html}");
    }

    #[test]
    fn the_chart_draws_each_minute_in_its_bucket_and_totals_what_it_draws() {
        let a = Activity {
            now_minute: 1_000,
            // 24 h ago exactly is outside; the current minute and one an hour ago are in.
            minutes: vec![(1_000 - 1_440, 9, 9, 0), (940, 2, 1, 0), (1_000, 3, 0, 2)],
        };
        let hourly = a.buckets(24, 60);
        assert_eq!(hourly.len(), 24);
        assert_eq!(hourly[23], (3, 0, 2), "the current hour");
        assert_eq!(hourly[22], (2, 1, 0), "the hour before");
        assert_eq!(hourly.iter().map(|(d, f, _)| d + f).sum::<u64>(), 6);
        let svg = chart(&a, 24 * 60, 1, 720.0, 120.0, "activity", "e<1>").into_string();
        assert!(
            svg.contains("data-delivered=\"5\" data-failed=\"1\" data-throttled=\"2\""),
            "{svg}"
        );
        assert_eq!(svg.matches("<rect").count(), 4, "{svg}");
        assert_eq!(svg.matches("class=\"throttled\"").count(), 1, "{svg}");
        assert!(svg.contains("data-endpoint=\"e&lt;1&gt;\""), "{svg}");
        let empty = chart(&Activity::default(), 24, 60, 96.0, 20.0, "trend", "x").into_string();
        assert!(!empty.contains("<rect"), "{empty}");
    }

    #[test]
    fn urlencode_keeps_unreserved_only() {
        assert_eq!(urlencode("a b/c?d=é"), "a%20b%2Fc%3Fd%3D%C3%A9");
        assert_eq!(urlencode("0-12"), "0-12");
    }
}
