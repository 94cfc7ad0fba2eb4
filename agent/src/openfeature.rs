//! An OpenFeature provider backed by the agent's flag store (feature `openfeature`).
//!
//! ```no_run
//! # async fn example(agent: levee_agent::Agent) {
//! use open_feature::OpenFeature;
//! let mut api = OpenFeature::singleton_mut().await;
//! api.set_provider(levee_agent::openfeature::LeveeProvider::new(&agent)).await;
//! let client = api.create_client();
//! let on = client.get_bool_value("recommendations.enabled", None, None).await.unwrap_or(true);
//! # }
//! ```
//!
//! Resolution is the agent's: a flag declared in code answers exactly as its handle does
//! (server value, else the declared default, with expiry, stale policy and rollout by the
//! context's targeting key). An undeclared flag resolves from the applied snapshot with the
//! same rules; when it is absent, expired, stale or of another type the provider reports
//! `FLAG_NOT_FOUND` / `TYPE_MISMATCH` and OpenFeature returns the caller's default.

use std::sync::Arc;

use open_feature::provider::{FeatureProvider, ProviderMetadata, ProviderStatus, ResolutionDetails};
use open_feature::{
    EvaluationContext, EvaluationError, EvaluationErrorCode, EvaluationReason, EvaluationResult, StructValue,
    Value,
};

use crate::applied::{BoolAnswer, DefaultReason, Source, Split};
use crate::flags::Declared;
use crate::policy::{Flag, FlagType};
use crate::state::Shared;

/// Name the provider reports in its metadata.
pub const PROVIDER_NAME: &str = "levee";

/// OpenFeature provider over an [`Agent`](crate::Agent)'s flags. Cheap to create; holds the
/// agent's shared state.
#[derive(Debug)]
pub struct LeveeProvider {
    shared: Arc<Shared>,
    metadata: ProviderMetadata,
}

impl LeveeProvider {
    /// A provider reading `agent`'s flags.
    pub fn new(agent: &crate::Agent) -> Self {
        Self { shared: agent.shared().clone(), metadata: ProviderMetadata::new(PROVIDER_NAME) }
    }

    fn reason(&self) -> EvaluationReason {
        match self.shared.current.load().source {
            Source::Live => EvaluationReason::Static,
            Source::Cache | Source::Default => EvaluationReason::Cached,
        }
    }

    /// Resolves an undeclared flag from the snapshot: the flag, or the error to report.
    fn resolve_undeclared<T>(
        &self,
        key: &str,
        kind: FlagType,
        get: impl FnOnce(&Flag) -> Option<T>,
    ) -> EvaluationResult<T> {
        self.shared.with_ctx(|ctx| match ctx.resolve(key, kind).0 {
            Ok(flag) => get(flag).ok_or_else(|| error(EvaluationErrorCode::TypeMismatch, key)),
            Err(DefaultReason::WrongType) => Err(error(EvaluationErrorCode::TypeMismatch, key)),
            Err(_) => Err(error(EvaluationErrorCode::FlagNotFound, key)),
        })
    }

    fn details<T>(&self, value: T) -> ResolutionDetails<T> {
        ResolutionDetails { value, variant: None, reason: Some(self.reason()), flag_metadata: None }
    }
}

fn error(code: EvaluationErrorCode, key: &str) -> EvaluationError {
    let message = match code {
        EvaluationErrorCode::FlagNotFound => format!("flag {key:?} is not set (absent, expired or stale)"),
        _ => format!("flag {key:?} has another type"),
    };
    EvaluationError { code, message: Some(message) }
}

fn json_to_value(v: &serde_json::Value) -> Option<Value> {
    Value::try_from(v).ok()
}

#[open_feature::async_trait]
impl FeatureProvider for LeveeProvider {
    fn status(&self) -> ProviderStatus {
        match self.shared.current.load().source {
            Source::Live => ProviderStatus::Ready,
            // Cached or default values are valid answers, just not confirmed current.
            Source::Cache | Source::Default => ProviderStatus::STALE,
        }
    }

    fn metadata(&self) -> &ProviderMetadata {
        &self.metadata
    }

    async fn resolve_bool_value(
        &self,
        flag_key: &str,
        ctx: &EvaluationContext,
    ) -> EvaluationResult<ResolutionDetails<bool>> {
        if let Some(Declared::Bool(h)) = self.shared.flags.declared(flag_key, FlagType::Bool) {
            let value = match &ctx.targeting_key {
                Some(k) => h.get_for(k),
                None => h.get(),
            };
            let mut d = self.details(value);
            if h.has_rollout() && ctx.targeting_key.is_some() {
                d.reason = Some(EvaluationReason::Split);
            }
            return Ok(d);
        }
        let target = ctx.targeting_key.clone();
        let value = self.resolve_undeclared(flag_key, FlagType::Bool, |f| {
            // The default given here never shows: outside the rollout there is no declared
            // default, so OpenFeature uses the caller's.
            let answer = BoolAnswer::of(Some(f), false);
            match (answer.split, &target) {
                (None, _) => f.value.as_bool(),
                (Some(s), _) if s.covers_all() => Some(s.value),
                (Some(s), Some(k)) => Split::inside(s.threshold, flag_key, k).then_some(s.value),
                (Some(_), None) => None,
            }
        });
        match value {
            Ok(v) => Ok(self.details(v)),
            Err(e) if e.code == EvaluationErrorCode::TypeMismatch => {
                // A rollout miss is reported as "not found" so the caller's default applies.
                Err(EvaluationError { code: EvaluationErrorCode::FlagNotFound, ..e })
            }
            Err(e) => Err(e),
        }
    }

    async fn resolve_int_value(
        &self,
        flag_key: &str,
        _: &EvaluationContext,
    ) -> EvaluationResult<ResolutionDetails<i64>> {
        if let Some(Declared::Int(h)) = self.shared.flags.declared(flag_key, FlagType::Int) {
            return Ok(self.details(h.get()));
        }
        self.resolve_undeclared(flag_key, FlagType::Int, |f| f.value.as_i64()).map(|v| self.details(v))
    }

    async fn resolve_float_value(
        &self,
        flag_key: &str,
        _: &EvaluationContext,
    ) -> EvaluationResult<ResolutionDetails<f64>> {
        if let Some(Declared::Float(h)) = self.shared.flags.declared(flag_key, FlagType::Float) {
            return Ok(self.details(h.get()));
        }
        self.resolve_undeclared(flag_key, FlagType::Float, |f| f.value.as_f64()).map(|v| self.details(v))
    }

    async fn resolve_string_value(
        &self,
        flag_key: &str,
        _: &EvaluationContext,
    ) -> EvaluationResult<ResolutionDetails<String>> {
        if let Some(Declared::String(h)) = self.shared.flags.declared(flag_key, FlagType::String) {
            return Ok(self.details(String::clone(&h.get())));
        }
        self.resolve_undeclared(flag_key, FlagType::String, |f| f.value.as_str().map(str::to_string))
            .map(|v| self.details(v))
    }

    async fn resolve_struct_value(
        &self,
        flag_key: &str,
        _: &EvaluationContext,
    ) -> EvaluationResult<ResolutionDetails<StructValue>> {
        let as_struct = |v: &serde_json::Value| match json_to_value(v) {
            Some(Value::Struct(s)) => Some(s),
            _ => None,
        };
        if let Some(Declared::Json(h)) = self.shared.flags.declared(flag_key, FlagType::Json) {
            return as_struct(&h.get())
                .map(|s| self.details(s))
                .ok_or_else(|| error(EvaluationErrorCode::TypeMismatch, flag_key));
        }
        self.resolve_undeclared(flag_key, FlagType::Json, |f| as_struct(&f.value)).map(|v| self.details(v))
    }
}

#[cfg(test)]
mod tests {
    use open_feature::{EvaluationContext, EvaluationErrorCode, OpenFeature};

    use super::*;
    use crate::flags::tests::apply;

    const FLAGS: &str = r#"{"flags":{
        "kill":{"type":"bool","value":false},
        "undeclared":{"type":"bool","value":true},
        "limit":{"type":"int","value":7},
        "ratio":{"type":"float","value":0.25},
        "color":{"type":"string","value":"red"},
        "layout":{"type":"json","value":{"columns":3}},
        "gradual":{"type":"bool","value":true,"rollout":{"percent":50}}
    }}"#;

    fn agent() -> crate::Agent {
        let a = crate::Agent::builder("http://127.0.0.1:9", "t", "prod", "checkout").build().unwrap();
        apply(a.shared(), 1, FLAGS);
        a
    }

    #[tokio::test(start_paused = true)]
    async fn provider_answers_as_the_handles_do() {
        let agent = agent();
        let kill = agent.flag_bool("kill", true);
        let gradual = agent.flag_bool("gradual", false);
        let mut api = OpenFeature::default();
        api.set_provider(LeveeProvider::new(&agent)).await;
        let client = api.create_client();

        assert_eq!(client.get_bool_value("kill", None, None).await, Ok(kill.get()));
        assert!(!kill.get());
        assert_eq!(client.get_bool_value("undeclared", None, None).await, Ok(true));
        assert_eq!(client.get_int_value("limit", None, None).await, Ok(7));
        assert_eq!(client.get_float_value("ratio", None, None).await, Ok(0.25));
        assert_eq!(client.get_string_value("color", None, None).await.as_deref(), Ok("red"));
        let layout = client.get_struct_value::<StructValue>("layout", None, None).await.unwrap();
        assert_eq!(layout.fields.get("columns"), Some(&Value::Int(3)));

        for i in 0..200 {
            let key = format!("user-{i}");
            let ctx = EvaluationContext::default().with_targeting_key(key.clone());
            assert_eq!(
                client.get_bool_value("gradual", Some(&ctx), None).await,
                Ok(gradual.get_for(&key)),
                "{key}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn absent_or_mistyped_flags_leave_the_callers_default() {
        let agent = agent();
        let provider = LeveeProvider::new(&agent);
        let ctx = EvaluationContext::default();
        let e = provider.resolve_bool_value("missing", &ctx).await.unwrap_err();
        assert_eq!(e.code, EvaluationErrorCode::FlagNotFound);
        let e = provider.resolve_int_value("color", &ctx).await.unwrap_err();
        assert_eq!(e.code, EvaluationErrorCode::TypeMismatch);
        assert_eq!(provider.status(), ProviderStatus::Ready);
        assert_eq!(provider.metadata().name, "levee");

        let mut api = OpenFeature::default();
        api.set_provider(provider).await;
        let client = api.create_client();
        assert!(client.get_bool_value("missing", None, None).await.is_err());
        // Deleted on the server: the declared default answers (CP-9 through OpenFeature).
        let limit = agent.flag_int("limit", 100);
        apply(agent.shared(), 2, "{}");
        assert_eq!(client.get_int_value("limit", None, None).await, Ok(100));
        assert_eq!(limit.get(), 100);
    }
}
