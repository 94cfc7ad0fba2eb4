//! Game days end to end (issue 23 item 2): a real server on SQLite and on PostgreSQL, two
//! checkout instances of the real example under real traffic, an admin who starts a game
//! day (recommendations made slow on one instance), an operator who opens the service's
//! page and flips the kill switch, a viewer who only looks.
//!
//! * while it runs, the players see that a game day runs on checkout and by whom, never
//!   what it injected (the API's experiment and report, the service page's fault rules);
//!   the starter sees everything, the game day's measures included;
//! * a person's first look is recorded once however often they open the page, the live
//!   script's fetches and the starter's own looks are not looks;
//! * the report's time to detect, mitigate and recover are the operator's first look,
//!   the kill switch's audit row (and who pulled it) and the first reading after the
//!   violation with nothing violated, each counted from the injection; `levee experiment
//!   get` prints them with the runbook of the feature's owner;
//! * once it ends, everyone sees all of it.

use std::time::Duration;

use levee_agent::policy::Timestamp;
use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::TestApp;
use crate::support::{Api, recs_slow_game_day, shop_reporting_every};

const PASSWORD: &str = "game-day-password-1234";
const SERVICE_PAGE: &str = "/ui/environments/prod/services/checkout";

/// A duration of the report (`"12s 345ms"`), in ms.
fn dur_ms(v: &Value) -> i64 {
    levee_agent::policy::duration::parse(v.as_str().unwrap_or_else(|| panic!("a duration: {v}")))
        .unwrap()
        .as_millis() as i64
}

fn ms(v: &Value) -> i64 {
    Timestamp::parse(v.as_str().unwrap_or_else(|| panic!("a time: {v}"))).unwrap().unix_ms()
}

/// A person: their API client and their console session's cookies.
struct Person {
    api: Api,
    cookies: String,
}

/// Logs in to the console as `user` through its login form; the session's cookies.
async fn console_session(base: &str, user: &str, password: &str) -> String {
    let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let mut jar = std::collections::BTreeMap::new();
    fn keep(jar: &mut std::collections::BTreeMap<String, String>, res: &reqwest::Response) {
        for c in res.headers().get_all("set-cookie") {
            let pair = c.to_str().unwrap().split(';').next().unwrap().to_string();
            let (k, v) = pair.split_once('=').unwrap();
            jar.insert(k.to_string(), v.to_string());
        }
    }
    let form = client.get(format!("{base}/login")).send().await.unwrap();
    keep(&mut jar, &form);
    let body = form.text().await.unwrap();
    let needle = "name=\"csrf\" value=\"";
    let start = body.find(needle).expect("a csrf field") + needle.len();
    let csrf = &body[start..start + body[start..].find('"').unwrap()];
    let cookie = |jar: &std::collections::BTreeMap<String, String>| {
        jar.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("; ")
    };
    let res = client
        .post(format!("{base}/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("origin", base)
        .header("sec-fetch-site", "same-origin")
        .header("cookie", cookie(&jar))
        .body(
            serde_urlencoded::to_string([
                ("csrf", csrf),
                ("next", "/"),
                ("username", user),
                ("password", password),
            ])
            .unwrap(),
        )
        .send()
        .await
        .unwrap();
    keep(&mut jar, &res);
    assert!(jar.contains_key("levee_session"), "{user} logged in to the console: {}", res.status());
    cookie(&jar)
}

/// `name`, a user with `role`, logged in to the API and the console.
async fn player(admin: &Api, name: &str, role: &str) -> Person {
    admin
        .send(
            Method::POST,
            "/users",
            Some(json!({"username": name, "password": PASSWORD, "role": role, "reason": "e2e game day"})),
        )
        .await;
    let client = reqwest::Client::new();
    let res = client
        .post(format!("{}/api/v1/auth/login", admin.base))
        .json(&json!({"username": name, "password": PASSWORD}))
        .send()
        .await
        .unwrap();
    assert!(res.status().is_success(), "{name} logs in");
    let token = res.json::<Value>().await.unwrap()["token"].as_str().unwrap().to_string();
    let cookies = console_session(&admin.base, name, PASSWORD).await;
    Person { api: Api { base: admin.base.clone(), client, token }, cookies }
}

/// Opens the service's page in the console as `who` (their session cookie), as a browser
/// navigating to it (`document`) or as the live script refetching it (`empty`).
async fn open_page(who: &Person, dest: &str) -> String {
    open(who, SERVICE_PAGE, dest).await
}

/// Opens `path` in the console as `who`.
async fn open(who: &Person, path: &str, dest: &str) -> String {
    let res = who
        .api
        .client
        .get(format!("{}{path}", who.api.base))
        .header("cookie", &who.cookies)
        .header("sec-fetch-dest", dest)
        .send()
        .await
        .unwrap();
    assert!(res.status().is_success(), "{path} answered {}", res.status());
    res.text().await.unwrap()
}

async fn report(who: &Api, id: i64) -> Value {
    who.send(Method::GET, &format!("/experiments/{id}"), None).await
}

/// Polls the starter's report until `ready` says so.
async fn until(admin: &Api, id: i64, what: &str, ready: impl Fn(&Value) -> bool) -> Value {
    let give_up = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let r = report(admin, id).await;
        if ready(&r) {
            return r;
        }
        assert!(tokio::time::Instant::now() < give_up, "{what} never came: {r:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn game_day_measured_on_real_agents(db: crate::backends::Db) {
    let Some(app) = TestApp::spawn_on(db).await else { return };
    let admin = Api::login(&app.base).await;
    admin.seed_allowing_faults().await;
    admin.game_day_policy().await;
    let starter = Person {
        cookies: console_session(&admin.base, "admin", crate::helpers::ADMIN_PASSWORD).await,
        api: Api::login(&app.base).await,
    };
    let bob = player(&admin, "bob", "operator").await;
    let carol = player(&admin, "carol", "viewer").await;
    let token = admin.agent_token("prod", &["checkout"]).await;
    let caches = tempfile::tempdir().unwrap();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let mut shops = Vec::new();
    // A reading sums the windows every instance reported in its period, which lasts until
    // both have reported: with a report a second, readings come about every second, and
    // the slowed instance's windows each hold a few of its calls (each takes 400 ms more).
    for name in ["shop-a", "shop-b"] {
        let every = Duration::from_secs(1);
        shops.push(shop_reporting_every(&app.grpc, &token, caches.path(), name, &stop, every).await);
    }

    let spec = recs_slow_game_day();
    let v = admin
        .send(
            Method::POST,
            "/experiments",
            Some(json!({"experiment": spec, "reason": "practise the runbook"})),
        )
        .await;
    let id = v["id"].as_i64().unwrap();
    assert_eq!((v["game_day"].as_bool(), v["hidden"].as_bool()), (Some(true), Some(false)), "{v:#}");
    let r = until(&admin, id, "the injection", |r| !r["experiment"]["injected_at"].is_null()).await;
    let injected = ms(&r["experiment"]["injected_at"]);
    let fault_id = r["experiment"]["fault_id"].as_str().unwrap().to_string();

    // The players see that a game day runs, by whom; not what it injected.
    for who in [&bob.api, &carol.api] {
        let r = report(who, id).await;
        let e = &r["experiment"];
        assert_eq!((e["hidden"].as_bool(), e["game_day"].as_bool()), (Some(true), Some(true)), "{r:#}");
        assert_eq!(
            (e["name"].as_str(), e["created_by"].as_str()),
            (Some("game day"), Some("admin")),
            "{r:#}"
        );
        for hidden in ["spec", "instances", "injected_at", "fault_expires_at"] {
            assert!(e[hidden].is_null() && !r.to_string().contains("recommendations"), "{hidden}: {r:#}");
        }
        assert_eq!(e["reason"], "", "{r:#}");
        assert!(r["readings"].as_array().unwrap().is_empty() && r["game_day"].is_null(), "{r:#}");
        let list = who.send(Method::GET, "/experiments?service=checkout", None).await;
        assert_eq!(list[0]["hidden"], true, "{list:#}");
        assert!(list[0]["spec"].is_null(), "{list:#}");
    }
    // The console's experiment page and list say the same.
    let experiment_page = format!("/ui/environments/prod/experiments/{id}");
    let page = open(&carol, &experiment_page, "document").await;
    assert!(page.contains("id=\"game-day-hidden\"") && !page.contains("400ms"), "{page}");
    let list = open(&carol, "/ui/environments/prod/experiments", "document").await;
    assert!(list.contains("game day") && !list.contains("recs-slow"), "{list}");
    // The admin who started it sees everything, its looks included (none yet: their own
    // page views are not looks).
    let page = open_page(&starter, "document").await;
    assert!(
        page.contains(&fault_id),
        "the starter sees the fault rule: {}",
        &page[page.find("Fault rules").unwrap_or(0)..][..600]
    );
    assert!(report(&admin, id).await["game_day"]["looks"].as_array().unwrap().is_empty());

    // Carol's page: the game day announced, its fault rule not listed. The live script's
    // refetch is not a look; her navigation is, once.
    let page = open_page(&carol, "empty").await;
    assert!(page.contains("A game day is running on this service") && !page.contains(&fault_id), "{page}");
    assert!(report(&admin, id).await["game_day"]["looks"].as_array().unwrap().is_empty());
    let before_look = Timestamp::now().unix_ms();
    open_page(&carol, "document").await;
    let after_look = Timestamp::now().unix_ms();
    for _ in 0..5 {
        open_page(&carol, "document").await;
    }
    let r = report(&admin, id).await;
    let looks = r["game_day"]["looks"].as_array().unwrap();
    assert_eq!(looks.len(), 1, "one look per person: {r:#}");
    assert_eq!(looks[0]["by"], "carol");
    let look = ms(&looks[0]["at"]);
    assert!((before_look..=after_look).contains(&look), "{look} not in {before_look}..={after_look}");

    // The hypothesis is violated; bob looks and flips the kill switch.
    until(&admin, id, "the violation", |r| !r["game_day"]["first_violation_at"].is_null()).await;
    open_page(&bob, "document").await;
    bob.api
        .send(
            Method::PATCH,
            "/environments/prod/services/checkout/flags/recommendations.enabled",
            Some(json!({"value": false, "reason": "recommendations are slow: switched off per runbook"})),
        )
        .await;
    // With recommendations switched off no call is slow (none is made): the hypothesis no
    // longer violated, readiness held.
    let r = until(&admin, id, "the recovery", |r| !r["game_day"]["recovered_at"].is_null()).await;
    admin
        .send(Method::POST, &format!("/experiments/{id}/stop"), Some(json!({"reason": "the team recovered"})))
        .await;
    let r_end = until(&admin, id, "the end", |r| r["experiment"]["state"] == "done").await;

    let g = &r["game_day"];
    let audit = admin.send(Method::GET, "/audit?service=checkout&action=flag.set", None).await;
    let flip =
        audit.as_array().unwrap().iter().find(|a| a["actor"] == "bob").expect("bob's flip in the audit");
    assert_eq!(g["first_look"]["by"], "carol", "{g:#}");
    assert_eq!(ms(&g["first_look"]["at"]), look);
    assert_eq!(dur_ms(&g["time_to_detect"]), look - injected, "{g:#}");
    assert_eq!(
        (g["first_lever"]["by"].as_str(), g["first_lever"]["action"].as_str()),
        (Some("bob"), Some("flag.set"))
    );
    assert_eq!(g["first_lever"]["audit_id"], flip["id"], "{g:#}");
    assert_eq!(dur_ms(&g["time_to_mitigate"]), ms(&flip["at"]) - injected, "{g:#}");
    // The recovery is the first reading after the flip's effect with nothing violated.
    let recovered = ms(&g["recovered_at"]);
    assert!(recovered > ms(&flip["at"]), "recovered before the flip: {g:#}");
    let readings = r["readings"].as_array().unwrap();
    let at_recovery = readings.iter().find(|x| ms(&x["at"]) == recovered).expect("the recovering reading");
    // The rule of recovery: no probe violated, at least one held. The p99 probe holds or
    // has no data: the unslowed instance's windows of that period may still hold calls it
    // made before the flip (fast ones), or none.
    let holds = at_recovery["holds"].as_array().unwrap();
    assert!(holds[0] != json!(false) && holds[1] == json!(true), "{at_recovery}");
    assert!(
        readings.iter().any(|x| ms(&x["at"]) < recovered && x["holds"][0] == false),
        "violated before: {r:#}"
    );
    assert_eq!(dur_ms(&g["time_to_recover"]), recovered - injected);
    assert_eq!(
        g["runbooks"],
        json!([{"feature": "Personal recommendations", "owner": "growth team",
                "runbook": "https://runbooks.example.com/growth/recommendations", "decision": ""}])
    );
    let events: Vec<&str> =
        r["timeline"].as_array().unwrap().iter().map(|e| e["event"].as_str().unwrap()).collect();
    for e in ["looked", "lever", "recovered"] {
        assert!(events.contains(&e), "no {e} in {events:?}");
    }

    let page = open(&carol, &experiment_page, "document").await;
    assert!(
        page.contains("Game day: how fast the team reacted") && page.contains("time to mitigate"),
        "{page}"
    );
    // Ended: everyone sees all of it; the CLI prints the three times and the runbook.
    let r = report(&carol.api, id).await;
    assert_eq!(r["experiment"]["hidden"], false, "{r:#}");
    assert_eq!(r["game_day"]["time_to_mitigate"], r_end["game_day"]["time_to_mitigate"]);
    assert_eq!(r["experiment"]["spec"]["fault"]["dependency"], "recommendations");
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_levee"))
        .args(["experiment", "get", &id.to_string()])
        .env("LEVEE_SERVER", &carol.api.base)
        .env("LEVEE_TOKEN", &carol.api.token)
        .env("LEVEE_CREDENTIALS", caches.path().join("none"))
        .output()
        .await
        .expect("levee runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    for line in [
        "time to detect   ",
        "(carol opened the service's page at",
        "time to mitigate ",
        "(bob: flag.set of flag recommendations.enabled at",
        "time to recover  ",
        "runbook of Personal recommendations (growth team): https://runbooks.example.com/growth/recommendations",
    ] {
        assert!(stdout.contains(line), "{line:?} not in:\n{stdout}");
    }

    let _ = stop_tx.send(true);
    for s in shops {
        s.agent.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gd_1_a_game_day_measures_detect_mitigate_recover_and_hides_the_fault_sqlite() {
    game_day_measured_on_real_agents(crate::backends::Db::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gd_1_a_game_day_measures_detect_mitigate_recover_and_hides_the_fault_postgres() {
    game_day_measured_on_real_agents(crate::backends::Db::Postgres).await;
}
