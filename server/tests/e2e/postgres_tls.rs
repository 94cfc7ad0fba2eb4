//! PostgreSQL over TLS: sqlx is built with rustls, so `sslmode=require` (managed
//! PostgreSQL) connects, and the connection is encrypted.

use levee_server::db::Store;
use sqlx::Row;

use crate::private_pg::PrivatePg;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_with_sslmode_require_connects_over_tls() {
    let Some(pg) = PrivatePg::start() else { return };
    pg.stop();
    pg.enable_tls();
    pg.start_again();
    let store = Store::connect(&format!("{}?sslmode=require", pg.url())).await.expect("connects with TLS");
    let row = sqlx::query("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert!(row.try_get::<bool, _>("ssl").unwrap(), "the connection is encrypted");
    store.close().await;
}
