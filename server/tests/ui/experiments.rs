//! The experiment pages without a browser: a viewer sees experiments but cannot define,
//! start or stop one; a form with bad fields comes back with each refusal at its field and
//! what was typed kept; a start needs the session's CSRF token and goes through a
//! confirmation; what people typed is shown escaped; under an approval rule covering
//! experiments the confirmation says so and starting proposes a change request.

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::helpers::SERVICE;

const LIST: &str = "/ui/environments/prod/experiments";

/// The fields of a good experiment form (a fault on one instance of checkout).
fn good(csrf: &str) -> Vec<(&'static str, String)> {
    [
        ("csrf", csrf),
        ("name", "recs-down"),
        ("service", "checkout"),
        ("dependency", "recommendations"),
        ("action", "abort"),
        ("param", "503"),
        ("percent", "100"),
        ("radius_kind", "instances"),
        ("radius", "1"),
        ("duration", "30s"),
        ("baseline", "1s"),
        ("recovery", "1s"),
        ("abort_after", "5s"),
        ("hypothesis", "- ready: true\n"),
    ]
    .into_iter()
    .map(|(k, v)| (k, v.to_string()))
    .collect()
}

fn with<'a>(
    fields: &'a [(&'static str, String)],
    changes: &[(&'static str, &'a str)],
) -> Vec<(&'a str, &'a str)> {
    fields
        .iter()
        .map(|(k, v)| (*k, changes.iter().find(|(c, _)| c == k).map_or(v.as_str(), |(_, v)| *v)))
        .collect()
}

/// The HTML escapes askama writes in an attribute, undone.
fn unescape(s: &str) -> String {
    s.replace("&quot;", "\"")
        .replace("&#34;", "\"")
        .replace("&#39;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

on_both_backends! {
async fn experiments_pages_roles_field_errors_confirmation_and_escaping(app) {
    app.seed().await;
    app.user("vic", "viewer").await;
    app.user("olivia", "operator").await;

    // The service page links to its experiments.
    let mut viewer = app.logged_in("vic").await;
    let svc = viewer.get(SERVICE).await;
    assert!(svc.body.contains("/ui/environments/prod/experiments?service=checkout"), "{}", svc.body);
    // A viewer sees the list, without the way to define one, and may not define one.
    let list = viewer.get(&format!("{LIST}?service=checkout")).await;
    assert_eq!(list.status, StatusCode::OK, "{}", list.body);
    assert!(!list.body.contains("id=\"new-experiment\""), "{}", list.body);
    assert_eq!(viewer.get(&format!("{LIST}/new")).await.status, StatusCode::FORBIDDEN);
    let csrf = list.csrf();
    let refused = viewer.post(&format!("{LIST}/confirm"), &with(&good(&csrf), &[])).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.body);

    let mut b = app.logged_in("olivia").await;
    let list = b.get(&format!("{LIST}?service=checkout")).await;
    assert!(list.body.contains("id=\"new-experiment\""), "{}", list.body);
    let form = b.get(&format!("{LIST}/new?service=checkout")).await;
    assert_eq!(form.status, StatusCode::OK, "{}", form.body);
    let csrf = form.csrf();
    let fields = good(&csrf);

    // Bad fields: each refusal at its field, the typed values kept, nothing started.
    let bad = b
        .post(
            &format!("{LIST}/confirm"),
            &with(&fields, &[("duration", "soon"), ("percent", "lots"), ("hypothesis", "")]),
        )
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);
    for (field, text) in [("duration", "duration"), ("percent", "fault.percent"), ("hypothesis", "hypothesis")] {
        let at = bad.body.find(&format!("name=\"{field}\"")).unwrap_or_else(|| panic!("no {field}: {}", bad.body));
        let after = &bad.body[at..];
        let next_field = after[1..].find("<label").map_or(after.len(), |i| i + 1);
        assert!(
            after[..next_field].contains("field-error") && after[..next_field].contains(text),
            "{field}'s refusal is not at it: {}",
            &after[..next_field]
        );
    }
    assert!(bad.body.contains("value=\"soon\""), "what was typed is kept");

    // A start without the session's token is refused; the confirmation changes nothing.
    let confirm = b.post(&format!("{LIST}/confirm"), &with(&fields, &[])).await;
    assert_eq!(confirm.status, StatusCode::OK, "{}", confirm.body);
    assert!(confirm.body.contains("First the hypothesis is measured for 1s"), "{}", confirm.body);
    assert!(confirm.body.contains("every instance ready"), "{}", confirm.body);
    let (_, _, none) = app.api(Method::GET, "/experiments", None).await;
    assert_eq!(none, json!([]), "a confirmation starts nothing");
    let spec = unescape(&confirm.field("spec").expect("the spec confirmed"));
    let reason = "<script>alert(1)</script> game day";
    let forged = b.post(LIST, &[("csrf", "forged"), ("spec", &spec), ("reason", reason)]).await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN, "{}", forged.body);
    let started = b.post(LIST, &[("csrf", &csrf), ("spec", &spec), ("reason", reason)]).await;
    assert_eq!(started.status, StatusCode::SEE_OTHER, "{}", started.body);
    let page = b.get(started.location()).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("&#60;script&#62;alert(1)&#60;/script&#62; game day"), "{}", page.body);
    assert!(!page.body.contains("<script>alert(1)"), "escaped");
    assert!(page.body.contains("http-equiv=\"refresh\""), "a running experiment's page reloads itself");
    assert!(page.body.contains("by olivia"), "{}", page.body);
    // The viewer sees it, with no stop; the operator has the stop, behind a confirmation.
    let seen = viewer.get(started.location()).await;
    assert_eq!(seen.status, StatusCode::OK);
    assert!(!seen.body.contains("id=\"stop-experiment\""), "{}", seen.body);
    assert!(page.body.contains("id=\"stop-experiment\""), "{}", page.body);
    let stop_url = format!("{}/stop", started.location());
    assert_eq!(viewer.get(&stop_url).await.status, StatusCode::FORBIDDEN);
    let stop = b.get(&stop_url).await;
    assert!(stop.body.contains("aborts at its next reading"), "{}", stop.body);
    let stopped = b.post(&stop_url, &[("csrf", &csrf), ("reason", "enough")]).await;
    assert_eq!(stopped.status, StatusCode::SEE_OTHER, "{}", stopped.body);
    let (_, _, list) = app.api(Method::GET, "/experiments", None).await;
    assert_eq!(list[0]["name"], "recs-down", "{list}");

    // Under a rule covering experiments the confirmation says so, and starting proposes.
    let (s, _, r) = app
        .api(Method::PUT, "/environments/prod/approval-rules", Some(json!({"kinds": ["experiment"], "reason": "four eyes"})))
        .await;
    assert_eq!(s, StatusCode::OK, "{r}");
    let confirm = b.post(&format!("{LIST}/confirm"), &with(&fields, &[("name", "second")])).await;
    assert!(confirm.body.contains("cover experiments: nothing starts now"), "{}", confirm.body);
    assert!(confirm.body.contains("Propose the experiment"), "{}", confirm.body);
    let spec = unescape(&confirm.field("spec").unwrap());
    let proposed = b.post(LIST, &[("csrf", &csrf), ("spec", &spec), ("reason", "next game day")]).await;
    assert_eq!(proposed.status, StatusCode::SEE_OTHER, "{}", proposed.body);
    assert!(proposed.location().starts_with("/ui/environments/prod/requests?done=Approval%20pending"), "{}", proposed.location());
    let (_, _, reqs) = app.api(Method::GET, "/environments/prod/change-requests", None).await;
    assert_eq!((reqs[0]["kind"].as_str(), reqs[0]["target"].as_str()), (Some("experiment"), Some("second")), "{reqs}");
    let (_, _, list) = app.api(Method::GET, "/experiments", None).await;
    assert_eq!(list.as_array().unwrap().len(), 1, "nothing more started: {list}");
}
}

on_both_backends! {
/// A game day from the define form: its checkbox (a value that is not the checkbox's is
/// refused at its field), a confirmation that says what a game day is, a start that needs
/// the session's CSRF token like any; once it runs, a player's stop confirmation (and its
/// refusal) shows neither its name nor its fault, its starter's does.
async fn a_game_day_from_the_form_hides_what_it_injects_on_the_stop_confirmation(app) {
    app.seed().await;
    app.user("olivia", "operator").await;
    app.user("bob", "operator").await;
    let mut b = app.logged_in("olivia").await;
    let form = b.get(&format!("{LIST}/new?service=checkout")).await;
    assert!(form.body.contains("name=\"game_day\""), "{}", form.body);
    let csrf = form.csrf();
    let fields = good(&csrf);
    // No agent reports: a long baseline keeps it running (nothing is injected) while
    // the players look.
    let mut typed = with(&fields, &[("name", "recs-secret"), ("baseline", "5m")]);
    typed.push(("game_day", "yes"));
    let bad = b.post(&format!("{LIST}/confirm"), &typed).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);
    let at = bad.body.find("name=\"game_day\"").unwrap();
    let after = &bad.body[at..];
    let next = after.find("<div class=\"row\">").unwrap();
    assert!(after[..next].contains("field-error") && after[..next].contains("game_day"), "{}", &after[..next]);
    *typed.last_mut().unwrap() = ("game_day", "on");
    let confirm = b.post(&format!("{LIST}/confirm"), &typed).await;
    assert_eq!(confirm.status, StatusCode::OK, "{}", confirm.body);
    assert!(confirm.body.contains("A game day: people in the loop"), "{}", confirm.body);
    let spec = unescape(&confirm.field("spec").expect("the spec confirmed"));
    assert!(spec.contains("\"game_day\":true"), "{spec}");
    let forged = b.post(LIST, &[("csrf", "forged"), ("spec", &spec), ("reason", "practise")]).await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN, "{}", forged.body);
    let started = b.post(LIST, &[("csrf", &csrf), ("spec", &spec), ("reason", "practise")]).await;
    assert_eq!(started.status, StatusCode::SEE_OTHER, "{}", started.body);
    let (_, _, list) = app.api(Method::GET, "/experiments", None).await;
    assert_eq!((list[0]["game_day"].as_bool(), list[0]["state"].as_str()), (Some(true), Some("baseline")), "{list}");

    let stop_url = format!("{}/stop", started.location());
    let mut player = app.logged_in("bob").await;
    let stop = player.get(&stop_url).await;
    assert_eq!(stop.status, StatusCode::OK, "{}", stop.body);
    assert!(stop.body.contains("(game day)"), "{}", stop.body);
    assert!(!stop.body.contains("recs-secret") && !stop.body.contains("practise"), "{}", stop.body);
    let refused = player.post(&stop_url, &[("csrf", &stop.csrf()), ("reason", "")]).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.body);
    assert!(!refused.body.contains("recs-secret"), "{}", refused.body);
    let own = b.get(&stop_url).await;
    assert!(own.body.contains("recs-secret"), "the starter sees it: {}", own.body);
    let stopped = b.post(&stop_url, &[("csrf", &csrf), ("reason", "done")]).await;
    assert_eq!(stopped.status, StatusCode::SEE_OTHER, "{}", stopped.body);
}
}
