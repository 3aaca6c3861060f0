//! The dashboard in real headless Chromium (Debian's `chromium` + `chromium-driver`, installed by
//! `.ci/run`), driven over WebDriver with `fantoccini`: sign in with a tenant token, see the
//! dead-delivery warning on the failing endpoint, open its dead letter, click Replay, and the
//! receiver gets the delivery; send a test event from the endpoint page and see it delivered; the
//! tenant does not see another tenant's endpoint. Screenshots go
//! to `target/screenshots/`.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;

use crate::admin::{admin_section, Admin, ACME_TOKEN, ADMIN_TOKEN};
use crate::harness::*;
use crate::receiver::{Behavior, Receiver};

/// chromedriver on a free loopback port, killed on drop.
struct Driver {
    child: Child,
    url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn chromedriver() -> Driver {
    let bin = std::env::var("HOOKLINE_TEST_CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".into());
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let child = Command::new(&bin)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot start `{bin}` ({e}): the browser test needs Debian's chromium and \
                 chromium-driver (`apt-get install chromium chromium-driver`; .ci/run installs them)"
            )
        });
    Driver {
        child,
        url: format!("http://127.0.0.1:{port}"),
    }
}

async fn browser(driver: &Driver) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,1000"]
        }),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match ClientBuilder::native()
            .capabilities(caps.clone())
            .connect(&driver.url)
            .await
        {
            Ok(c) => return c,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!(
                "no webdriver session from chromedriver at {}: {e}",
                driver.url
            ),
        }
    }
}

async fn screenshot(c: &Client, name: &str) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/screenshots");
    std::fs::create_dir_all(&dir).expect("screenshot dir");
    let png = c.screenshot().await.expect("screenshot");
    std::fs::write(dir.join(format!("{name}.png")), png).expect("screenshot written");
}

async fn text_of(c: &Client, css: &str) -> String {
    c.wait()
        .at_most(Duration::from_secs(30))
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("`{css}` on the page: {e}"))
        .text()
        .await
        .expect("text")
}

/// The text of `css` once `done` accepts it, polling for 30 s: after a click that submits a form,
/// the old page's element may be found first and go stale as the new page loads. Returns the last
/// text seen (the caller's assertion names what it was).
async fn text_when(c: &Client, css: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    loop {
        if let Ok(el) = c.find(Locator::Css(css)).await {
            if let Ok(text) = el.text().await {
                if done(&text) {
                    return text;
                }
                last = text;
            }
        }
        if std::time::Instant::now() >= deadline {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_signs_in_sees_the_dead_warning_and_replays_from_the_browser() {
    require_kafka();
    let driver = chromedriver();
    let rx = Receiver::start().await;
    rx.default("acme", Behavior::Status(500));
    let prefix = unique_prefix("browser");
    let config = test_config(
        &prefix,
        &format!(
            "[retry]\nschedule = [\"0s\"]\n{}\
             [[endpoints]]\nid = \"acme-orders\"\nurl = \"{}\"\ntenant = \"acme\"\n\
             [[endpoints]]\nid = \"globex-billing\"\nurl = \"{}\"\ntenant = \"globex\"\n",
            admin_section(),
            rx.url("acme"),
            rx.url("globex")
        ),
    );
    apply_topics(&config).await;
    let stages = [start_deduper(&config), start_dispatcher(&config)];
    let admin = Admin::start(&config).await;
    let published = reqwest::Client::new()
        .post(admin.url("/v1/events"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"type": "order.paid", "tenant": "acme", "data": {"order": 7}}))
        .send()
        .await
        .expect("published");
    assert_eq!(published.status(), reqwest::StatusCode::ACCEPTED);
    rx.wait_for("acme", 1, Duration::from_secs(60)).await;

    let c = browser(&driver).await;
    // Sign in with acme's token.
    c.goto(&admin.url("/")).await.expect("open");
    c.wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::Id("token"))
        .await
        .expect("redirected to the login page")
        .send_keys(ACME_TOKEN)
        .await
        .expect("type the token");
    c.find(Locator::Id("sign-in"))
        .await
        .expect("sign-in button")
        .click()
        .await
        .expect("sign in");

    // The warning appears once the dead letter is on the DLQ (reload until then).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if c.find(Locator::Css("div.warn[data-endpoint='acme-orders']"))
            .await
            .is_ok()
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no dead-delivery warning for acme-orders"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        c.refresh().await.expect("reload");
    }
    screenshot(&c, "1-endpoints-with-dead-warning").await;
    let page = c.source().await.expect("source");
    assert!(page.contains("acme-orders"));
    assert!(
        !page.contains("globex"),
        "a tenant token never sees another tenant's endpoint"
    );
    assert!(page.contains("signed in: tenant acme"));
    // Another tenant's endpoint page is not found.
    c.goto(&admin.url("/ui/endpoints/globex-billing"))
        .await
        .expect("open");
    assert!(text_of(&c, "#problem").await.contains("no such item"));

    // Follow the warning to the dead letters, open the one, replay it.
    c.goto(&admin.url("/")).await.expect("open");
    c.find(Locator::Css("div.warn[data-endpoint='acme-orders'] a"))
        .await
        .expect("warning link")
        .click()
        .await
        .expect("follow");
    c.wait()
        .at_most(Duration::from_secs(30))
        .for_element(Locator::Css("table#dead tr[data-position] a"))
        .await
        .expect("a dead letter row")
        .click()
        .await
        .expect("open it");
    assert_eq!(text_of(&c, "#replayed").await, "not yet");
    assert!(c
        .source()
        .await
        .expect("source")
        .contains("Replay sends it once more"));
    screenshot(&c, "2-dead-letter").await;
    rx.default("acme", Behavior::Status(204));
    c.find(Locator::Id("replay"))
        .await
        .expect("Replay button")
        .click()
        .await
        .expect("click Replay");
    let summary = text_of(&c, "#replay-summary").await;
    assert!(summary.contains("1 delivered"), "{summary}");
    screenshot(&c, "3-replayed").await;
    let got = rx.wait_for("acme", 2, Duration::from_secs(30)).await;
    assert_eq!(got.len(), 2, "the failed attempt, then the replay");
    assert_eq!(
        got[0].headers.get("webhook-id"),
        got[1].headers.get("webhook-id")
    );

    // The endpoint's page sends a test event (the receiver answers 204 now).
    c.goto(&admin.url("/ui/endpoints/acme-orders"))
        .await
        .expect("open");
    c.find(Locator::Id("test-send"))
        .await
        .expect("test send button")
        .click()
        .await
        .expect("click Send a test event");
    let result = text_of(&c, "#test-result").await;
    assert!(
        result.contains("Delivered") && result.contains("status 204"),
        "{result}"
    );
    screenshot(&c, "4-test-send").await;
    let got = rx.wait_for("acme", 3, Duration::from_secs(30)).await;
    let test: serde_json::Value = serde_json::from_slice(&got[2].body).expect("json body");
    assert_eq!(test["type"], "hookline.test", "{test}");

    // The endpoint's chart draws exactly the attempts made: the failed first attempt, the
    // replay and the test send (reload until the delivery log has them all).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        c.goto(&admin.url("/ui/endpoints/acme-orders"))
            .await
            .expect("open");
        let chart = c
            .find(Locator::Css("svg.activity[data-endpoint='acme-orders']"))
            .await
            .expect("the endpoint's chart");
        let delivered = chart.attr("data-delivered").await.expect("attr");
        let failed = chart.attr("data-failed").await.expect("attr");
        if (delivered.as_deref(), failed.as_deref()) == (Some("2"), Some("1")) {
            let bars = c
                .find_all(Locator::Css("svg.activity rect"))
                .await
                .expect("bars");
            assert!(!bars.is_empty(), "bars drawn");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "chart totals {delivered:?} delivered / {failed:?} failed, expected 2 / 1"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    screenshot(&c, "5-endpoint-chart").await;
    c.goto(&admin.url("/")).await.expect("open");
    let trend = c
        .find(Locator::Css("svg.trend[data-endpoint='acme-orders']"))
        .await
        .expect("the endpoint's trend in the list");
    assert_eq!(
        (
            trend.attr("data-delivered").await.expect("attr").as_deref(),
            trend.attr("data-failed").await.expect("attr").as_deref()
        ),
        (Some("2"), Some("1"))
    );

    // A file-managed endpoint's settings are shown, not editable.
    c.goto(&admin.url("/ui/endpoints/acme-orders"))
        .await
        .expect("open");
    assert!(c.find(Locator::Id("save-settings")).await.is_err());

    // An endpoint made through the API: its tenant changes its settings from its page.
    let made = reqwest::Client::new()
        .post(admin.url("/v1/endpoints"))
        .bearer_auth(ACME_TOKEN)
        .json(&json!({"id": "acme-api", "url": rx.url("acme-api")}))
        .send()
        .await
        .expect("created");
    assert_eq!(made.status(), reqwest::StatusCode::CREATED);
    let settings_page = admin.url("/ui/endpoints/acme-api");
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.goto(&settings_page).await.is_err() || c.find(Locator::Id("settings")).await.is_err() {
        assert!(Instant::now() < deadline, "the new endpoint's page");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let fill = |name: &'static str, value: &'static str| {
        let c = c.clone();
        async move {
            let field = c
                .find(Locator::Css(&format!("#settings [name='{name}']")))
                .await
                .unwrap_or_else(|e| panic!("field {name}: {e}"));
            field.clear().await.expect("clear");
            field.send_keys(value).await.expect("type");
        }
    };
    fill("rate_limit", "25").await;
    fill("burst", "3").await;
    fill("filter", "data.order > 5").await;
    fill("headers", "X-Team: core\nsecret Authorization: Bearer t0k").await;
    c.find(Locator::Id("save-settings"))
        .await
        .expect("save button")
        .click()
        .await
        .expect("click Save settings");
    screenshot(&c, "6-settings-saved").await;
    let shown = c
        .find(Locator::Css("#settings [name='rate_limit']"))
        .await
        .expect("back on the page")
        .prop("value")
        .await
        .expect("value");
    assert_eq!(shown.as_deref(), Some("25"));
    let headers = text_of(&c, "#settings [name='headers']").await;
    assert!(
        headers.contains("X-Team: core") || headers.contains("x-team: core"),
        "{headers}"
    );
    assert!(
        !headers.contains("t0k"),
        "a secret value is never shown: {headers}"
    );
    let api: serde_json::Value = reqwest::Client::new()
        .get(admin.url("/v1/endpoints/acme-api"))
        .bearer_auth(ACME_TOKEN)
        .send()
        .await
        .expect("read")
        .json()
        .await
        .expect("json");
    assert_eq!(
        (&api["rate_limit"], &api["burst"], &api["filter"]),
        (&json!(25.0), &json!(3), &json!("data.order > 5")),
        "{api}"
    );
    assert_eq!(
        api["headers"],
        json!([{"name": "x-team", "value": "core", "secret": false},
               {"name": "authorization", "value": null, "secret": true}])
    );
    // Saving again with the secret line as shown keeps its value; a bad filter names the field.
    fill("filter", "data.order >").await;
    c.find(Locator::Id("save-settings"))
        .await
        .expect("save button")
        .click()
        .await
        .expect("click Save settings");
    let error = text_when(&c, "body", |t| t.contains("at 1:")).await;
    assert!(
        error.contains("filter") && error.contains("at 1:"),
        "{error}"
    );

    c.close().await.expect("close the browser");
    admin.stop().await;
    for s in stages {
        s.stop().await.expect("clean stop");
    }
}
