//! CD-3 in the UI: a stored revision that no longer decodes is shown as such, never as a
//! 500, and the way out — a rollback to a revision that reads — is offered.

use reqwest::StatusCode;

use crate::helpers::{SERVICE, TestApp};

/// Stores a body no version of the configuration decodes (nested past every decoder's
/// limit) as the next revision of prod/checkout, as another version could have; returns
/// the revision.
async fn store_unreadable(app: &TestApp) -> u64 {
    let body = format!(
        r#"{{"flags": {{"deep": {{"type": "json", "value": {}{}}}}}}}"#,
        "[".repeat(126),
        "]".repeat(126)
    );
    let pool = app._server.store.pool();
    let row = sqlx::query(
        "UPDATE services SET revision = revision + 1 WHERE environment = 'prod' AND name = 'checkout' \
         RETURNING revision",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    let revision: i64 = sqlx::Row::try_get(&row, "revision").unwrap();
    sqlx::query(
        "INSERT INTO revisions (environment, service, revision, hash, body, created_at, actor, reason) \
         VALUES ('prod', 'checkout', $1, $2, $3, 0, 'test', 'raw')",
    )
    .bind(revision)
    .bind(levee_agent::policy::content_hash(body.as_bytes()))
    .bind(body)
    .execute(pool)
    .await
    .unwrap();
    revision as u64
}

on_both_backends! {
/// CD-3: the service page of a service whose current revision cannot be read says so
/// (409, the revision and where decoding stopped) and links to its history; the history
/// marks that revision, offers a rollback to every other one and none to it; the
/// environment shows an alarm; a rollback from the UI brings the page back.
async fn cd_3_an_undecodable_current_revision_is_shown_with_rollback_offered(app) {
    app.seed().await;
    app.user("olivia", "operator").await;
    let unreadable = store_unreadable(&app).await;
    let mut b = app.logged_in("olivia").await;

    let page = b.get(SERVICE).await;
    assert_eq!(page.status, StatusCode::CONFLICT, "{}", page.body);
    assert!(page.body.contains("This revision cannot be read"), "{}", page.body);
    assert!(page.body.contains(&format!("revision {unreadable} of prod/checkout cannot be read")), "{}", page.body);
    assert!(page.body.contains(&format!(r#"href="{SERVICE}/history""#)), "{}", page.body);

    let history = b.get(&format!("{SERVICE}/history")).await;
    assert_eq!(history.status, StatusCode::OK, "{}", history.body);
    assert!(history.body.contains("This revision cannot be read by this server"), "{}", history.body);
    assert!(history.body.contains(r#"name="to" value="1""#), "rollback to 1 offered: {}", history.body);
    assert!(!history.body.contains(&format!(r#"name="to" value="{unreadable}""#)), "{}", history.body);

    let overview = b.get("/ui/environments/prod").await;
    assert_eq!(overview.status, StatusCode::OK, "{}", overview.body);
    assert!(overview.body.contains(&format!("checkout: revision {unreadable} cannot be read")), "{}", overview.body);

    let rev = unreadable.to_string();
    let confirm = b.get(&format!("{SERVICE}/rollback/confirm?to=1&revision={rev}")).await;
    assert_eq!(confirm.status, StatusCode::OK, "{}", confirm.body);
    let csrf = confirm.csrf();
    let done = b
        .post(
            &format!("{SERVICE}/rollback"),
            &[("csrf", &csrf), ("to", "1"), ("revision", &rev), ("reason", "unreadable revision")],
        )
        .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    let page = b.get(SERVICE).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
}
}
