//! The two storage backends of the tests: `Db`, `postgres_url` (a fresh database on the
//! PostgreSQL server of LEVEE_TEST_POSTGRES_URL, else 127.0.0.1:5432) and
//! `on_both_backends!`, which runs one test body on SQLite and on PostgreSQL so no test is
//! written twice. Included by the api, ui and e2e test binaries; each has a
//! `helpers::TestApp` with `spawn_on(Db) -> Option<TestApp>`.

use std::time::Duration;

/// Which database a test runs against.
#[derive(Clone, Copy, Debug)]
pub enum Db {
    Sqlite,
    Postgres,
}

/// PostgreSQL URL for tests, if a server is reachable. With LEVEE_REQUIRE_POSTGRES set (CI),
/// an unreachable server fails the test instead of skipping it.
pub async fn postgres_url() -> Option<String> {
    let base = std::env::var("LEVEE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into());
    let admin = format!("{base}/test");
    sqlx::any::install_default_drivers();
    let pool = match tokio::time::timeout(
        Duration::from_secs(3),
        sqlx::any::AnyPoolOptions::new().max_connections(1).connect(&admin),
    )
    .await
    {
        Ok(Ok(p)) => p,
        other => {
            if std::env::var("LEVEE_REQUIRE_POSTGRES").is_ok() {
                panic!("LEVEE_REQUIRE_POSTGRES is set but PostgreSQL at {admin} is unreachable: {other:?}");
            }
            eprintln!("PostgreSQL not reachable at {admin}: skipping the PostgreSQL variant");
            return None;
        }
    };
    // Databases of earlier runs (named with their creation time) are dropped once they are
    // an hour old, so they do not pile up on a shared PostgreSQL; a younger one may belong
    // to a test running right now. A database still in use refuses the drop: ignored.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let old: Vec<String> = sqlx::query_scalar::<_, String>(
        "SELECT datname::text FROM pg_database WHERE datname LIKE 'levee_test_%'",
    )
    .fetch_all(&pool)
    .await
    .unwrap_or_default()
    .into_iter()
    .filter(|n| {
        let created = n.strip_prefix("levee_test_").and_then(|r| r.split('_').next()?.parse::<u64>().ok());
        created.is_none_or(|t| now.saturating_sub(t) > 3600)
    })
    .collect();
    for n in old {
        let _ =
            sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS \"{n}\""))).execute(&pool).await;
    }
    let name = format!("levee_test_{now}_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&pool)
        .await
        .expect("create test database");
    pool.close().await;
    Some(format!("{base}/{name}"))
}

/// Runs one test body on both backends: `on_both_backends! { async fn name(app) { … } }`
/// becomes the module `name` with the tests `name::sqlite` and `name::postgres` (select
/// one backend with the filter `::postgres`). The PostgreSQL one is skipped when no
/// server is reachable, and fails instead when LEVEE_REQUIRE_POSTGRES is set (CI).
macro_rules! on_both_backends {
    ($(#[$meta:meta])* async fn $name:ident($app:ident) $body:block) => {
        $(#[$meta])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            async fn body($app: crate::helpers::TestApp) $body

            #[tokio::test]
            async fn sqlite() {
                let app = crate::helpers::TestApp::spawn_on(crate::backends::Db::Sqlite).await;
                body(app.expect("SQLite is always available")).await;
            }

            #[tokio::test]
            async fn postgres() {
                if let Some(app) = crate::helpers::TestApp::spawn_on(crate::backends::Db::Postgres).await {
                    body(app).await;
                }
            }
        }
    };
    // With settings changed before the server starts: `async fn name(app) with |s| …; { … }`
    // (the test binary's `TestApp` has `spawn_on_with(Db, impl FnOnce(&mut Settings))`).
    ($(#[$meta:meta])* async fn $name:ident($app:ident) with $tune:expr; $body:block) => {
        $(#[$meta])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            async fn body($app: crate::helpers::TestApp) $body

            #[tokio::test]
            async fn sqlite() {
                let app = crate::helpers::TestApp::spawn_on_with(crate::backends::Db::Sqlite, $tune).await;
                body(app.expect("SQLite is always available")).await;
            }

            #[tokio::test]
            async fn postgres() {
                if let Some(app) =
                    crate::helpers::TestApp::spawn_on_with(crate::backends::Db::Postgres, $tune).await
                {
                    body(app).await;
                }
            }
        }
    };
}
