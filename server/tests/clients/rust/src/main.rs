//! An OpenFeature program reading Levee flags through the Rust OFREP provider
//! (`open-feature-ofrep`). argv[1] is the provider's base URL, OFREP_TOKEN (optional) a
//! flags token. Each line on stdin is `KEY DEFAULT` (a bool flag and the caller's
//! default); each answer is one JSON line `{value, reason, errorCode}` on stdout.

use open_feature::OpenFeature;
use open_feature_ofrep::{OfrepOptions, OfrepProvider};
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};
use tokio::io::{AsyncBufReadExt, BufReader};

#[tokio::main]
async fn main() {
    let base_url = std::env::args().nth(1).expect("usage: ofrep-client BASE_URL");
    let mut headers = HeaderMap::new();
    if let Ok(token) = std::env::var("OFREP_TOKEN") {
        headers.insert(AUTHORIZATION, HeaderValue::from_str(&format!("Bearer {token}")).expect("a token"));
    }
    let provider = OfrepProvider::new(OfrepOptions { base_url, headers, ..Default::default() })
        .await
        .expect("the provider starts");
    let mut api = OpenFeature::default();
    api.set_provider(provider).await;
    let client = api.create_client();
    println!("{}", serde_json::json!({"ready": true}));
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let mut words = line.split_whitespace();
        let (Some(key), Some(default)) = (words.next(), words.next()) else { continue };
        let default = default == "true";
        let answer = match client.get_bool_details(key, None, None).await {
            Ok(d) => serde_json::json!({
                "value": d.value,
                "reason": d.reason.map(|r| format!("{r:?}").to_uppercase()),
                "errorCode": null,
            }),
            Err(e) => {
                serde_json::json!({"value": default, "reason": "ERROR", "errorCode": format!("{:?}", e.code)})
            }
        };
        println!("{answer}");
    }
}
