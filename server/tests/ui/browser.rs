//! The UI in a real browser: headless Chromium driven through chromedriver (WebDriver,
//! fantoccini) against a real server and a real agent on loopback port 0.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`.ci/run` installs them). Without them
//! the test says so and passes, unless `LEVEE_REQUIRE_BROWSER=1` (set by `.ci/run`), when it
//! fails. With `LEVEE_SCREENSHOTS=<dir>` it saves screenshots of the main pages there
//! (docs/screenshots/ holds the committed ones).

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use levee_agent::{Agent, SyncClientSettings};
use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::helpers::{PASSWORD, SERVICE, TestApp};

/// Longest wait for anything the browser should see.
const WAIT: Duration = Duration::from_secs(20);

fn find_binary(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/lib/chromium")])
        .flat_map(|dir| names.iter().map(move |n| dir.join(n)))
        .find(|p| p.is_file())
}

/// chromedriver on a free loopback port; killed on drop.
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

/// The driver and browser, or `None` when they are not installed (a failure when
/// `LEVEE_REQUIRE_BROWSER=1`).
async fn browser() -> Option<(Driver, Client)> {
    let required = std::env::var("LEVEE_REQUIRE_BROWSER").is_ok_and(|v| v == "1");
    let (Some(driver), Some(chromium)) =
        (find_binary(&["chromedriver"]), find_binary(&["chromium", "chromium-browser", "google-chrome"]))
    else {
        assert!(!required, "LEVEE_REQUIRE_BROWSER=1 but chromium or chromedriver is not installed");
        eprintln!(
            "SKIPPED: chromium and chromedriver are not installed (apt-get install chromium chromium-driver)"
        );
        return None;
    };
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = Command::new(driver)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver starts");
    let driver = Driver { child, url: format!("http://127.0.0.1:{port}") };
    let caps: serde_json::Map<String, serde_json::Value> = serde_json::from_value(json!({
        "goog:chromeOptions": {
            "binary": chromium,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1400,1100", "--lang=en"]
        }
    }))
    .unwrap();
    let start = tokio::time::Instant::now();
    loop {
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        match ClientBuilder::new(connector).capabilities(caps.clone()).connect(&driver.url).await {
            Ok(c) => return Some((driver, c)),
            Err(e) => {
                assert!(start.elapsed() < WAIT, "chromedriver did not answer: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn screenshot(c: &Client, name: &str) {
    let Some(dir) = std::env::var_os("LEVEE_SCREENSHOTS") else { return };
    c.execute("window.scrollTo(0, 0);", vec![]).await.unwrap();
    let png = c.screenshot().await.expect("screenshot");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(PathBuf::from(dir).join(format!("{name}.png")), png).unwrap();
}

/// Waits until `probe` returns `Some`, polling the page.
async fn until<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = tokio::time::Instant::now();
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(start.elapsed() < WAIT, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The page's text, once the page after a navigation has settled.
async fn body(c: &Client) -> String {
    until("the page's text", || async {
        let ready = c.execute("return document.readyState;", vec![]).await.ok()?;
        if ready != json!("complete") {
            return None;
        }
        c.find(Locator::Css("body")).await.ok()?.text().await.ok()
    })
    .await
}

async fn login(c: &Client, base: &str, user: &str, password: &str) {
    c.goto(&format!("{base}/login")).await.unwrap();
    c.find(Locator::Css("input[name=username]")).await.unwrap().send_keys(user).await.unwrap();
    c.find(Locator::Css("input[name=password]")).await.unwrap().send_keys(password).await.unwrap();
    c.find(Locator::Css("form[action='/login'] button[type=submit]")).await.unwrap().click().await.unwrap();
    until("the login to land", || async {
        let url = c.current_url().await.ok()?;
        (!url.path().starts_with("/login")).then_some(())
    })
    .await;
}

/// The element `css` once the current page has loaded and holds it (pages change under a
/// click: a find right after it could see the old one).
async fn wait_find(c: &Client, css: &str) -> fantoccini::elements::Element {
    until(css, || async {
        let ready = c.execute("return document.readyState;", vec![]).await.ok()?;
        if ready != json!("complete") {
            return None;
        }
        c.find(Locator::Css(css)).await.ok()
    })
    .await
}

async fn fill(c: &Client, css: &str, text: &str) {
    let e = wait_find(c, css).await;
    e.clear().await.unwrap();
    e.send_keys(text).await.unwrap();
}

/// Clicks `css` and waits for the page it leads to (the old page's body goes stale).
async fn click(c: &Client, css: &str) {
    let old = c.find(Locator::Css("body")).await.unwrap();
    wait_find(c, css).await.click().await.unwrap();
    until("the next page", || async { old.text().await.is_err().then_some(()) }).await;
}

/// A real agent of prod/checkout (instance `checkout-web-1`), with its token minted through
/// the API and its cache in `cache`; it reports its status every 200 ms.
async fn checkout_agent(app: &TestApp, cache: &tempfile::TempDir) -> Agent {
    checkout_agent_named(app, cache.path(), "checkout-web-1").await
}

/// [`checkout_agent`] as instance `name`, its cache in `cache`.
async fn checkout_agent_named(app: &TestApp, cache: &std::path::Path, name: &str) -> Agent {
    Agent::builder(&app.grpc, &app.agent_token("checkout").await, "prod", "checkout")
        .cache_dir(cache)
        .instance_name(name)
        .sync_settings(SyncClientSettings {
            backoff_base: Duration::from_millis(50),
            backoff_cap: Duration::from_millis(300),
            reconnect_jitter: Duration::from_millis(50),
            status_interval: Duration::from_millis(200),
            min_report_gap: Duration::from_millis(50),
            ..SyncClientSettings::default()
        })
        .build()
        .expect("agent builds")
}

/// Opens the agent's breaker of `recommendations` with calls that fail (more than its
/// minimum calls, all failures).
async fn open_recommendations_breaker(agent: &Agent) {
    let recs = agent.dependency("recommendations");
    for _ in 0..30 {
        let _ =
            recs.call("GET /recommendations", || async { Err::<(), _>(std::io::Error::other("down")) }).await;
    }
}

/// The text of the element `css` of the page as it is now (the live parts are swapped in
/// place, so it is read again each time).
async fn text_of(c: &Client, css: &str) -> Option<String> {
    c.find(Locator::Css(css)).await.ok()?.text().await.ok()
}

/// The `changed` revision of the service page the browser was redirected to after a change.
async fn changed_revision(c: &Client) -> u64 {
    until("the redirect to the service page", || async {
        let url = c.current_url().await.ok()?;
        url.query_pairs().find(|(k, _)| k == "changed").and_then(|(_, v)| v.parse().ok())
    })
    .await
}

/// The incident, played: recommendations fails and its breaker opens on the agent. The
/// landing page shows it without a reload, with the levers that apply; the first click
/// opens the lever's confirmation, a reason and the second click switch recommendations
/// off; the agent stops calling it, and the service page says the breaker is frozen
/// rather than showing a live red OPEN.
#[tokio::test]
async fn browser_alarm_to_lever_to_confirmation_to_applied_in_two_clicks() {
    let Some((_driver, c)) = browser().await else { return };
    let app = TestApp::spawn().await;
    app.seed().await;
    app.user("olivia", "operator").await;
    let cache = tempfile::tempdir().unwrap();
    let agent = checkout_agent(&app, &cache).await;
    let switch = agent.flag_bool("recommendations.enabled", true);
    agent.wait_for_initial_sync(WAIT).await.expect("initial sync");
    let base = app.base.clone();

    login(&c, &base, "olivia", PASSWORD).await;
    assert_eq!(c.current_url().await.unwrap().path(), "/", "the landing page");
    c.execute("window.leveeMark = 'no reload';", vec![]).await.unwrap();
    open_recommendations_breaker(&agent).await;
    let alarm = until("the open breaker on the landing page", || async {
        let t = text_of(&c, "#on-fire").await?;
        t.contains("breaker recommendations is OPEN on 1 of 1 connected agents").then_some(t)
    })
    .await;
    assert!(alarm.contains("switch recommendations off (recommendations.enabled)…"), "{alarm}");
    assert!(alarm.contains("force the breaker of recommendations open for 1h…"), "{alarm}");
    let mark = c.execute("return window.leveeMark || null;", vec![]).await.unwrap();
    assert_eq!(mark, json!("no reload"), "the alarm appeared without reloading the page");
    screenshot(&c, "incident").await;

    // Click 1: the lever, straight to its confirmation.
    let lever = "#on-fire a.lever[href*='/flags/recommendations.enabled/confirm']";
    click(&c, lever).await;
    let confirm = body(&c).await;
    assert!(confirm.contains("Change flag recommendations.enabled"), "{confirm}");
    assert!(confirm.contains("Dependency recommendations is switched off"), "{confirm}");
    assert_eq!(app.kill_switch().await, true, "the confirmation changes nothing");
    // A reload of the confirmation shows it again.
    c.refresh().await.unwrap();
    assert!(body(&c).await.contains("Change flag recommendations.enabled"));
    screenshot(&c, "confirm").await;

    // A reason and click 2.
    fill(&c, "textarea[name=reason]", "INC-12 recommendations is failing").await;
    click(&c, "button.danger").await;
    let changed = changed_revision(&c).await;
    assert_eq!(app.kill_switch().await, false);
    until("the agent to switch recommendations off", || async { (!switch.get()).then_some(()) }).await;
    let audit = app.audit().await;
    assert_eq!(
        (audit[0]["action"].as_str(), audit[0]["via"].as_str(), audit[0]["reason"].as_str()),
        (Some("flag.set"), Some("ui"), Some("INC-12 recommendations is failing"))
    );

    // The service page: applied, the breaker frozen, not a second red alarm.
    let banner = until("the agent's ACK on the service page", || async {
        let live = c.find(Locator::Id("live")).await.ok()?;
        let applied = live.attr("data-applied").await.ok()??;
        let summary = text_of(&c, "#live-summary").await?;
        (applied == "1" && summary == format!("1 of 1 agents applied revision {changed}.")).then_some(())?;
        text_of(&c, "#on-fire").await
    })
    .await;
    assert!(banner.contains("kill switch recommendations.enabled is OFF"), "{banner}");
    assert!(banner.contains("frozen"), "{banner}");
    assert!(!banner.contains("breaker recommendations is OPEN"), "said once, with the switch: {banner}");
    let cell = text_of(&c, "tr[id='dep-recommendations'] td.breaker-now").await.unwrap();
    assert!(cell.contains("OPEN on 1 of 1 agent") && cell.contains("frozen"), "{cell}");
    assert!(cell.contains("cannot see whether it healed"), "{cell}");
    c.close().await.unwrap();
    agent.shutdown().await;
}

/// Right after a change, every status on the service page agrees, without a reload: the
/// banner never says "applied by 0 of 1" under a panel saying 1 of 1, each alarm is shown
/// once; Back shows the current revision, not the one before the change.
#[tokio::test]
async fn browser_the_service_page_agrees_with_itself_right_after_a_change() {
    let Some((_driver, c)) = browser().await else { return };
    let app = TestApp::spawn().await;
    app.seed().await;
    app.user("olivia", "operator").await;
    let cache = tempfile::tempdir().unwrap();
    let agent = checkout_agent(&app, &cache).await;
    agent.wait_for_initial_sync(WAIT).await.expect("initial sync");
    let base = app.base.clone();
    login(&c, &base, "olivia", PASSWORD).await;
    let service = format!("{base}{SERVICE}");
    c.goto(&service).await.unwrap();
    until("the agent on the service page", || async {
        text_of(&c, "#live-summary").await?.starts_with("1 of 1 agents applied").then_some(())
    })
    .await;

    click(&c, "tr[id='flag-recommendations.enabled'] button.switch").await;
    fill(&c, "textarea[name=reason]", "game day").await;
    click(&c, "button.danger").await;
    let changed = changed_revision(&c).await;
    c.execute("window.leveeMark = 'no reload';", vec![]).await.unwrap();
    let page = until("the ACK on every part of the page", || async {
        let summary = text_of(&c, "#live-summary").await?;
        let status = text_of(&c, "#change-status").await?;
        (summary == format!("1 of 1 agents applied revision {changed}.")
            && status.contains("1 of 1 connected agents have applied it"))
        .then_some(())?;
        text_of(&c, "main").await
    })
    .await;
    let mark = c.execute("return window.leveeMark || null;", vec![]).await.unwrap();
    assert_eq!(mark, json!("no reload"));
    assert!(!page.contains("applied by only"), "no banner contradicts the panel: {page}");
    assert!(!page.contains("0 of 1"), "{page}");
    assert_eq!(page.matches("kill switch recommendations.enabled is OFF").count(), 1, "alarms once: {page}");
    screenshot(&c, "service").await;

    // Back twice: the confirmation (an address: shown again), then the page before the
    // change, which loads the current revision instead of the old one.
    c.back().await.unwrap();
    assert!(body(&c).await.contains("Change flag recommendations.enabled"));
    c.back().await.unwrap();
    until("the current revision after Back", || async {
        let t = text_of(&c, "main").await?;
        t.contains(&format!("Revision {changed}")).then_some(())
    })
    .await;
    c.close().await.unwrap();
    agent.shutdown().await;
}

/// Log in; flip a switch with a reason and see the agent's ACK appear without a reload;
/// edit a timeout, see the diff and a validation error, fix it, commit; roll back; a
/// viewer sees no way to change anything and is refused when trying.
#[tokio::test]
async fn browser_operator_flips_edits_rolls_back_and_a_viewer_cannot() {
    let Some((_driver, c)) = browser().await else { return };
    let app = TestApp::spawn().await;
    app.seed().await;
    app.user("olivia", "operator").await;
    app.user("vic", "viewer").await;
    let cache = tempfile::tempdir().unwrap();
    let agent = checkout_agent(&app, &cache).await;
    let switch = agent.flag_bool("recommendations.enabled", true);
    let base = app.base.clone();

    // Log in.
    login(&c, &base, "olivia", PASSWORD).await;
    assert!(body(&c).await.contains("olivia"));
    screenshot(&c, "overview").await;

    // The service page, once the agent is there.
    let service = format!("{base}{SERVICE}");
    c.goto(&service).await.unwrap();
    until("the agent on the service page", || async {
        let t = c.find(Locator::Id("live-summary")).await.ok()?.text().await.ok()?;
        t.starts_with("1 of 1 agents applied").then_some(())
    })
    .await;
    assert!(body(&c).await.contains("checkout-web-1-"), "the agent shows its name");

    // Flip the kill switch with a reason.
    click(&c, "tr[id='flag-recommendations.enabled'] button.switch").await;
    assert!(body(&c).await.contains("Dependency recommendations is switched off"));
    fill(&c, "textarea[name=reason]", "game day: recommendations off").await;
    click(&c, "button.danger").await;
    let changed: u64 = until("the redirect to the service page", || async {
        let url = c.current_url().await.ok()?;
        url.query_pairs().find(|(k, _)| k == "changed").and_then(|(_, v)| v.parse().ok())
    })
    .await;
    // Mark this page: a reload would lose the mark.
    c.execute("window.leveeMark = 'no reload';", vec![]).await.unwrap();
    until("the agent's ACK to appear live", || async {
        let live = c.find(Locator::Id("live")).await.ok()?;
        let rev = live.attr("data-revision").await.ok()??;
        let applied = live.attr("data-applied").await.ok()??;
        (rev == changed.to_string() && applied == "1").then_some(())
    })
    .await;
    until("the summary to follow", || async {
        (text_of(&c, "#live-summary").await? == format!("1 of 1 agents applied revision {changed}."))
            .then_some(())
    })
    .await;
    let mark = c.execute("return window.leveeMark || null;", vec![]).await.unwrap();
    assert_eq!(mark, json!("no reload"), "the ACK appeared without reloading the page");
    assert!(!switch.get(), "the agent switched recommendations off");
    assert!(body(&c).await.contains("kill switch recommendations.enabled is OFF"), "the banner says so");

    // Edit a timeout: an invalid value first, shown at its field, then a valid one.
    c.goto(&format!("{service}/policy/edit?part=dependency:payments")).await.unwrap();
    let field = "input[data-path='dependencies.payments.attempt_timeout']";
    fill(&c, field, "fast").await;
    click(&c, "#edit-form button[type=submit]").await;
    let error = wait_find(&c, "tr.invalid .field-error").await;
    assert!(error.text().await.unwrap().contains("fast"), "the error names the value");
    assert!(c.find(Locator::Id("commit-form")).await.is_err(), "nothing to commit while invalid");
    fill(&c, field, "250ms").await;
    click(&c, "#edit-form button[type=submit]").await;
    let diff = wait_find(&c, "table.diff").await.text().await.unwrap();
    assert!(diff.contains("dependencies.payments.attempt_timeout") && diff.contains("250ms"), "{diff}");
    screenshot(&c, "policy-edit").await;
    fill(&c, "#commit-form textarea[name=reason]", "payments is slow today").await;
    click(&c, "#commit-form button[type=submit]").await;
    let edited: u64 = until("the commit", || async {
        let url = c.current_url().await.ok()?;
        url.query_pairs().find(|(k, _)| k == "changed").and_then(|(_, v)| v.parse().ok())
    })
    .await;
    assert_eq!(edited, changed + 1);
    let (_, _, policy) = app.api(Method::GET, "/environments/prod/services/checkout/policy", None).await;
    assert_eq!(policy["policy"]["dependencies"]["payments"]["attempt_timeout"], "250ms");

    // Roll back to the revision before the edit.
    c.goto(&format!("{service}/history")).await.unwrap();
    screenshot(&c, "history").await;
    click(&c, &format!("#rev-{changed} form button")).await;
    assert!(body(&c).await.contains("dependencies.payments.attempt_timeout"), "the rollback shows its diff");
    fill(&c, "textarea[name=reason]", "the edit did not help").await;
    click(&c, "button.danger").await;
    let rolled: u64 = until("the rollback", || async {
        let url = c.current_url().await.ok()?;
        url.query_pairs().find(|(k, _)| k == "changed").and_then(|(_, v)| v.parse().ok())
    })
    .await;
    assert_eq!(rolled, edited + 1);
    let (_, _, policy) = app.api(Method::GET, "/environments/prod/services/checkout/policy", None).await;
    assert_eq!(policy["policy"]["dependencies"]["payments"]["attempt_timeout"], "300ms");
    c.goto(&format!("{base}/ui/environments/prod")).await.unwrap();
    screenshot(&c, "environment").await;

    // A viewer: no switch, no edit link; the edit page is refused.
    c.delete_all_cookies().await.unwrap();
    login(&c, &base, "vic", PASSWORD).await;
    c.goto(&service).await.unwrap();
    assert!(c.find(Locator::Css("button.switch")).await.is_err(), "a viewer gets no switch");
    assert!(!body(&c).await.contains("edit the policy"));
    c.goto(&format!("{service}/policy/edit")).await.unwrap();
    assert!(body(&c).await.contains("needs the operator role"), "{}", body(&c).await);
    c.close().await.unwrap();
    agent.shutdown().await;
}

/// Every page of the UI router (a `GET` route answering HTML), with the path the browser
/// opens for it in `browser_an_admin_opens_every_page_and_disables_a_user`.
/// `every_ui_page_is_opened_by_a_browser_test` keeps this list equal to the router's.
const PAGES: &[(&str, &str)] = &[
    ("/", "/"),
    ("/login", "/login"),
    ("/ui/audit", "/ui/audit"),
    ("/ui/admin", "/ui/admin"),
    ("/ui/environments/{env}", "/ui/environments/prod"),
    ("/ui/environments/{env}/services/{svc}", SERVICE),
    ("/ui/environments/{env}/profiles", "/ui/environments/prod/profiles"),
    ("/ui/environments/{env}/faults", "/ui/environments/prod/faults"),
    ("/ui/environments/{env}/scheduled", "/ui/environments/prod/scheduled"),
    ("/ui/environments/{env}/requests", "/ui/environments/prod/requests"),
    ("/ui/environments/{env}/approval-rules", "/ui/environments/prod/approval-rules"),
    ("/ui/new-environment", "/ui/new-environment"),
    ("/ui/environments/{env}/new-service", "/ui/environments/prod/new-service"),
    (
        "/ui/environments/{env}/services/{svc}/flags/{key}/delete/confirm",
        "/ui/environments/prod/services/checkout/flags/checkout.max_items/delete/confirm?revision=2",
    ),
    (
        "/ui/environments/{env}/services/{svc}/new-flag/confirm",
        "/ui/environments/prod/services/checkout/new-flag/confirm?key=beta&type=bool&value=false&description=&revision=2",
    ),
    (
        "/ui/environments/{env}/services/{svc}/policy/edit",
        "/ui/environments/prod/services/checkout/policy/edit",
    ),
    ("/ui/environments/{env}/services/{svc}/history", "/ui/environments/prod/services/checkout/history"),
    // Confirmation pages are addresses too (an alarm's levers link to them; a reload shows
    // them again). Each changes nothing.
    (
        "/ui/environments/{env}/services/{svc}/flags/{key}/confirm",
        "/ui/environments/prod/services/checkout/flags/recommendations.enabled/confirm?value=false&revision=1",
    ),
    (
        "/ui/environments/{env}/services/{svc}/breakers/confirm",
        "/ui/environments/prod/services/checkout/breakers/confirm?dependency=recommendations&state=forced_open&expires_in=1h&revision=1",
    ),
    (
        "/ui/environments/{env}/services/{svc}/breakers/remove/confirm",
        "/ui/environments/prod/services/checkout/breakers/remove/confirm?dependency=payments&operation=&revision=2",
    ),
    (
        "/ui/environments/{env}/services/{svc}/rollback/confirm",
        "/ui/environments/prod/services/checkout/rollback/confirm?to=1&revision=2",
    ),
    (
        "/ui/environments/{env}/profiles/{name}/confirm",
        "/ui/environments/prod/profiles/recs-down/confirm?for=1h",
    ),
    ("/ui/environments/{env}/rollouts/{id}", "/ui/environments/prod/rollouts/1"),
    ("/ui/environments/{env}/rollouts/{id}/confirm", "/ui/environments/prod/rollouts/1/confirm?step=abort"),
    ("/ui/environments/{env}/experiments", "/ui/environments/prod/experiments"),
    ("/ui/environments/{env}/experiments/new", "/ui/environments/prod/experiments/new?service=checkout"),
    ("/ui/environments/{env}/experiments/{id}", "/ui/environments/prod/experiments/1"),
    ("/ui/environments/{env}/experiments/{id}/stop", "/ui/environments/prod/experiments/1/stop"),
];

/// `GET` routes of the UI router that are not pages, and where a browser test uses them.
const NOT_PAGES: &[(&str, &str)] = &[
    ("/static/levee.css", "the stylesheet of every page"),
    ("/static/live.js", "the script of the service page"),
    (
        "/ui/environments/{env}/services/{svc}/live",
        "the service page's event stream: the agent's ACK appears without a reload in \
         browser_operator_flips_edits_rolls_back_and_a_viewer_cannot",
    ),
    (
        "/ui/live",
        "the overview's event stream: the alarm and its levers appear without a reload in \
         browser_alarm_to_lever_to_confirmation_to_applied_in_two_clicks",
    ),
    (
        "/ui/environments/{env}/live",
        "the environment page's event stream (the same script as the overview's)",
    ),
];

/// The `GET` routes of the UI router, read from its source (`server/src/ui/mod.rs`).
fn router_get_routes() -> Vec<String> {
    let source = include_str!("../../src/ui/mod.rs");
    let body = &source[source.find("pub fn router(").expect("the UI router")..];
    let svc = body
        .lines()
        .find_map(|l| l.trim().strip_prefix("let svc = \"")?.strip_suffix("\";"))
        .expect("the router's service path");
    // One call per `.route(`, whether rustfmt kept it on one line or not.
    let flat = body.lines().map(str::trim).collect::<Vec<_>>().join(" ");
    let mut routes = Vec::new();
    for call in flat.split(".route(").skip(1) {
        let args = call.trim_start();
        let Some(comma) = args.find(", ") else { continue };
        if !args[comma + 2..].starts_with("get(") {
            continue;
        }
        let path = &args[..comma];
        let path = if path == "svc" {
            svc.to_string()
        } else if let Some(f) = path.strip_prefix("&format!(\"").and_then(|p| p.strip_suffix("\")")) {
            f.replace("{svc}", svc).replace("{{", "{").replace("}}", "}")
        } else {
            path.trim_matches('"').to_string()
        };
        routes.push(path);
    }
    routes
}

/// A page added to the router without a browser test opening it fails here (add it to
/// `PAGES`, which the browser test opens, or to `NOT_PAGES` with where it is used).
#[test]
fn every_ui_page_is_opened_by_a_browser_test() {
    let routes = router_get_routes();
    assert!(routes.len() >= 10 && routes.iter().any(|r| r == "/ui/admin"), "the router was read: {routes:?}");
    let mut known: Vec<&str> = PAGES.iter().chain(NOT_PAGES).map(|(r, _)| *r).collect();
    known.sort_unstable();
    let mut routed: Vec<&str> = routes.iter().map(String::as_str).collect();
    routed.sort_unstable();
    assert_eq!(routed, known, "the UI router's GET routes and the pages the browser tests open");
}

/// An admin opens every page of the UI (each renders with its heading and no error), and
/// disables a user on the users page through its confirmation.
#[tokio::test]
async fn browser_an_admin_opens_every_page_and_disables_a_user() {
    let Some((_driver, c)) = browser().await else { return };
    let app = TestApp::spawn().await;
    app.seed().await;
    app.user("olivia", "operator").await;
    // What the confirmation pages confirm: a profile, and an override (revision 2).
    let (s, _, b) = app
        .api(
            Method::PUT,
            "/environments/prod/profiles/recs-down",
            Some(json!({"reason": "test", "services": {"checkout": {"flags": {"recommendations.enabled": false}}}})),
        )
        .await;
    assert!(s.is_success(), "{b}");
    let (s, _, b) = app
        .api(
            Method::PUT,
            "/environments/prod/services/checkout/breaker-overrides/payments",
            Some(json!({"state": "forced_open", "reason": "test"})),
        )
        .await;
    assert!(s.is_success(), "{b}");
    // What the rollout pages show: rollout 1, of another service (checkout stays at 2).
    start_rollout(&app, "cart").await;
    // What the experiment pages show: experiment 1 (no agent: it ends without injecting).
    let (s, _, b) = app
        .api(
            Method::POST,
            "/experiments",
            Some(json!({"reason": "test", "experiment": {
                "name": "recs-down", "environment": "prod", "service": "checkout",
                "fault": {"dependency": "recommendations", "action": {"type": "abort", "status": 503}},
                "blast_radius": {"instances": 1},
                "duration": "5s", "baseline": "0s", "recovery": "0s", "abort_after": "1s",
                "hypothesis": [{"ready": true}]}})),
        )
        .await;
    assert_eq!(b["id"], 1, "{s} {b}");
    let base = app.base.clone();
    login(&c, &base, "admin", crate::helpers::ADMIN_PASSWORD).await;
    for (route, path) in PAGES {
        c.goto(&format!("{base}{path}")).await.unwrap();
        let text = body(&c).await;
        let h1 = wait_find(&c, "h1").await.text().await.unwrap();
        assert!(!h1.is_empty(), "{route}: no heading: {text}");
        assert!(
            c.find(Locator::Css("p.error[role=alert]")).await.is_err(),
            "{route} ({path}) answered an error: {text}"
        );
    }

    c.goto(&format!("{base}/ui/admin")).await.unwrap();
    wait_find(&c, "#user-olivia select[name=state]").await.select_by_value("disabled").await.unwrap();
    click(&c, "#user-olivia button[type=submit]").await;
    let confirm = body(&c).await;
    assert!(confirm.contains("olivia is disabled: it cannot log in"), "{confirm}");
    fill(&c, "textarea[name=reason]", "left the company").await;
    click(&c, "form[action='/ui/admin/users/update'] button[type=submit]").await;
    let done = body(&c).await;
    assert!(done.contains("Changed user olivia"), "{done}");
    let (_, _, users) = app.api(Method::GET, "/users", None).await;
    assert!(
        users.as_array().unwrap().iter().any(|u| u["username"] == "olivia" && u["disabled"] == true),
        "{users}"
    );
    c.close().await.unwrap();
}

/// An operator builds an emergency profile with the form on the profiles page (no JSON:
/// a flag switched off, a breaker forced open, picked per service; a bad lever value is
/// named and the form comes back as chosen), applies it through its confirmation with a
/// reason (the agent's kill switch goes off, the service page says so), and reverts it
/// (the switch comes back on). A starter profile fills the form from the services.
#[tokio::test]
async fn browser_an_operator_applies_and_reverts_an_emergency_profile() {
    let Some((_driver, c)) = browser().await else { return };
    let app = TestApp::spawn().await;
    app.seed().await;
    app.user("olivia", "operator").await;
    let cache = tempfile::tempdir().unwrap();
    let agent = checkout_agent(&app, &cache).await;
    let switch = agent.flag_bool("recommendations.enabled", true);
    let base = app.base.clone();
    let profiles = format!("{base}/ui/environments/prod/profiles");

    login(&c, &base, "olivia", PASSWORD).await;
    c.goto(&profiles).await.unwrap();
    let page = body(&c).await;
    assert!(page.contains("No profile is active in prod."), "{page}");
    assert!(!page.contains("payments.enabled"), "no example about a flag the environment lacks: {page}");

    // A starter fills the form from the services as they are.
    click(&c, "a.starter[href*='starter=dependencies-off']").await;
    let chosen = wait_find(&c, "select[name='flag:checkout:recommendations.enabled']").await;
    assert_eq!(chosen.prop("value").await.unwrap().as_deref(), Some("false"), "non-critical switched off");
    let payments = wait_find(&c, "select[name='breaker:checkout:payments']").await;
    assert_eq!(payments.prop("value").await.unwrap().as_deref(), Some(""), "left alone");
    screenshot(&c, "profile-builder").await;

    // Build it: the switch off, the payments breaker forced open; a bad shed value first.
    c.goto(&profiles).await.unwrap();
    let build = "form[action='/ui/environments/prod/profiles/build']";
    fill(&c, &format!("{build} input[name=name]"), "recs-down").await;
    fill(&c, &format!("{build} input[name=description]"), "recommendations down").await;
    wait_find(&c, "select[name='flag:checkout:recommendations.enabled']")
        .await
        .select_by_value("false")
        .await
        .unwrap();
    wait_find(&c, "select[name='breaker:checkout:payments']")
        .await
        .select_by_value("forced_open")
        .await
        .unwrap();
    fill(&c, &format!("{build} input[name='shed:checkout']"), "150").await;
    fill(&c, &format!("{build} textarea[name=reason]"), "prepared for INC-9").await;
    click(&c, &format!("{build} button[type=submit]")).await;
    let page = body(&c).await;
    assert!(page.contains("checkout: shed: \"150\" is not a percentage from 0 to 100"), "{page}");
    let kept = wait_find(&c, "select[name='breaker:checkout:payments']").await.prop("value").await.unwrap();
    assert_eq!(kept.as_deref(), Some("forced_open"), "the form comes back as chosen");
    fill(&c, &format!("{build} input[name='shed:checkout']"), "").await;
    click(&c, &format!("{build} button[type=submit]")).await;
    let page = body(&c).await;
    assert!(page.contains("Saved profile recs-down as version 1"), "{page}");
    let profile = wait_find(&c, "#profile-recs-down").await.text().await.unwrap();
    assert!(profile.contains("checkout: flag recommendations.enabled = false"), "{profile}");
    assert!(profile.contains("checkout: breaker payments FORCED_OPEN"), "{profile}");
    let (_, _, stored) = app.api(Method::GET, "/environments/prod/profiles/recs-down", None).await;
    let stored = &stored["definition"];
    assert_eq!(
        stored["services"]["checkout"]["flags"],
        json!({"recommendations.enabled": false}),
        "{stored}"
    );
    assert_eq!(stored["description"], "recommendations down", "{stored}");

    // Apply: the confirmation says what it does and changes nothing yet.
    fill(&c, "#profile-recs-down input[name=for]", "2h").await;
    click(&c, "#profile-recs-down button[type=submit]").await;
    let confirm = body(&c).await;
    assert!(confirm.contains("Apply profile recs-down"), "{confirm}");
    assert!(confirm.contains("checkout: breaker payments FORCED_OPEN"), "{confirm}");
    assert_eq!(app.kill_switch().await, true, "nothing changes before confirming");
    fill(&c, "textarea[name=reason]", "INC-9 recommendations down").await;
    click(&c, "button.danger").await;
    let page = body(&c).await;
    assert!(page.contains("Applied profile recs-down until"), "{page}");
    assert!(page.contains("Active: recs-down (version 1)"), "{page}");
    assert_eq!(app.kill_switch().await, false);
    let (s, _, active) = app.api(Method::GET, "/environments/prod/active-profile", None).await;
    assert_eq!(s, StatusCode::OK, "{active}");
    assert_eq!(
        (active["profile"].as_str(), active["reason"].as_str()),
        (Some("recs-down"), Some("INC-9 recommendations down"))
    );
    let audit = app.audit().await;
    assert_eq!((audit[0]["action"].as_str(), audit[0]["via"].as_str()), (Some("profile.apply"), Some("ui")));
    until("the agent to switch recommendations off", || async { (!switch.get()).then_some(()) }).await;

    // The service page says which profile is active, by whom and why.
    c.goto(&format!("{base}{SERVICE}")).await.unwrap();
    let svc = body(&c).await;
    assert!(
        svc.contains("Emergency profile recs-down (version 1) is active in prod and changes this service"),
        "{svc}"
    );
    assert!(svc.contains("by olivia") && svc.contains("INC-9 recommendations down"), "{svc}");

    // Revert it.
    c.goto(&profiles).await.unwrap();
    fill(&c, "form[action='/ui/environments/prod/profiles/revert'] textarea[name=reason]", "recovered").await;
    click(&c, "form[action='/ui/environments/prod/profiles/revert'] button.danger").await;
    let page = body(&c).await;
    assert!(page.contains("Reverted profile recs-down"), "{page}");
    assert!(page.contains("No profile is active in prod."), "{page}");
    assert_eq!(app.kill_switch().await, true);
    let (s, _, _) = app.api(Method::GET, "/environments/prod/active-profile", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "no profile is active");
    until("the agent to switch recommendations back on", || async { switch.get().then_some(()) }).await;
    c.goto(&format!("{base}{SERVICE}")).await.unwrap();
    assert!(!body(&c).await.contains("Emergency profile"));
    c.close().await.unwrap();
    agent.shutdown().await;
}

/// An operator schedules a flag value a few seconds ahead; the page lists it pending, then
/// applied, and the agent gets the value.
#[tokio::test]
async fn browser_an_operator_schedules_a_flag_value_and_sees_it_applied() {
    let Some((_driver, c)) = browser().await else { return };
    let app = TestApp::spawn().await;
    app.seed().await;
    app.user("olivia", "operator").await;
    let cache = tempfile::tempdir().unwrap();
    let agent = checkout_agent(&app, &cache).await;
    let switch = agent.flag_bool("recommendations.enabled", true);
    let base = app.base.clone();
    let scheduled = format!("{base}/ui/environments/prod/scheduled");

    login(&c, &base, "olivia", PASSWORD).await;
    c.goto(&scheduled).await.unwrap();
    assert!(body(&c).await.contains("Nothing scheduled in prod."));
    let form = "form[action='/ui/environments/prod/scheduled']";
    let target = format!("{form} select[name=target]");
    wait_find(&c, &target).await.select_by_value("checkout/recommendations.enabled").await.unwrap();
    fill(&c, &format!("{form} input[name=value]"), "false").await;
    fill(&c, &format!("{form} input[name=run_in]"), "5s").await;
    fill(&c, &format!("{form} textarea[name=reason]"), "maintenance window").await;
    click(&c, &format!("{form} button[type=submit]")).await;
    // The page the form leads to was rendered right after scheduling, 5 s before it is due.
    let page = body(&c).await;
    assert!(page.contains("Scheduled change 1 for"), "{page}");
    let row = wait_find(&c, "#scheduled-1").await.text().await.unwrap();
    assert!(row.contains("checkout: flag recommendations.enabled"), "{row}");
    assert!(row.contains("pending") && row.contains("olivia") && row.contains("maintenance window"), "{row}");

    // Applied when due: the page says so once reloaded.
    let row = until("the scheduled change to be applied", || async {
        c.goto(&scheduled).await.ok()?;
        let row = wait_find(&c, "#scheduled-1").await.text().await.ok()?;
        row.contains("applied").then_some(row)
    })
    .await;
    assert!(!row.contains("pending"), "{row}");
    assert!(
        c.find(Locator::Css("#scheduled-1 form")).await.is_err(),
        "an applied change cannot be cancelled"
    );
    let (_, _, list) = app.api(Method::GET, "/environments/prod/scheduled-changes", None).await;
    assert_eq!(list[0]["state"], "applied", "{list}");
    assert_eq!(app.kill_switch().await, false);
    until("the agent to switch recommendations off", || async { (!switch.get()).then_some(()) }).await;
    c.close().await.unwrap();
    agent.shutdown().await;
}

/// An admin sets an approval rule on the approval-rules page (checkboxes and a reason,
/// audited as `approval.rules`); an operator sees the rules but no form.
async fn set_flag_approval_rule_in_the_ui(c: &Client, app: &TestApp) {
    let base = &app.base;
    login(c, base, "admin", crate::helpers::ADMIN_PASSWORD).await;
    c.goto(&format!("{base}/ui/environments/prod/approval-rules")).await.unwrap();
    let form = "form[action='/ui/environments/prod/approval-rules']";
    wait_find(c, &format!("{form} input[name=flag]")).await.click().await.unwrap();
    fill(c, &format!("{form} textarea[name=reason]"), "four eyes in prod").await;
    click(c, &format!("{form} button[type=submit]")).await;
    let page = body(c).await;
    assert!(page.contains("Saved: flag changes need an approved change request"), "{page}");
    let (s, _, rules) = app.api(Method::GET, "/environments/prod/approval-rules", None).await;
    assert_eq!(s, StatusCode::OK, "{rules}");
    assert_eq!(rules["kinds"], json!(["flag"]), "{rules}");
    let (_, _, audit) = app.api(Method::GET, "/audit?environment=prod&action=approval.rules", None).await;
    assert_eq!(
        (audit[0]["actor"].as_str(), audit[0]["via"].as_str(), audit[0]["reason"].as_str()),
        (Some("admin"), Some("ui"), Some("four eyes in prod")),
        "{audit}"
    );
    c.delete_all_cookies().await.unwrap();
}

/// Four eyes: an admin requires approval for flags in the UI; olivia proposes a flip,
/// choosing the flag from a list (a refused form comes back as typed), cannot approve it
/// herself, rita approves it in her own session, olivia applies it and the flag changes.
#[tokio::test]
async fn browser_a_change_request_is_proposed_approved_by_another_user_and_applied() {
    let Some((_driver, c)) = browser().await else { return };
    let app = TestApp::spawn().await;
    app.seed().await;
    set_flag_approval_rule_in_the_ui(&c, &app).await;
    app.user("olivia", "operator").await;
    app.user("rita", "operator").await;
    let cache = tempfile::tempdir().unwrap();
    let agent = checkout_agent(&app, &cache).await;
    let switch = agent.flag_bool("recommendations.enabled", true);
    let base = app.base.clone();
    let requests = format!("{base}/ui/environments/prod/requests");
    let request = || async {
        let (s, _, r) = app.api(Method::GET, "/environments/prod/change-requests/1", None).await;
        assert_eq!(s, StatusCode::OK, "{r}");
        r
    };

    // olivia proposes.
    login(&c, &base, "olivia", PASSWORD).await;
    c.goto(&requests).await.unwrap();
    let page = body(&c).await;
    assert!(page.contains("these changes need an approved request: flag"), "{page}");
    let form = "form[action='/ui/environments/prod/requests']";
    let target = format!("{form} select[name=target]");
    wait_find(&c, &target).await.select_by_value("checkout/recommendations.enabled").await.unwrap();
    // A value the flag's type refuses: the form comes back as it was typed.
    fill(&c, &format!("{form} input[name=value]"), "maybe").await;
    fill(&c, &format!("{form} textarea[name=reason]"), "INC-5 recommendations down").await;
    click(&c, &format!("{form} button[type=submit]")).await;
    let page = body(&c).await;
    assert!(page.contains("must be a bool value"), "{page}");
    let chosen = wait_find(&c, &target).await.prop("value").await.unwrap();
    assert_eq!(chosen.as_deref(), Some("checkout/recommendations.enabled"), "the flag stays chosen");
    let reason = wait_find(&c, &format!("{form} textarea[name=reason]")).await.prop("value").await.unwrap();
    assert_eq!(reason.as_deref(), Some("INC-5 recommendations down"), "the reason is kept");
    fill(&c, &format!("{form} input[name=value]"), "false").await;
    click(&c, &format!("{form} button[type=submit]")).await;
    assert!(body(&c).await.contains("Proposed change request 1"));
    let card = wait_find(&c, "#request-1").await.text().await.unwrap();
    assert!(card.contains("open") && card.contains("INC-5 recommendations down"), "{card}");
    assert!(
        c.find(Locator::Css("#request-1 button[value=approve]")).await.is_err(),
        "no approve button for the proposer"
    );
    assert!(
        c.find(Locator::Css("#request-1 button[value=apply]")).await.is_err(),
        "nothing to apply before approval"
    );
    let r = request().await;
    assert_eq!((r["state"].as_str(), r["proposed_by"].as_str()), (Some("open"), Some("olivia")), "{r}");
    assert_eq!(app.kill_switch().await, true);

    // rita approves, in her own session.
    c.delete_all_cookies().await.unwrap();
    login(&c, &base, "rita", PASSWORD).await;
    c.goto(&requests).await.unwrap();
    fill(&c, "#request-1 input[name=reason]", "checked the dashboards").await;
    click(&c, "#request-1 button[value=approve]").await;
    assert!(body(&c).await.contains("Change request 1 is approved"));
    let card = wait_find(&c, "#request-1").await.text().await.unwrap();
    assert!(card.contains("Approved by rita"), "{card}");
    let r = request().await;
    assert_eq!((r["state"].as_str(), r["approved_by"].as_str()), (Some("approved"), Some("rita")), "{r}");
    assert_eq!(app.kill_switch().await, true, "approving does not apply");

    // olivia applies it.
    c.delete_all_cookies().await.unwrap();
    login(&c, &base, "olivia", PASSWORD).await;
    c.goto(&requests).await.unwrap();
    fill(&c, "#request-1 input[name=reason]", "go").await;
    click(&c, "#request-1 button[value=apply]").await;
    assert!(body(&c).await.contains("Change request 1 is applied"));
    let card = wait_find(&c, "#request-1").await.text().await.unwrap();
    assert!(card.contains("applied"), "{card}");
    assert!(c.find(Locator::Css("#request-1 form")).await.is_err(), "an applied request takes no decision");
    let r = request().await;
    assert_eq!((r["state"].as_str(), r["applied_by"].as_str()), (Some("applied"), Some("olivia")), "{r}");
    assert_eq!(app.kill_switch().await, false);
    until("the agent to switch recommendations off", || async { (!switch.get()).then_some(()) }).await;
    c.close().await.unwrap();
    agent.shutdown().await;
}

/// Four eyes from the lever: under a flag approval rule, the kill switch's confirmation
/// says the change needs approval and offers, with the reason typed once, to propose it
/// (a change request pre-filled from the flip, on the landing page as waiting) or to break
/// the glass (applied at once, audited as the flip and as `approval.bypass`). A flip
/// confirmed just before the rule came in is refused onto the same page, reason kept,
/// and the refusal is in the audit log.
#[tokio::test]
async fn browser_a_refused_flip_becomes_a_change_request_or_a_break_glass_change() {
    let Some((_driver, c)) = browser().await else { return };
    let app = TestApp::spawn().await;
    app.seed().await;
    app.user("olivia", "operator").await;
    let base = app.base.clone();
    let confirm_url = format!("{base}{SERVICE}/flags/recommendations.enabled/confirm?value=false&revision=1");

    // The confirmation is open when the rule comes in: confirming is refused, not lost.
    login(&c, &base, "olivia", PASSWORD).await;
    c.goto(&confirm_url).await.unwrap();
    assert!(c.find(Locator::Id("approval-needed")).await.is_err(), "no rule yet: {}", body(&c).await);
    fill(&c, "textarea[name=reason]", "INC-7 recommendations is failing").await;
    let (s, _, b) = app
        .api(
            Method::PUT,
            "/environments/prod/approval-rules",
            Some(json!({"kinds": ["flag"], "reason": "four eyes in prod"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    click(&c, "button.danger").await;
    let gate = wait_find(&c, "#approval-needed").await.text().await.unwrap();
    assert!(gate.contains("Not applied: flag changes in prod need an approved change request"), "{gate}");
    let reason = wait_find(&c, "textarea[name=reason]").await.prop("value").await.unwrap();
    assert_eq!(reason.as_deref(), Some("INC-7 recommendations is failing"), "the reason is kept");
    assert!(!body(&c).await.contains("/api/v1"), "the page names no API path");
    assert_eq!(app.kill_switch().await, true);
    let (_, _, refused) =
        app.api(Method::GET, "/audit?environment=prod&action=flag.set&actor=olivia", None).await;
    assert_eq!(
        (refused[0]["outcome"].as_str(), refused[0]["via"].as_str()),
        (Some("rejected"), Some("ui")),
        "the refusal is audited: {refused}"
    );
    let detail = refused[0]["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("need an approved change request"), "{refused}");

    // Propose it from there: a change request with the flip and the reason.
    click(&c, "#approval-needed button[value=propose]").await;
    let page = body(&c).await;
    assert!(page.contains("Proposed change request 1"), "{page}");
    let card = wait_find(&c, "#request-1").await.text().await.unwrap();
    assert!(card.contains("flag recommendations.enabled of checkout") && card.contains("open"), "{card}");
    assert!(card.contains("INC-7 recommendations is failing"), "{card}");
    let (_, _, r) = app.api(Method::GET, "/environments/prod/change-requests/1", None).await;
    assert_eq!((&r["proposed"], r["proposed_by"].as_str()), (&json!(false), Some("olivia")), "{r}");
    assert_eq!(app.kill_switch().await, true, "proposing changes nothing");
    c.goto(&format!("{base}/")).await.unwrap();
    assert!(body(&c).await.contains("1 waiting"), "the landing page shows the request waiting");

    // The lever again, now with the rule known up front: break the glass.
    c.goto(&confirm_url).await.unwrap();
    let gate = wait_find(&c, "#approval-needed").await.text().await.unwrap();
    assert!(gate.contains("flag changes in prod need an approved change request"), "{gate}");
    assert!(!gate.contains("Not applied"), "{gate}");
    fill(&c, "textarea[name=reason]", "INC-7 cannot wait for review").await;
    screenshot(&c, "approval").await;
    click(&c, "#approval-needed button[value=break_glass]").await;
    let changed = changed_revision(&c).await;
    assert_eq!(changed, 2);
    assert_eq!(app.kill_switch().await, false);
    let (_, _, set) = app.api(Method::GET, "/audit?environment=prod&action=flag.set&limit=1", None).await;
    assert_eq!(
        (set[0]["outcome"].as_str(), set[0]["via"].as_str(), set[0]["reason"].as_str()),
        (Some("ok"), Some("ui"), Some("INC-7 cannot wait for review")),
        "{set}"
    );
    assert_eq!(set[0]["revision"], json!(2), "{set}");
    let (_, _, bypass) = app.api(Method::GET, "/audit?environment=prod&action=approval.bypass", None).await;
    assert_eq!(
        (bypass[0]["outcome"].as_str(), bypass[0]["actor"].as_str(), bypass[0]["reason"].as_str()),
        (Some("bypass"), Some("olivia"), Some("INC-7 cannot wait for review")),
        "{bypass}"
    );
    c.close().await.unwrap();
}

/// The policy editor reads as words: each field by a human label with its path as a hint,
/// enumerations as a choice of the values the model takes. Under a policy approval rule, a
/// commit prepared before the rule came in is refused onto the preview with the reason kept
/// and both offers (audited as `policy.update` rejected), then proposed as a change request
/// of the policy previewed; a rollback is applied by break-glass from its confirmation.
#[tokio::test]
async fn browser_a_policy_edit_and_a_rollback_under_an_approval_rule() {
    let Some((_driver, c)) = browser().await else { return };
    let app = TestApp::spawn().await;
    app.seed().await;
    app.user("olivia", "operator").await;
    let base = app.base.clone();
    let service = format!("{base}{SERVICE}");
    login(&c, &base, "olivia", PASSWORD).await;

    c.goto(&format!("{service}/policy/edit?part=dependency:payments")).await.unwrap();
    let timeout = "input[data-path='dependencies.payments.attempt_timeout']";
    let id = wait_find(&c, timeout).await.attr("id").await.unwrap().unwrap();
    let row = wait_find(&c, &format!("tr:has(#{id}) th")).await.text().await.unwrap();
    assert!(
        row.starts_with("Attempt timeout") && row.contains("dependencies.payments.attempt_timeout"),
        "{row}"
    );
    let retry = wait_find(&c, "tr:has(input[data-path='dependencies.payments.retry.max_attempts']) th label")
        .await
        .text()
        .await
        .unwrap();
    assert_eq!(retry, "Retry › Max attempts");
    let criticality = "select[data-path='dependencies.payments.criticality']";
    wait_find(&c, criticality).await;
    let options = c
        .execute(
            &format!("return [...document.querySelector(\"{criticality}\").options].map(o => o.value);"),
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(options, json!(["critical", "non_critical"]), "criticality is a choice of the model's values");

    // Previewed and the reason typed before the rule comes in.
    fill(&c, timeout, "250ms").await;
    click(&c, "#edit-form button[type=submit]").await;
    fill(&c, "#commit-form textarea[name=reason]", "INC-11 payments is slow").await;
    let (s, _, b) = app
        .api(
            Method::PUT,
            "/environments/prod/approval-rules",
            Some(json!({"kinds": ["policy"], "reason": "four eyes in prod"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    click(&c, "#commit-form button.danger").await;
    let gate = wait_find(&c, "#approval-needed").await.text().await.unwrap();
    assert!(gate.contains("Not applied: policy changes in prod need an approved change request"), "{gate}");
    let reason = wait_find(&c, "#commit-form textarea[name=reason]").await.prop("value").await.unwrap();
    assert_eq!(reason.as_deref(), Some("INC-11 payments is slow"), "the reason is kept");
    let kept = wait_find(&c, timeout).await.prop("value").await.unwrap();
    assert_eq!(kept.as_deref(), Some("250ms"), "the form keeps the value previewed");
    let (_, _, refused) =
        app.api(Method::GET, "/audit?environment=prod&action=policy.update&actor=olivia", None).await;
    assert_eq!(refused[0]["outcome"].as_str(), Some("rejected"), "the refusal is audited: {refused}");

    // Propose it.
    click(&c, "#approval-needed button[value=propose]").await;
    assert!(body(&c).await.contains("Proposed change request 1"));
    let card = wait_find(&c, "#request-1").await.text().await.unwrap();
    assert!(card.contains("policy of checkout") && card.contains("INC-11 payments is slow"), "{card}");
    assert!(card.contains("dependencies.payments.attempt_timeout"), "the reviewer sees the diff: {card}");
    let (_, _, policy) = app.api(Method::GET, "/environments/prod/services/checkout/policy", None).await;
    assert_eq!(policy["policy"]["dependencies"]["payments"]["attempt_timeout"], "300ms", "nothing applied");

    // A rollback (to before a flip made through the API) by break-glass.
    let (s, _, b) = app
        .api(
            Method::PATCH,
            "/environments/prod/services/checkout/flags/checkout.max_items",
            Some(json!({"value": 60, "reason": "bigger carts"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let (s, _, b) = app
        .api(
            Method::PUT,
            "/environments/prod/approval-rules",
            Some(json!({"kinds": ["policy", "flag"], "reason": "four eyes on flags too"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    c.goto(&format!("{service}/history")).await.unwrap();
    click(&c, "#rev-1 form button").await;
    let gate = wait_find(&c, "#approval-needed").await.text().await.unwrap();
    assert!(gate.contains("flag changes in prod need an approved change request"), "{gate}");
    fill(&c, "textarea[name=reason]", "INC-11 carts overflow").await;
    click(&c, "#approval-needed button[value=break_glass]").await;
    assert_eq!(changed_revision(&c).await, 3);
    let (_, _, flag) =
        app.api(Method::GET, "/environments/prod/services/checkout/flags/checkout.max_items", None).await;
    assert_eq!(flag["value"], json!(50), "{flag}");
    let (_, _, bypass) = app.api(Method::GET, "/audit?environment=prod&action=approval.bypass", None).await;
    assert_eq!(
        (bypass[0]["outcome"].as_str(), bypass[0]["reason"].as_str()),
        (Some("bypass"), Some("INC-11 carts overflow")),
        "{bypass}"
    );
    c.close().await.unwrap();
}

/// A breaker window changes type in the policy editor: choosing `time` instead of `count`
/// offers the field the time window requires (its seconds, named as required) in place of
/// the count window's size, and the preview then shows the whole change.
#[tokio::test]
async fn browser_a_breaker_window_changes_type_in_the_editor() {
    let Some((_driver, c)) = browser().await else { return };
    let app = TestApp::spawn().await;
    app.seed().await;
    app.user("olivia", "operator").await;
    let base = app.base.clone();
    login(&c, &base, "olivia", PASSWORD).await;
    c.goto(&format!("{base}{SERVICE}/policy/edit?part=dependency:payments")).await.unwrap();
    let window = "dependencies.payments.circuit_breaker.window";
    wait_find(&c, &format!("select[data-path='{window}.type']")).await.select_by_value("time").await.unwrap();
    click(&c, "#edit-form button[type=submit]").await;
    let seconds = format!("input[data-path='{window}.seconds']");
    let row = wait_find(&c, &format!("tr:has({seconds})")).await.text().await.unwrap();
    assert!(
        row.contains("Seconds") && row.contains("required when Circuit breaker › Window › Type is time"),
        "{row}"
    );
    assert!(
        c.find(Locator::Css(&format!("input[data-path='{window}.size']"))).await.is_err(),
        "no size for a time window"
    );
    assert!(c.find(Locator::Id("commit-form")).await.is_err(), "nothing to commit yet");
    fill(&c, &seconds, "30").await;
    click(&c, "#edit-form button[type=submit]").await;
    let diff = wait_find(&c, "table.diff").await.text().await.unwrap();
    for path in ["window.type", "window.seconds", "window.size"] {
        assert!(diff.contains(&format!("dependencies.payments.circuit_breaker.{path}")), "{diff}");
    }
    fill(&c, "#commit-form textarea[name=reason]", "a time window for bursty traffic").await;
    click(&c, "#commit-form button.danger").await;
    changed_revision(&c).await;
    let (_, _, policy) = app.api(Method::GET, "/environments/prod/services/checkout/policy", None).await;
    assert_eq!(
        policy["policy"]["dependencies"]["payments"]["circuit_breaker"]["window"],
        json!({"type": "time", "seconds": 30})
    );
    c.close().await.unwrap();
}

/// What issue 21 saw go wrong in passing, each checked in the browser: revision 1's diff is
/// a row per field, never a JSON blob; times read as how long ago with the exact time on
/// hover; Back to a service page after a change elsewhere shows the current revision;
/// every role badge is readable (WCAG AA contrast); the password rule is on the form before
/// any attempt; a viewer's refusal names the role needed and theirs; opening a change's
/// address again says what it is instead of a bare 405.
#[tokio::test]
async fn browser_what_an_operator_saw_in_passing() {
    let Some((_driver, c)) = browser().await else { return };
    let app = TestApp::spawn().await;
    app.seed().await;
    app.user("olivia", "operator").await;
    app.user("vic", "viewer").await;
    let base = app.base.clone();
    let service = format!("{base}{SERVICE}");
    login(&c, &base, "admin", crate::helpers::ADMIN_PASSWORD).await;

    // Revision 1's diff, field by field.
    c.goto(&format!("{service}/history")).await.unwrap();
    let first = wait_find(&c, "#rev-1 table.diff").await.text().await.unwrap();
    assert!(
        first.contains("policy.dependencies.payments.attempt_timeout") && first.contains("\"300ms\""),
        "{first}"
    );
    let blobs = c
        .execute("return [...document.querySelectorAll('#rev-1 td code')].map(e => e.innerText.trim()).filter(t => t.startsWith('{') && t !== '{}').length;", vec![])
        .await
        .unwrap();
    assert_eq!(blobs, json!(0), "no cell of revision 1 is a JSON object with fields: {first}");

    // Times: how long ago, the exact time on hover; no raw timestamp in the text.
    let mut seen = 0;
    for page in
        [format!("{base}/"), service.clone(), format!("{service}/history"), format!("{base}/ui/audit")]
    {
        c.goto(&page).await.unwrap();
        let text = body(&c).await;
        let times = c
            .execute(
                "return [...document.querySelectorAll('time')].map(t => [t.innerText, t.title]);",
                vec![],
            )
            .await
            .unwrap();
        for t in times.as_array().unwrap() {
            seen += 1;
            let (shown, exact) = (t[0].as_str().unwrap(), t[1].as_str().unwrap());
            assert!(
                shown.contains("ago") || shown.starts_with("in ") || shown == "just now",
                "{page}: a time reads {shown:?}"
            );
            assert!(
                exact.contains('T') && exact.ends_with('Z'),
                "{page}: the exact time on hover is {exact:?}"
            );
            assert!(!text.contains(exact), "{page}: the exact time {exact} is in the text");
        }
    }

    assert!(seen >= 4, "times were shown ({seen})");

    // Back shows the current revision.
    c.goto(&service).await.unwrap();
    until("revision 1 on the service page", || async {
        (wait_find(&c, "#live").await.attr("data-revision").await.ok()?? == "1").then_some(())
    })
    .await;
    c.execute("window.leveeMark = 'before';", vec![]).await.unwrap();
    c.goto(&format!("{service}/history")).await.unwrap();
    let (s, _, b) = app
        .api(
            Method::PATCH,
            "/environments/prod/services/checkout/flags/checkout.max_items",
            Some(json!({"value": 60, "reason": "bigger carts"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    c.back().await.unwrap();
    let revision = wait_find(&c, "#live").await.attr("data-revision").await.unwrap();
    assert_eq!(revision.as_deref(), Some("2"), "Back shows the current revision");
    let mark = c.execute("return window.leveeMark || null;", vec![]).await.unwrap();
    assert_eq!(mark, json!(null), "the page was loaded again");

    // Role badges and the password rule, on the users page before anything is tried.
    c.goto(&format!("{base}/ui/admin")).await.unwrap();
    let ratios = c
        .execute(
            r#"const lum = c => { const [r, g, b] = c.match(/[\d.]+/g).slice(0, 3).map(v => {
                   v = v / 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
                   return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
               return [...document.querySelectorAll('.role')].map(e => {
                   const s = getComputedStyle(e); const [a, b] = [lum(s.color), lum(s.backgroundColor)];
                   return [e.innerText, (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05)]; });"#,
            vec![],
        )
        .await
        .unwrap();
    let ratios = ratios.as_array().unwrap();
    for role in ["admin", "operator", "viewer"] {
        assert!(ratios.iter().any(|r| r[0] == role), "a {role} badge: {ratios:?}");
    }
    for r in ratios {
        assert!(r[1].as_f64().unwrap() >= 4.5, "the {} badge's contrast is under 4.5:1: {ratios:?}", r[0]);
    }
    let form = "form[action='/ui/admin/users']";
    let label = wait_find(&c, &format!("{form} label:has(input[name=password])")).await.text().await.unwrap();
    assert!(label.contains("12 to 256 characters"), "the rule is shown up front: {label}");
    let min = wait_find(&c, &format!("{form} input[name=password]")).await.attr("minlength").await.unwrap();
    assert_eq!(min.as_deref(), Some("12"));

    // A viewer's refusal.
    c.delete_all_cookies().await.unwrap();
    login(&c, &base, "vic", PASSWORD).await;
    c.goto(&format!("{service}/flags/recommendations.enabled/confirm?value=false&revision=2")).await.unwrap();
    let refused = body(&c).await;
    assert!(refused.contains("needs the operator role; you are viewer"), "{refused}");
    assert!(!refused.contains("operator needs role operator"), "{refused}");

    // A change's address opened again.
    c.delete_all_cookies().await.unwrap();
    login(&c, &base, "olivia", PASSWORD).await;
    c.goto(&format!("{service}/flags/recommendations.enabled")).await.unwrap();
    let again = body(&c).await;
    assert!(again.contains("Nothing to show here") && again.contains("changes nothing"), "{again}");
    assert!(again.contains("/ui/environments/prod/services/checkout"), "{again}");
    c.close().await.unwrap();
}

/// The service page shows the server's advice next to the policy's own lints: with a
/// `payments` service that retries, checkout's retries on its `payments` dependency are
/// retries on two layers of a chain.
#[tokio::test]
async fn browser_the_service_page_shows_the_servers_advice() {
    let Some((_driver, c)) = browser().await else { return };
    let app = TestApp::spawn().await;
    app.seed().await;
    let (s, _, b) = app
        .api(
            Method::POST,
            "/environments/prod/services",
            Some(json!({"name": "payments", "reason": "test",
                "policy": {"dependencies": {"bank": {"retry": {"max_attempts": 3}}}}})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    app.user("olivia", "operator").await;
    login(&c, &app.base, "olivia", PASSWORD).await;
    c.goto(&format!("{}{SERVICE}", app.base)).await.unwrap();
    let advice = wait_find(&c, "#advice").await.text().await.unwrap();
    assert!(advice.contains("dependencies.payments.retry"), "{advice}");
    assert!(
        advice
            .contains("checkout retries payments (2 attempts) and payments retries its own dependencies too"),
        "{advice}"
    );
    assert!(advice.contains("up to 6 calls"), "{advice}");
    c.close().await.unwrap();
}

/// Without the API: an admin creates an environment and a service in it (a bad name comes
/// back with the form as typed), adds a flag to the service through its confirmation, and
/// deletes it again.
#[tokio::test]
async fn browser_an_admin_creates_an_environment_a_service_and_a_flag_and_deletes_the_flag() {
    let Some((_driver, c)) = browser().await else { return };
    let app = TestApp::spawn().await;
    let base = app.base.clone();
    login(&c, &base, "admin", crate::helpers::ADMIN_PASSWORD).await;
    c.goto(&format!("{base}/")).await.unwrap();
    click(&c, "a[href='/ui/new-environment']").await;
    fill(&c, "input[name=name]", "staging").await;
    fill(&c, "input[name=description]", "before prod").await;
    fill(&c, "textarea[name=reason]", "a place to try").await;
    click(&c, "form[action='/ui/environments'] button[type=submit]").await;
    assert_eq!(c.current_url().await.unwrap().path(), "/ui/environments/staging");
    // The same name again is refused, the form as typed.
    c.goto(&format!("{base}/ui/new-environment")).await.unwrap();
    fill(&c, "input[name=name]", "staging").await;
    fill(&c, "input[name=description]", "again").await;
    fill(&c, "textarea[name=reason]", "twice").await;
    click(&c, "form[action='/ui/environments'] button[type=submit]").await;
    let page = body(&c).await;
    assert!(page.contains("environment \"staging\" already exists"), "{page}");
    let kept = wait_find(&c, "input[name=description]").await.prop("value").await.unwrap();
    assert_eq!(kept.as_deref(), Some("again"), "the form comes back as typed");
    c.goto(&format!("{base}/ui/environments/staging")).await.unwrap();

    click(&c, "a[href='/ui/environments/staging/new-service']").await;
    fill(&c, "input[name=name]", "search").await;
    fill(&c, "textarea[name=reason]", "new service").await;
    click(&c, "form[action='/ui/environments/staging/services'] button[type=submit]").await;
    assert_eq!(c.current_url().await.unwrap().path(), "/ui/environments/staging/services/search");
    let (s, _, svc) = app.api(Method::GET, "/environments/staging/services/search", None).await;
    assert_eq!(s, StatusCode::OK, "{svc}");

    // Add a flag: the form opens its confirmation, which asks for a reason.
    wait_find(&c, "#new-flag summary").await.click().await.unwrap();
    fill(&c, "#new-flag input[name=key]", "search.fuzzy").await;
    wait_find(&c, "#new-flag select[name=type]").await.select_by_value("bool").await.unwrap();
    fill(&c, "#new-flag input[name=value]", "true").await;
    fill(&c, "#new-flag input[name=description]", "typo-tolerant search").await;
    click(&c, "#new-flag button[type=submit]").await;
    assert!(body(&c).await.contains("Add flag search.fuzzy"));
    fill(&c, "textarea[name=reason]", "try fuzzy search").await;
    click(&c, "button.danger").await;
    let added = changed_revision(&c).await;
    let (_, _, flag) =
        app.api(Method::GET, "/environments/staging/services/search/flags/search.fuzzy", None).await;
    assert_eq!(
        (&flag["value"], flag["description"].as_str()),
        (&json!(true), Some("typo-tolerant search")),
        "{flag}"
    );

    // Delete it.
    click(&c, "tr[id='flag-search.fuzzy'] a.delete").await;
    assert!(body(&c).await.contains("Delete flag search.fuzzy"));
    fill(&c, "textarea[name=reason]", "fuzzy search is done").await;
    click(&c, "button.danger").await;
    assert_eq!(changed_revision(&c).await, added + 1);
    let (s, _, _) =
        app.api(Method::GET, "/environments/staging/services/search/flags/search.fuzzy", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (_, _, audit) = app.api(Method::GET, "/audit?environment=staging&action=flag", None).await;
    let actions: Vec<&str> = audit.as_array().unwrap().iter().filter_map(|r| r["action"].as_str()).collect();
    assert_eq!(actions, ["flag.delete", "flag.set"], "{audit}");
    c.close().await.unwrap();
}

/// Creates service `svc` of prod if needed and stages a policy change of it (two stages: one
/// instance, then everyone; an hour each): returns the rollout's id.
async fn start_rollout(app: &TestApp, svc: &str) -> i64 {
    let (s, _, _) = app.api(Method::GET, &format!("/environments/prod/services/{svc}"), None).await;
    if s == StatusCode::NOT_FOUND {
        let (s, _, b) = app
            .api(Method::POST, "/environments/prod/services", Some(json!({"name": svc, "reason": "test"})))
            .await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
    }
    let (_, _, current) =
        app.api(Method::GET, &format!("/environments/prod/services/{svc}/policy"), None).await;
    let mut policy = current["policy"].clone();
    let ms = 100 + current["revision"].as_u64().unwrap() * 10;
    policy["dependencies"]["pricing"] = json!({"attempt_timeout": format!("{ms}ms")});
    let plan = json!({"stages": [{"percent": 0, "instances": 1}, {"percent": 100}], "bake": "1h"});
    let (s, _, b) = app
        .api(
            Method::PUT,
            "/environments/prod/rollout-settings",
            Some(json!({"reason": "test", "settings": {"staged": [], "plan": plan}})),
        )
        .await;
    assert!(s.is_success(), "{b}");
    let (s, _, b) = app
        .api_with(
            Method::PUT,
            &format!("/environments/prod/services/{svc}/policy"),
            Some(json!({"policy": policy, "reason": "tighter pricing timeout", "staged": true})),
            &[("if-match", &format!("\"{}\"", current["revision"]))],
        )
        .await;
    assert!(s.is_success(), "{b}");
    b["rollout"]["id"].as_i64().expect("a rollout started")
}

/// The rollout page as an operator uses it: the stages and the cohort beside the rest, a
/// promote through its confirmation (the rollout completes and the agent gets the
/// candidate), an abort (the previous policy back for the agent), and a rollout the server
/// halted because a cohort instance rejected the candidate, shown with its reason.
#[tokio::test]
async fn browser_rollout_page_promote_abort_and_a_halted_rollout() {
    let Some((_driver, c)) = browser().await else { return };
    let app = TestApp::spawn().await;
    app.seed().await;
    app.user("olivia", "operator").await;
    let cache = tempfile::tempdir().unwrap();
    let agent = checkout_agent(&app, &cache).await;
    agent.wait_for_initial_sync(WAIT).await.unwrap();
    let base = app.base.clone();
    login(&c, &base, "olivia", PASSWORD).await;

    // Promote: stage 1 (the agent, the only instance) then completion.
    let id = start_rollout(&app, "checkout").await;
    let page = format!("{base}/ui/environments/prod/rollouts/{id}");
    // The service page announces it and leads to it.
    c.goto(&format!("{base}/ui/environments/prod/services/checkout")).await.unwrap();
    let line = wait_find(&c, "#rollout").await.text().await.unwrap();
    assert!(line.contains(&format!("Staged rollout {id} is running, stage 1 of 2")), "{line}");
    click(&c, "#rollout a").await;
    assert_eq!(c.current_url().await.unwrap().as_str(), page);
    c.goto(&page).await.unwrap();
    let text = body(&c).await;
    assert!(text.contains(&format!("Rollout {id} of checkout: running")), "{text}");
    assert!(text.contains("Stage 1 of 2"), "{text}");
    let sides = until("the agent in the cohort", || async {
        c.goto(&page).await.ok()?;
        let t = text_of(&c, "#sides").await?;
        t.contains("Connected instances 1").then_some(t)
    })
    .await;
    assert!(sides.contains("(candidate)"), "{sides}");
    // Stage 2 (everyone), then completion.
    for (reason, then) in [("cohort looks healthy", "Stage 2 of 2"), ("everyone healthy", "completed")] {
        click(&c, "#steps a[href$='step=promote']").await;
        assert!(body(&c).await.contains(&format!("Promote rollout {id} of checkout")));
        fill(&c, "textarea[name=reason]", reason).await;
        click(&c, "button.danger").await;
        let text = body(&c).await;
        assert!(text.contains(then), "{text}");
    }
    assert!(body(&c).await.contains(&format!("Rollout {id} of checkout: completed")));
    let (_, _, r) = app.api(Method::GET, &format!("/environments/prod/rollouts/{id}"), None).await;
    let candidate = r["rollout"]["candidate_revision"].as_u64().unwrap();
    until("the agent on the candidate", || async { (agent.status().revision == candidate).then_some(()) })
        .await;

    // Abort: the previous policy back, as a new revision.
    let id = start_rollout(&app, "checkout").await;
    c.goto(&format!("{base}/ui/environments/prod/rollouts/{id}")).await.unwrap();
    click(&c, "#steps a[href$='step=abort']").await;
    fill(&c, "textarea[name=reason]", "changed my mind").await;
    click(&c, "button.danger").await;
    let text = body(&c).await;
    assert!(text.contains(&format!("Rollout {id} of checkout: aborted")), "{text}");
    let outcome = wait_find(&c, "#outcome").await.text().await.unwrap();
    assert!(outcome.contains("aborted by olivia: changed my mind"), "{outcome}");
    assert!(outcome.contains("put the previous policy back for every instance"), "{outcome}");
    let (_, _, r) = app.api(Method::GET, &format!("/environments/prod/rollouts/{id}"), None).await;
    let revert = r["rollout"]["revert_revision"].as_u64().unwrap();
    until("the agent on the revert", || async { (agent.status().revision == revert).then_some(()) }).await;

    // Halted by the server: a cohort instance's NACK of the candidate (recorded as the
    // stream records one) is more than the plan tolerates.
    let id = start_rollout(&app, "checkout").await;
    let (_, _, r) = app.api(Method::GET, &format!("/environments/prod/rollouts/{id}"), None).await;
    let candidate = r["rollout"]["candidate_revision"].as_u64().unwrap();
    until("the agent on the candidate", || async { (agent.status().revision == candidate).then_some(()) })
        .await;
    let nack = levee_server::db::NackRow {
        environment: "prod".into(),
        service: "checkout".into(),
        instance_id: agent.instance_id().to_string(),
        revision: candidate,
        error_detail: "pricing: attempt_timeout refused".into(),
        at: levee_agent::policy::Timestamp::now().unix_ms(),
    };
    app._server.store.write_fleet(&[], &[nack], &[], "test", 0).await.unwrap();
    let page = format!("{base}/ui/environments/prod/rollouts/{id}");
    let outcome = until("the halt on the page", || async {
        c.goto(&page).await.ok()?;
        let t = text_of(&c, "#outcome").await?;
        t.contains("halted by the server").then_some(t)
    })
    .await;
    assert!(outcome.contains("1 cohort instance rejected the candidate (NACK)"), "{outcome}");
    assert!(body(&c).await.contains(&format!("Rollout {id} of checkout: halted")));
    assert!(c.find(Locator::Css("#steps")).await.is_err(), "no steps on a halted rollout");
    let (_, _, r) = app.api(Method::GET, &format!("/environments/prod/rollouts/{id}"), None).await;
    let revert = r["rollout"]["revert_revision"].as_u64().unwrap();
    until("the agent back on the previous policy", || async {
        (agent.status().revision == revert).then_some(())
    })
    .await;
    screenshot(&c, "rollout-halted").await;
    let audit = app.audit().await;
    assert!(audit.iter().any(|a| a["action"] == "rollout.halt" && a["actor"] == "levee"), "{audit:?}");
    c.close().await.unwrap();
    agent.shutdown().await;
}

/// A rollout the server halted on the agents' health, as the operator sees it: two
/// instances calling `payments` (20 ms a call), a staged change that gives it 1 ms: the
/// page shows, beside the rest, what the cohort's calls did and which line the rule found
/// worse, and the reason in words.
#[tokio::test]
async fn browser_a_rollout_halted_on_health_shows_the_cohort_beside_the_rest() {
    let Some((_driver, c)) = browser().await else { return };
    let app = TestApp::spawn().await;
    app.seed().await;
    app.user("olivia", "operator").await;
    let caches = tempfile::tempdir().unwrap();
    let mut agents = Vec::new();
    for name in ["checkout-web-1", "checkout-web-2"] {
        let a = checkout_agent_named(&app, &caches.path().join(name), name).await;
        a.wait_for_initial_sync(WAIT).await.unwrap();
        agents.push(a);
    }
    until("both instances connected", || async {
        let (_, _, fleet) = app.api(Method::GET, "/environments/prod/services/checkout/agents", None).await;
        (fleet.as_array()?.iter().filter(|a| a["connected"] == true).count() == 2).then_some(())
    })
    .await;
    // Both call payments, which answers in 20 ms, every 10 ms.
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    for a in &agents {
        let payments = a.dependency("payments");
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stop.changed() => return,
                }
                let payments = payments.clone();
                tokio::spawn(async move {
                    let answer = || async {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        Ok::<_, std::io::Error>(())
                    };
                    let _ = payments.call("POST /payments", answer).await;
                });
            }
        });
    }
    let base = app.base.clone();
    login(&c, &base, "olivia", PASSWORD).await;

    // The bad change, staged: one instance first, then everyone, an hour each.
    let plan = json!({"stages": [{"percent": 0, "instances": 1}, {"percent": 100}], "bake": "1h"});
    let (s, _, b) = app
        .api(
            Method::PUT,
            "/environments/prod/rollout-settings",
            Some(json!({"reason": "test", "settings": {"staged": ["policy"], "plan": plan}})),
        )
        .await;
    assert!(s.is_success(), "{b}");
    let (_, _, current) = app.api(Method::GET, "/environments/prod/services/checkout/policy", None).await;
    let mut policy = current["policy"].clone();
    policy["dependencies"]["payments"]["attempt_timeout"] = json!("1ms");
    let (s, _, b) = app
        .api_with(
            Method::PUT,
            "/environments/prod/services/checkout/policy",
            Some(json!({"policy": policy, "reason": "payments must answer at once", "staged": true})),
            &[("if-match", &format!("\"{}\"", current["revision"]))],
        )
        .await;
    assert!(s.is_success(), "{b}");
    let id = b["rollout"]["id"].as_i64().expect("a rollout started");

    let page = format!("{base}/ui/environments/prod/rollouts/{id}");
    let outcome = until("the halt on the page", || async {
        c.goto(&page).await.ok()?;
        let t = text_of(&c, "#outcome").await?;
        t.contains("halted by the server").then_some(t)
    })
    .await;
    assert!(outcome.contains("dependency payments:"), "{outcome}");
    assert!(outcome.contains("did not succeed"), "{outcome}");
    assert!(outcome.contains("put the previous policy back for every instance"), "{outcome}");
    assert!(body(&c).await.contains(&format!("Rollout {id} of checkout: halted")));
    // The line the rule found worse, the cohort's calls beside the rest's.
    let worse = wait_find(&c, "#health tr.worse").await.text().await.unwrap();
    assert!(worse.starts_with("dependency payments"), "{worse}");
    assert!(worse.ends_with("worse than the plan tolerates"), "{worse}");
    // Most of the cohort's calls timed out or were shed by the breaker that opened (a report
    // counts its window's calls for the revision applied when it is sent, so the calls
    // made just before the candidate count for it too); the rest's nearly all succeeded.
    let cohort = text_of(&c, "#health tr.worse td:nth-of-type(1)").await.unwrap();
    let share = |t: &str| t.split(" % of").next().and_then(|p| p.parse::<f64>().ok()).unwrap();
    assert!(share(&cohort) >= 50.0, "{cohort}");
    assert!(cohort.contains("did not succeed") && !cohort.contains("(0 failed, 0 timed out"), "{cohort}");
    let rest = text_of(&c, "#health tr.worse td:nth-of-type(2)").await.unwrap();
    assert!(share(&rest) < 10.0, "the rest's calls succeeded: {rest}");
    let health = text_of(&c, "#health").await.unwrap();
    assert!(health.contains("readiness"), "{health}");
    assert!(health.contains("NACKs of the candidate 0 0 within the 0 the plan tolerates"), "{health}");
    assert!(c.find(Locator::Css("#steps")).await.is_err(), "no steps on a halted rollout");
    screenshot(&c, "rollout-halted-on-health").await;
    let _ = stop_tx.send(true);
    c.close().await.unwrap();
    for a in agents {
        a.shutdown().await;
    }
}

/// An experiment from the console, as an operator runs one: from the service page to its
/// experiments, a form first sent with a bad duration (refused at that field), then the
/// confirmation with a reason, the experiment's page following it live (its state moving
/// to injected, a chart per probe), a stop behind its own confirmation, and the report:
/// aborted, stopped by the operator, the injected window on the chart.
#[tokio::test]
async fn browser_an_operator_defines_starts_watches_and_stops_an_experiment() {
    let Some((_driver, c)) = browser().await else { return };
    let app = TestApp::spawn().await;
    app.seed().await;
    app.user("olivia", "operator").await;
    let caches = tempfile::tempdir().unwrap();
    let mut agents = Vec::new();
    for name in ["checkout-web-1", "checkout-web-2"] {
        let a = checkout_agent_named(&app, &caches.path().join(name), name).await;
        a.wait_for_initial_sync(WAIT).await.unwrap();
        agents.push(a);
    }
    until("both instances connected", || async {
        let (_, _, fleet) = app.api(Method::GET, "/environments/prod/services/checkout/agents", None).await;
        (fleet.as_array()?.iter().filter(|a| a["connected"] == true).count() == 2).then_some(())
    })
    .await;
    let base = app.base.clone();
    login(&c, &base, "olivia", PASSWORD).await;
    c.goto(&format!("{base}{SERVICE}")).await.unwrap();
    click(&c, "#experiments-link").await;
    click(&c, "#new-experiment").await;

    fill(&c, "input[name=name]", "recs-down").await;
    fill(&c, "input[name=dependency]", "recommendations").await;
    fill(&c, "input[name=param]", "503").await;
    fill(&c, "input[name=duration]", "soon").await;
    fill(&c, "input[name=baseline]", "1s").await;
    fill(&c, "input[name=recovery]", "1s").await;
    fill(&c, "input[name=abort_after]", "60s").await;
    fill(&c, "textarea[name=hypothesis]", "- ready: true").await;
    click(&c, "#experiment-form button[type=submit]").await;
    let refused =
        wait_find(&c, "input[name=duration] ~ .field-error, label:has(input[name=duration]) + .field-error")
            .await
            .text()
            .await
            .unwrap();
    assert!(refused.starts_with("duration"), "{refused}");
    fill(&c, "input[name=duration]", "60s").await;
    click(&c, "#experiment-form button[type=submit]").await;
    let effects = wait_find(&c, "#effects").await.text().await.unwrap();
    assert!(effects.contains("on 1 instance(s) of checkout"), "{effects}");
    fill(
        &c,
        "#confirm-form textarea[name=reason]",
        "game day: does checkout absorb recommendations failing?",
    )
    .await;
    click(&c, "#confirm-form button[type=submit]").await;

    // Live: the page follows the run by itself.
    let state = until("the fault injected", || async {
        let t = text_of(&c, "#state").await?;
        t.starts_with("injected").then_some(t)
    })
    .await;
    assert!(state.contains("reloads"), "{state}");
    until("a chart with a held reading", || async {
        c.find(Locator::Css("svg.experiment-chart circle.held")).await.ok()
    })
    .await;
    let instances = text_of(&c, "#instances").await.unwrap();
    assert!(instances.starts_with("checkout-web-"), "{instances}");
    screenshot(&c, "experiment-running").await;

    click(&c, "#stop-experiment").await;
    fill(&c, "#confirm-form textarea[name=reason]", "seen enough").await;
    click(&c, "#confirm-form button[type=submit]").await;
    let verdict = until("the verdict", || async {
        let t = text_of(&c, "#verdict").await?;
        t.starts_with("aborted").then_some(t)
    })
    .await;
    assert!(verdict.contains("stopped by olivia: seen enough"), "{verdict}");
    let stopped = text_of(&c, "#stopped").await.unwrap();
    assert!(stopped.starts_with("by olivia"), "{stopped}");
    let started = text_of(&c, "#started").await.unwrap();
    assert!(started.starts_with("by olivia") && started.contains("game day"), "{started}");
    assert!(
        c.find(Locator::Css("svg.experiment-chart rect.injected")).await.is_ok(),
        "the injected window is drawn"
    );
    assert!(c.find(Locator::Css("#stop-experiment")).await.is_err(), "no stop once it ended");
    let timeline = text_of(&c, "#timeline").await.unwrap();
    for event in ["started", "injected", "stop_requested", "fault_removed", "ended"] {
        assert!(timeline.contains(event), "{event} missing: {timeline}");
    }
    screenshot(&c, "experiment-report").await;
    c.close().await.unwrap();
    for a in agents {
        a.shutdown().await;
    }
}

/// A game day played in the browser, with real agents under real traffic (the e2e tests'
/// example service, its calls going through each agent's dependency layer): an admin
/// starts it (recommendations slowed); bob, an operator, sees only that a game day runs,
/// opens the service page and flips the kill switch there; once the team recovered and it
/// ended, the experiment page's report gives time to detect, mitigate and recover matching
/// bob's look, the kill switch's audit row and the first reading that held again, with the
/// feature's runbook.
///
/// The fault slows every instance and each reports every 2 s: a reading sums each
/// instance's last report, and every report then holds slowed calls (each takes 400 ms
/// more) until the kill switch stops them, so the hypothesis cannot hold again before the
/// flip, as it can when one instance of several is slowed and its report happens to hold
/// none of its calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_a_game_day_is_played_and_its_report_matches_the_audit() {
    use levee_agent::policy::{Timestamp, duration};

    let Some((_driver, c)) = browser().await else { return };
    let app = TestApp::spawn().await;
    let admin = crate::support::Api::login(&app.base).await;
    admin.seed_allowing_faults().await;
    admin.game_day_policy().await;
    app.user("bob", "operator").await;
    let token = admin.agent_token("prod", &["checkout"]).await;
    let caches = tempfile::tempdir().unwrap();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let mut shops = Vec::new();
    for name in ["shop-a", "shop-b"] {
        let every = Duration::from_secs(2);
        shops.push(
            crate::support::shop_reporting_every(&app.grpc, &token, caches.path(), name, &stop, every).await,
        );
    }
    let ms = |v: &serde_json::Value| Timestamp::parse(v.as_str().expect("a time")).expect("a time").unix_ms();
    let report = |id: i64| {
        let admin = &admin;
        async move { admin.send(Method::GET, &format!("/experiments/{id}"), None).await }
    };

    let v = admin
        .send(
            Method::POST,
            "/experiments",
            Some(
                json!({"experiment": {
                    "name": "recs-slow", "environment": "prod", "service": "checkout", "game_day": true,
                    "fault": {"dependency": "recommendations", "action": {"type": "delay", "delay": "400ms"}},
                    "blast_radius": {"all": true},
                    "duration": "2m", "baseline": "3s", "recovery": "1s", "abort_after": "2m",
                    "hypothesis": [{"p99": {"dependency": "recommendations", "at_most": "200ms"}}, {"ready": true}],
                }, "reason": "practise the runbook"}),
            ),
        )
        .await;
    let id = v["id"].as_i64().unwrap();
    let injected = until("the injection", || async {
        let r = report(id).await;
        (!r["experiment"]["injected_at"].is_null()).then(|| ms(&r["experiment"]["injected_at"]))
    })
    .await;
    until("the violation", || async {
        (!report(id).await["game_day"]["first_violation_at"].is_null()).then_some(())
    })
    .await;

    // Bob opens the service page: a game day runs, by whom; not what it injected.
    login(&c, &app.base, "bob", PASSWORD).await;
    let before_look = Timestamp::now().unix_ms();
    c.goto(&format!("{}{SERVICE}", app.base)).await.unwrap();
    let page = body(&c).await;
    let after_look = Timestamp::now().unix_ms();
    assert!(page.contains("A game day is running on this service"), "{page}");
    assert!(!page.contains(&format!("experiment-{id}")), "the game day's fault rule is not listed: {page}");
    // He flips the kill switch there, with a reason.
    click(&c, "tr[id='flag-recommendations.enabled'] button.switch").await;
    fill(&c, "textarea[name=reason]", "recommendations are slow: switched off per runbook").await;
    click(&c, "button.danger").await;
    changed_revision(&c).await;

    // Checkout makes no call to recommendations any more: the hypothesis holds again.
    until("the recovery", || async {
        (!report(id).await["game_day"]["recovered_at"].is_null()).then_some(())
    })
    .await;
    admin
        .send(Method::POST, &format!("/experiments/{id}/stop"), Some(json!({"reason": "the team recovered"})))
        .await;
    let r = until("the end", || async {
        let r = report(id).await;
        (r["experiment"]["state"] == "done").then_some(r)
    })
    .await;

    // The report in the browser, against the audit and the readings.
    c.goto(&format!("{}/ui/environments/prod/experiments/{id}", app.base)).await.unwrap();
    let words = wait_find(&c, "#game-day").await.text().await.unwrap();
    let words = words.split_whitespace().collect::<Vec<_>>().join(" ");
    let since = |at: i64| duration::format(Duration::from_millis((at - injected) as u64));
    let g = &r["game_day"];
    let look = ms(&g["first_look"]["at"]);
    assert_eq!(g["first_look"]["by"], "bob", "{g:#}");
    assert!((before_look..=after_look).contains(&look), "{look} not in {before_look}..={after_look}");
    let (_, _, audit) = app.api(Method::GET, "/audit?service=checkout&action=flag.set", None).await;
    let flip =
        audit.as_array().unwrap().iter().find(|a| a["actor"] == "bob").expect("bob's flip in the audit");
    let flipped = ms(&flip["at"]);
    let recovered = ms(&g["recovered_at"]);
    let first_violation = ms(&g["first_violation_at"]);
    assert!(first_violation < flipped && flipped < recovered, "{g:#}");
    let readings = r["readings"].as_array().unwrap();
    let first_held_again = readings
        .iter()
        .map(|x| (ms(&x["at"]), &x["holds"]))
        .find(|(at, holds)| {
            let holds = holds.as_array().unwrap();
            *at > first_violation && holds.contains(&json!(true)) && !holds.contains(&json!(false))
        })
        .map(|(at, _)| at);
    assert_eq!(first_held_again, Some(recovered), "{r:#}");
    for line in [
        format!("time to detect {} (bob opened the service's page at {})", since(look), Timestamp::from_unix_ms(look)),
        format!(
            "time to mitigate {} (bob: flag.set of flag recommendations.enabled at {})",
            since(flipped),
            Timestamp::from_unix_ms(flipped)
        ),
        format!(
            "time to recover {} (the hypothesis held again at {})",
            since(recovered),
            Timestamp::from_unix_ms(recovered)
        ),
        "runbook of Personal recommendations (growth team): https://runbooks.example.com/growth/recommendations"
            .to_string(),
    ] {
        assert!(words.contains(&line), "{line:?} not in: {words}");
    }
    screenshot(&c, "game-day-report").await;

    let _ = stop_tx.send(true);
    c.close().await.unwrap();
    for s in shops {
        s.agent.shutdown().await;
    }
}
