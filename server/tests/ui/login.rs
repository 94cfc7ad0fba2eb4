//! Login, logout, and what happens without a session.

use reqwest::StatusCode;

use crate::helpers::{ADMIN_PASSWORD, SERVICE, TestApp};

#[tokio::test]
async fn login_form_sets_an_http_only_strict_session_cookie() {
    let app = TestApp::spawn().await;
    let mut b = app.browser();
    let res = b.login("admin", ADMIN_PASSWORD).await;
    assert_eq!(res.status, StatusCode::SEE_OTHER, "{}", res.body);
    assert_eq!(res.location(), "/");
    let cookie = res.set_cookie("levee_session").expect("session cookie set");
    let attrs: Vec<&str> = cookie.split(';').map(str::trim).collect();
    assert!(attrs[0].len() > "levee_session=".len() + 20, "cookie holds the session token: {cookie}");
    for wanted in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(attrs.contains(&wanted), "missing {wanted} in {cookie}");
    }
    assert!(!attrs.contains(&"Secure"), "plain HTTP: no Secure attribute ({cookie})");
    // The login nonce cookie is no longer needed.
    assert!(res.set_cookie("levee_login").is_some_and(|c| c.contains("Max-Age=0")));

    let home = b.get("/").await;
    assert_eq!(home.status, StatusCode::OK);
    assert!(home.body.contains("Environments"));
    assert!(home.body.contains("admin"), "the page shows who is logged in");
}

#[tokio::test]
async fn wrong_password_shows_the_form_again_with_an_error() {
    let app = TestApp::spawn().await;
    let mut b = app.browser();
    let res = b.login("admin", "not-the-password").await;
    assert_eq!(res.status, StatusCode::UNAUTHORIZED);
    assert!(res.body.contains("Wrong username or password."), "{}", res.body);
    assert!(res.body.contains("<form method=\"post\" action=\"/login\""), "the form is shown again");
    assert!(res.body.contains("value=\"admin\""), "the username is kept");
    assert!(res.set_cookie("levee_session").is_none());
    assert!(!b.cookies.contains_key("levee_session"));
    // And the page still says nobody is logged in.
    assert_eq!(b.get("/").await.status, StatusCode::SEE_OTHER);
}

/// Logging out ends the session on the server: a copy of the cookie taken before (a
/// stolen one, another tab) no longer opens any page.
#[tokio::test]
async fn logout_ends_the_session_even_for_a_copied_cookie() {
    let app = TestApp::spawn().await;
    let mut b = app.logged_in("admin").await;
    let copied = b.cookies.get("levee_session").cloned().expect("session cookie");
    let csrf = b.get("/").await.csrf();
    assert_eq!(b.post("/logout", &[("csrf", &csrf)]).await.status, StatusCode::SEE_OTHER);
    b.cookies.insert("levee_session".into(), copied);
    let page = b.get("/").await;
    assert_eq!(page.status, StatusCode::SEE_OTHER, "the ended session must not open pages");
    assert!(page.location().starts_with("/login"), "{}", page.location());
}

#[tokio::test]
async fn pages_redirect_to_login_without_a_session() {
    let app = TestApp::spawn().await;
    app.seed().await;
    let mut b = app.browser();
    let res = b.get("/").await;
    assert_eq!(res.status, StatusCode::SEE_OTHER);
    assert_eq!(res.location(), "/login");
    for path in ["/ui/audit", "/ui/environments/prod", SERVICE] {
        let res = b.get(path).await;
        assert_eq!(res.status, StatusCode::SEE_OTHER, "{path}");
        assert!(res.location().starts_with("/login?next="), "{path} → {}", res.location());
    }
    // A tampered cookie is no session either.
    b.cookies.insert("levee_session".into(), "eyJhbGciOiJub25lIn0.e30.".into());
    assert_eq!(b.get(SERVICE).await.status, StatusCode::SEE_OTHER);

    // After logging in, the user lands where they wanted to go.
    let mut b = app.browser();
    let form = b.get("/login?next=/ui/audit").await;
    let csrf = form.csrf();
    assert_eq!(form.field("next").as_deref(), Some("/ui/audit"));
    let res = b
        .post(
            "/login",
            &[("csrf", &csrf), ("next", "/ui/audit"), ("username", "admin"), ("password", ADMIN_PASSWORD)],
        )
        .await;
    assert_eq!(res.location(), "/ui/audit");
    // An off-site `next` is ignored.
    let mut b = app.browser();
    let form = b.get("/login?next=//evil.example/").await;
    assert_eq!(form.field("next").as_deref(), Some("/"));
}

#[tokio::test]
async fn logout_clears_the_session_cookie() {
    let app = TestApp::spawn().await;
    let mut b = app.logged_in("admin").await;
    let home = b.get("/").await;
    let csrf = home.csrf();
    let res = b.post("/logout", &[("csrf", &csrf)]).await;
    assert_eq!(res.status, StatusCode::SEE_OTHER);
    assert_eq!(res.location(), "/login");
    let cleared = res.set_cookie("levee_session").expect("cookie cleared");
    assert!(cleared.contains("Max-Age=0") && cleared.contains("HttpOnly"), "{cleared}");
    assert_eq!(b.get("/").await.status, StatusCode::SEE_OTHER);
}

#[tokio::test]
async fn login_form_without_its_token_is_refused() {
    let app = TestApp::spawn().await;
    let mut b = app.browser();
    // No login page was opened: no nonce cookie, no token.
    let res = b.post("/login", &[("username", "admin"), ("password", ADMIN_PASSWORD)]).await;
    assert_eq!(res.status, StatusCode::FORBIDDEN);
    assert!(res.set_cookie("levee_session").is_none());
    // A token from another browser's login page does not match this browser's nonce.
    let mut other = app.browser();
    let csrf = other.get("/login").await.csrf();
    let _ = b.get("/login").await;
    let res = b.post("/login", &[("csrf", &csrf), ("username", "admin"), ("password", ADMIN_PASSWORD)]).await;
    assert_eq!(res.status, StatusCode::FORBIDDEN);
    assert!(res.set_cookie("levee_session").is_none());
}
