//! A thin client of the server's API, logged in as admin: the environment `prod` with the
//! service `checkout` and its bool flag, an agent token, and the flip measured.

use anyhow::Context;
use reqwest::Method;
use serde_json::{Value, json};

use super::server::ADMIN_PASSWORD;

/// The flag every mode flips.
pub const FLAG: &str = "recommendations.enabled";

#[derive(Debug, Clone)]
pub struct Api {
    pub base: String,
    pub client: reqwest::Client,
    token: String,
}

impl Api {
    pub async fn login(base: &str) -> anyhow::Result<Api> {
        let client = reqwest::Client::new();
        let res = client
            .post(format!("{base}/api/v1/auth/login"))
            .json(&json!({"username": "admin", "password": ADMIN_PASSWORD}))
            .send()
            .await?;
        anyhow::ensure!(res.status().is_success(), "login: {}", res.status());
        let v: Value = res.json().await?;
        let token = v["token"].as_str().context("login answers a token")?.to_string();
        Ok(Api { base: base.to_string(), client, token })
    }

    /// Sends one request; an answer other than 2xx is an error naming it.
    pub async fn send(&self, method: Method, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        self.send_with(method, path, body, &[]).await
    }

    /// [`Api::send`] with more headers (`if-match`).
    pub async fn send_with(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> anyhow::Result<Value> {
        let mut req = self
            .client
            .request(method.clone(), format!("{}/api/v1{path}", self.base))
            .bearer_auth(&self.token);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req.send().await?;
        let status = res.status();
        let v: Value = res.json().await.unwrap_or(Value::Null);
        anyhow::ensure!(status.is_success(), "{method} {path} → {status}: {v}");
        Ok(v)
    }

    /// Environment `prod`, service `checkout` with the flag on.
    pub async fn seed(&self) -> anyhow::Result<()> {
        self.send(Method::POST, "/environments", Some(json!({"name": "prod", "reason": "levee-bench"})))
            .await?;
        self.send(
            Method::POST,
            "/environments/prod/services",
            Some(json!({
                "name": "checkout", "reason": "levee-bench",
                "flags": {FLAG: {"type": "bool", "value": true}}
            })),
        )
        .await?;
        Ok(())
    }

    pub async fn agent_token(&self) -> anyhow::Result<String> {
        let v = self
            .send(
                Method::POST,
                "/tokens",
                Some(json!({"kind": "agent", "name": "levee-bench", "environment": "prod", "services": ["checkout"], "reason": "levee-bench"})),
            )
            .await?;
        Ok(v["token"].as_str().context("a token")?.to_string())
    }

    /// Sets the flag; returns the new revision once the API answered.
    pub async fn flip(&self, on: bool) -> anyhow::Result<u64> {
        let v = self
            .send(
                Method::PATCH,
                &format!("/environments/prod/services/checkout/flags/{FLAG}"),
                Some(json!({"value": on, "reason": "levee-bench flip"})),
            )
            .await?;
        v["revision"].as_u64().context("the write answers its revision")
    }
}
