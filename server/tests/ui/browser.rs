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
    let start = std::time::Instant::now();
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
    let start = std::time::Instant::now();
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
    let (s, _, t) = app
        .api(
            Method::POST,
            "/tokens",
            Some(json!({"kind": "agent", "name": "browser-test", "environment": "prod", "services": ["checkout"], "reason": "test"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{t}");
    let cache = tempfile::tempdir().unwrap();
    let agent = Agent::builder(&app.grpc, t["token"].as_str().unwrap(), "prod", "checkout")
        .cache_dir(cache.path())
        .instance_name("checkout-web-1")
        .sync_settings(SyncClientSettings {
            backoff_base: Duration::from_millis(50),
            backoff_cap: Duration::from_millis(300),
            reconnect_jitter: Duration::from_millis(50),
            ..SyncClientSettings::default()
        })
        .build()
        .expect("agent builds");
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
    let mark = c.execute("return window.leveeMark || null;", vec![]).await.unwrap();
    assert_eq!(mark, json!("no reload"), "the ACK appeared without reloading the page");
    assert_eq!(
        c.find(Locator::Id("live-summary")).await.unwrap().text().await.unwrap(),
        format!("1 of 1 agents applied revision {changed}.")
    );
    assert!(!switch.get(), "the agent switched recommendations off");
    assert!(body(&c).await.contains("kill switch recommendations.enabled is OFF"), "the banner says so");
    screenshot(&c, "service").await;

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
