//! The import report: every setting of the source file, mapped (to which Levee fields,
//! with which values) or not mapped (why).

use std::fmt::Write as _;

use levee_agent::policy::{Policy, lint};
use serde::Serialize;

use super::Source;

/// What became of one setting.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// It set these Levee fields (`path = value`, paths as `validate()` names them).
    Mapped {
        /// `policy.dependencies.pricing.retry.max_attempts = 3`, …
        to: Vec<String>,
    },
    /// It has no place in the manifest.
    NotMapped {
        /// Why, and what Levee does instead when it has an equivalent.
        reason: String,
    },
}

/// One setting of the source file.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Setting {
    /// Document number in the file, from 1.
    pub document: usize,
    /// Where it is in the document (`resilience4j.retry.instances.a.maxAttempts`,
    /// `spec.http[0].retries.attempts`).
    pub path: String,
    /// The value as written.
    pub value: String,
    /// Mapped or not, and where or why.
    #[serde(flatten)]
    pub outcome: Outcome,
    /// Remarks: a placeholder's default was taken, an approximation, a conflict.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// One of Levee's own lints on the imported policy — the same `levee apply` shows in its
/// plan for the policy alone — so that a risky combination the import produced (an
/// attempt timeout longer than the service's default deadline) is told at import time.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Warning {
    /// Manifest path of the field (`policy.dependencies.pricing.attempt_timeout`).
    pub path: String,
    /// The lint's code (`timeout_exceeds_budget`, `retry_exceeds_deadline`, …).
    pub code: String,
    /// What is risky, as the lint says it.
    pub message: String,
    /// What to change in the manifest, where it is plain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

/// The agent's lints on `policy` as report warnings, in the lints' order.
pub fn warnings(policy: &Policy) -> Vec<Warning> {
    lint(policy)
        .into_iter()
        .map(|l| {
            let on_route = l.path.starts_with("inbound.routes.");
            let hint = match l.code {
                "retry_exceeds_deadline" if !on_route => Some(
                    "no source setting maps to default_deadline (Levee's default is in force): raise \
                     policy.default_deadline in the manifest above the worst case, or lower retry.max_attempts or \
                     attempt_timeout",
                ),
                "timeout_exceeds_budget" if !on_route => Some(
                    "no source setting maps to default_deadline (Levee's default is in force): raise \
                     policy.default_deadline in the manifest above the attempt_timeout, or lower attempt_timeout",
                ),
                "non_critical_timeout_capped" => {
                    Some("raise policy.non_critical_cap in the manifest, or lower attempt_timeout")
                }
                "breaker_minimum_calls_low" => Some("raise circuit_breaker.minimum_calls in the manifest"),
                _ => None,
            };
            Warning {
                path: format!("policy.{}", l.path),
                code: l.code.to_string(),
                message: l.message,
                hint: hint.map(str::to_string),
            }
        })
        .collect()
}

/// Everything an import did.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    /// The source format.
    pub source: Source,
    /// The file as the user named it.
    pub file: String,
    /// Documents in the file.
    pub documents: usize,
    /// Every setting of the file, in file order.
    pub settings: Vec<Setting>,
    /// Remarks on the whole import: renamed dependencies, the source's own defaults that
    /// were applied because the file relies on them.
    pub notes: Vec<String>,
    /// Levee's lints on the imported policy (what `levee apply` would warn about); the
    /// mapping is as the source says, these say where it is risky in Levee.
    pub warnings: Vec<Warning>,
}

impl Report {
    /// Settings that set a Levee field.
    pub fn mapped(&self) -> usize {
        self.settings.iter().filter(|s| matches!(s.outcome, Outcome::Mapped { .. })).count()
    }

    /// Settings listed as not mapped.
    pub fn not_mapped(&self) -> usize {
        self.settings.len() - self.mapped()
    }

    /// The setting at `path` (in any document).
    pub fn setting(&self, path: &str) -> Option<&Setting> {
        self.settings.iter().find(|s| s.path == path)
    }

    fn where_(&self, s: &Setting) -> String {
        if self.documents > 1 { format!("document {}: {}", s.document, s.path) } else { s.path.clone() }
    }

    /// The report as people read it (what `levee import` prints on stderr).
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "levee import --from {} {}: {} settings, {} mapped, {} not mapped",
            self.source.as_str(),
            self.file,
            self.settings.len(),
            self.mapped(),
            self.not_mapped()
        );
        let mapped: Vec<&Setting> =
            self.settings.iter().filter(|s| matches!(s.outcome, Outcome::Mapped { .. })).collect();
        if !mapped.is_empty() {
            out.push_str("\nmapped:\n");
            for s in mapped {
                let _ = writeln!(out, "  {} = {}", self.where_(s), s.value);
                if let Outcome::Mapped { to } = &s.outcome {
                    for t in to {
                        let _ = writeln!(out, "      -> {t}");
                    }
                }
                for n in &s.notes {
                    let _ = writeln!(out, "      note: {n}");
                }
            }
        }
        let not: Vec<&Setting> =
            self.settings.iter().filter(|s| matches!(s.outcome, Outcome::NotMapped { .. })).collect();
        if !not.is_empty() {
            out.push_str("\nnot mapped:\n");
            for s in not {
                let _ = writeln!(out, "  {} = {}", self.where_(s), s.value);
                if let Outcome::NotMapped { reason } = &s.outcome {
                    let _ = writeln!(out, "      why: {reason}");
                }
                for n in &s.notes {
                    let _ = writeln!(out, "      note: {n}");
                }
            }
        }
        if !self.notes.is_empty() {
            out.push_str("\nnotes:\n");
            for n in &self.notes {
                let _ = writeln!(out, "  - {n}");
            }
        }
        if !self.warnings.is_empty() {
            out.push_str("\nwarnings (Levee's lints on the imported policy, as levee apply shows them):\n");
            for w in &self.warnings {
                let _ = writeln!(out, "  {} ({}): {}", w.path, w.code, w.message);
                if let Some(h) = &w.hint {
                    let _ = writeln!(out, "      hint: {h}");
                }
            }
        }
        out
    }
}
