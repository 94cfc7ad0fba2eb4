//! What an importer produces while it reads a file: the source's settings, the Levee
//! fields they set, and the validation that decides what is kept.
//!
//! An importer registers every setting of the file, then records *assignments* (a Levee
//! field, the value, the settings it came from, and how to set it) or says why a setting
//! is not mapped. [`Plan::finish`] applies the assignments, runs the agent's `validate()`
//! and drops every assignment whose value Levee does not allow — the settings behind it
//! are then reported as not mapped, with the allowed range from `validate()`. Nothing is
//! clamped, and nothing is left out of the report.

use std::collections::{BTreeMap, HashMap};

use levee_agent::policy::{DependencyPolicy, ServiceConfig};

use super::report::{Outcome, Report, Setting};
use super::units::levee_name;
use super::{ImportError, Source};
use crate::manifest::ServiceManifest;

/// Index of a setting in the plan.
pub type Sid = usize;

type Setter = Box<dyn Fn(&mut ServiceConfig)>;

struct SettingState {
    doc: usize,
    path: String,
    value: String,
    reason: Option<String>,
    notes: Vec<String>,
    dropped: Vec<String>,
}

struct Assignment {
    path: String,
    value: String,
    set: Setter,
    sources: Vec<Sid>,
    /// `Some(why)` for a value the source implies without a setting (its own default).
    implied: Option<String>,
    active: bool,
    drop_reason: Option<String>,
}

/// The mutable state of one import.
pub struct Plan {
    source: Source,
    file: String,
    documents: usize,
    settings: Vec<SettingState>,
    by_path: HashMap<(usize, String), Sid>,
    assignments: Vec<Assignment>,
    notes: Vec<String>,
    names: BTreeMap<String, String>,
    suggested_service: Option<String>,
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan").field("file", &self.file).field("settings", &self.settings.len()).finish()
    }
}

/// `policy.dependencies.<dep>.<field>`, the path `validate()` uses.
pub fn dep_path(dep: &str, field: &str) -> String {
    format!("policy.dependencies.{dep}.{field}")
}

/// Groups of a dependency's settings that bound or change every call whether or not the
/// source has an equivalent. When an import sets nothing of a group for a dependency, the
/// report names the group's whole default, read from the built config; when it sets part
/// of it, the parts it does not set (a bulkhead of 25
/// where the source bounded nothing is a change of behaviour the team must see).
const DEFAULTED: &[&str] = &["attempt_timeout", "retry", "circuit_breaker", "bulkhead"];

/// Service-level settings in force whatever the source says: (path below `policy`, what it
/// does). Named in one note when the import sets none of a path.
const SERVICE_DEFAULTS: &[(&str, &str)] = &[
    (
        "default_deadline",
        "the budget of a request whose caller sends none; it bounds every call, retries included",
    ),
    ("non_critical_cap", "the most a non-critical dependency may take per attempt"),
];

/// The inbound admission limit: on by default and enforcing, so always named when the
/// source does not set it (the fields shown, below `policy.inbound.limit`).
const LIMIT_SHOWN: &[&str] = &["algorithm", "initial_limit", "min_limit", "max_limit"];

/// A JSON value as a compact, YAML-like text: `{type: count, size: 100}`, `none` for null.
fn compact(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::Null => "none".into(),
        Value::String(s) => s.clone(),
        Value::Array(a) => format!("[{}]", a.iter().map(compact).collect::<Vec<_>>().join(", ")),
        Value::Object(o) => {
            format!(
                "{{{}}}",
                o.iter().map(|(k, v)| format!("{k}: {}", compact(v))).collect::<Vec<_>>().join(", ")
            )
        }
        other => other.to_string(),
    }
}

/// The value at a Levee path (`policy.dependencies.<dep>.<field>…`, `policy.<field>…`) in
/// `cfg`, and whether it is Levee's default there. Dependency names may hold dots: the
/// longest name the path starts with is taken. `None` when the place is not in `cfg`.
fn value_at(cfg: &ServiceConfig, path: &str) -> Option<(String, serde_json::Value, bool)> {
    let rest = path.strip_prefix("policy.")?;
    let walk = |mut v: serde_json::Value, field: &str| {
        for k in field.split('.').filter(|k| !k.is_empty()) {
            v = v.get(k)?.clone();
        }
        Some(v)
    };
    if let Some(r) = rest.strip_prefix("dependencies.") {
        let name = cfg
            .policy
            .dependencies
            .keys()
            .filter(|k| r.starts_with(&format!("{k}.")))
            .max_by_key(|k| k.len())?;
        let field = &r[name.len() + 1..];
        let v = walk(serde_json::to_value(&cfg.policy.dependencies[name]).ok()?, field)?;
        let default = walk(serde_json::to_value(DependencyPolicy::default()).ok()?, field);
        return Some((field.to_string(), v.clone(), default.as_ref() == Some(&v)));
    }
    let v = walk(serde_json::to_value(&cfg.policy).ok()?, rest)?;
    let default = walk(serde_json::to_value(levee_agent::policy::Policy::default()).ok()?, rest);
    Some((rest.to_string(), v.clone(), default.as_ref() == Some(&v)))
}

/// The dependency named `dep`, created with the agent's defaults if absent.
pub fn dep_mut<'a>(c: &'a mut ServiceConfig, dep: &str) -> &'a mut DependencyPolicy {
    c.policy.dependencies.entry(dep.to_string()).or_default()
}

impl Plan {
    pub fn new(source: Source, file: &str) -> Self {
        Self {
            source,
            file: file.to_string(),
            documents: 1,
            settings: Vec::new(),
            by_path: HashMap::new(),
            assignments: Vec::new(),
            notes: Vec::new(),
            names: BTreeMap::new(),
            suggested_service: None,
        }
    }

    /// Tells how many documents the file has (paths then carry the document number).
    pub fn set_documents(&mut self, n: usize) {
        self.documents = n.max(1);
    }

    /// Registers one setting of the file; its path must be unique within its document.
    pub fn setting(&mut self, doc: usize, path: &str, value: &str) -> Sid {
        if let Some(&id) = self.by_path.get(&(doc, path.to_string())) {
            return id;
        }
        let id = self.settings.len();
        self.settings.push(SettingState {
            doc,
            path: path.to_string(),
            value: value.to_string(),
            reason: None,
            notes: Vec::new(),
            dropped: Vec::new(),
        });
        self.by_path.insert((doc, path.to_string()), id);
        id
    }

    /// The setting at `path` of document `doc`, if the file has it.
    pub fn find(&self, doc: usize, path: &str) -> Option<Sid> {
        self.by_path.get(&(doc, path.to_string())).copied()
    }

    /// Every setting of document `doc` at or below `path` (`.` = the whole document).
    pub fn below(&self, doc: usize, path: &str) -> Vec<Sid> {
        let dot = format!("{path}.");
        let idx = format!("{path}[");
        (0..self.settings.len())
            .filter(|&i| {
                let s = &self.settings[i];
                s.doc == doc
                    && (path == "." || s.path == path || s.path.starts_with(&dot) || s.path.starts_with(&idx))
            })
            .collect()
    }

    /// Says why a setting is not mapped (the first reason given is kept).
    pub fn not_mapped(&mut self, id: Sid, reason: impl Into<String>) {
        let s = &mut self.settings[id];
        if s.reason.is_none() {
            s.reason = Some(reason.into());
        }
    }

    /// Adds a note to a setting (a placeholder's default taken, an approximation).
    pub fn note(&mut self, id: Sid, note: impl Into<String>) {
        let note = note.into();
        if !self.settings[id].notes.contains(&note) {
            self.settings[id].notes.push(note);
        }
    }

    /// A note about the whole import.
    pub fn general_note(&mut self, note: impl Into<String>) {
        let note = note.into();
        if !self.notes.contains(&note) {
            self.notes.push(note);
        }
    }

    /// A name for the service when the user gave none (e.g. `spring.application.name`).
    pub fn suggest_service(&mut self, name: &str) {
        if self.suggested_service.is_none() {
            self.suggested_service = Some(levee_name(name));
        }
    }

    /// The Levee dependency name for a source name. Different source names that would get
    /// the same Levee name are told apart with a suffix (`-2`); every renaming is noted.
    pub fn dep_name(&mut self, source_name: &str) -> String {
        if let Some(n) = self.names.get(source_name) {
            return n.clone();
        }
        let base = levee_name(source_name);
        let mut name = base.clone();
        let mut i = 2;
        while self.names.values().any(|n| *n == name) {
            let suffix = format!("-{i}");
            name = format!("{}{suffix}", &base[..base.len().min(64 - suffix.len())]);
            i += 1;
        }
        if name != source_name {
            self.general_note(format!("{source_name:?} is imported as dependency {name:?}"));
        }
        self.names.insert(source_name.to_string(), name.clone());
        name
    }

    /// Sets a Levee field from source settings.
    ///
    /// A second assignment of the same field with the same value adds its settings to the
    /// first; with a different value it is refused (the first one wins, as sources read
    /// top to bottom) and its settings are told why.
    pub fn assign(
        &mut self,
        path: String,
        value: impl Into<String>,
        sources: &[Sid],
        set: impl Fn(&mut ServiceConfig) + 'static,
    ) {
        let value = value.into();
        if let Some(prev) = self.assignments.iter_mut().find(|a| a.implied.is_none() && a.path == path) {
            if prev.value == value {
                for s in sources {
                    if !prev.sources.contains(s) {
                        prev.sources.push(*s);
                    }
                }
                return;
            }
            let by: Vec<String> = prev.sources.iter().map(|&s| self.settings[s].path.clone()).collect();
            let reason = format!(
                "conflicts with {} which already set {path} = {}; Levee keeps one value",
                if by.is_empty() { "an earlier setting".into() } else { by.join(", ") },
                prev.value
            );
            for &s in sources {
                self.settings[s].dropped.push(reason.clone());
            }
            return;
        }
        self.assignments.push(Assignment {
            path,
            value,
            set: Box::new(set),
            sources: sources.to_vec(),
            implied: None,
            active: true,
            drop_reason: None,
        });
    }

    /// Sets a Levee field to the source's own default: no setting in the file says it, but
    /// the source behaves so. `because` are the settings that make the default apply (the
    /// route or cluster it belongs to); they are reported as mapped to it. An explicit
    /// assignment of the same field wins.
    pub fn implied(
        &mut self,
        path: String,
        value: impl Into<String>,
        why: impl Into<String>,
        because: &[Sid],
        set: impl Fn(&mut ServiceConfig) + 'static,
    ) {
        if self.assignments.iter().any(|a| a.implied.is_some() && a.path == path) {
            return;
        }
        self.assignments.push(Assignment {
            path,
            value: value.into(),
            set: Box::new(set),
            sources: because.to_vec(),
            implied: Some(why.into()),
            active: true,
            drop_reason: None,
        });
    }

    fn build(&self) -> ServiceConfig {
        let mut cfg = ServiceConfig::default();
        let explicit: Vec<&str> =
            self.assignments.iter().filter(|a| a.implied.is_none()).map(|a| a.path.as_str()).collect();
        for a in self.assignments.iter().filter(|a| a.active && a.implied.is_some()) {
            if !explicit.contains(&a.path.as_str()) {
                (a.set)(&mut cfg);
            }
        }
        for a in self.assignments.iter().filter(|a| a.active && a.implied.is_none()) {
            (a.set)(&mut cfg);
        }
        cfg
    }

    /// A dependency the file configures without any retry gets what the source does then
    /// ([`Source::attempts_without_retry`]), not Levee's default of 3 attempts: an import
    /// must not add retries the source never made (Hystrix, Envoy without `retry_policy`,
    /// Sentinel, a resilience4j name with no retry instance). Reported as an implied value.
    fn imply_attempts_without_retry(&mut self) {
        let (attempts, why) = self.source.attempts_without_retry();
        let deps: Vec<String> = self.names.values().cloned().collect();
        for dep in deps {
            let prefix = dep_path(&dep, "");
            let path = dep_path(&dep, "retry.max_attempts");
            let configured = self.assignments.iter().any(|a| a.path.starts_with(&prefix));
            if !configured || self.assignments.iter().any(|a| a.path == path) {
                continue;
            }
            let d = dep.clone();
            self.implied(path, attempts.to_string(), why, &[], move |c| {
                dep_mut(c, &d).retry.max_attempts = attempts;
            });
        }
    }

    /// The defaults in force at `path` (shown as `label`): the whole value when no kept
    /// assignment sets anything at or below it, else the parts nothing sets.
    fn defaults_left(&self, path: &str, label: &str, v: &serde_json::Value, out: &mut Vec<String>) {
        let active = || self.assignments.iter().filter(|a| a.active);
        if active().any(|a| a.path == path || path.starts_with(&format!("{}.", a.path))) {
            return;
        }
        let below = active().any(|a| a.path.starts_with(&format!("{path}.")));
        match (below, v.as_object()) {
            (false, _) => out.push(format!("{label} = {}", compact(v))),
            (true, Some(fields)) => {
                for (k, c) in fields {
                    self.defaults_left(&format!("{path}.{k}"), &format!("{label}.{k}"), c, out);
                }
            }
            (true, None) => {}
        }
    }

    /// Applies the assignments, validates, drops what Levee does not allow, and returns
    /// the manifest and the report. `fallback` gives the reason for a setting the importer
    /// never looked at (by its path).
    pub fn finish(
        mut self,
        mut manifest: ServiceManifest,
        fallback: &dyn Fn(&str) -> String,
    ) -> Result<(ServiceManifest, Report), ImportError> {
        self.imply_attempts_without_retry();
        let cfg = loop {
            let cfg = self.build();
            let Err(errors) = cfg.validate() else { break cfg };
            let mut dropped_any = false;
            for e in &errors.0 {
                let hits = |a: &Assignment, p: &str| a.path == p || p.starts_with(&format!("{}.", a.path));
                let mut idx: Vec<usize> = (0..self.assignments.len())
                    .filter(|&i| self.assignments[i].active && hits(&self.assignments[i], &e.path))
                    .collect();
                if idx.is_empty()
                    && let Some((parent, _)) = e.path.rsplit_once('.')
                {
                    let prefix = format!("{parent}.");
                    idx = (0..self.assignments.len())
                        .filter(|&i| {
                            self.assignments[i].active && self.assignments[i].path.starts_with(&prefix)
                        })
                        .collect();
                }
                for i in idx {
                    let a = &mut self.assignments[i];
                    a.active = false;
                    let got = if e.value.is_empty() { String::new() } else { format!(" (got {})", e.value) };
                    a.drop_reason = Some(format!(
                        "Levee does not allow {} = {}: {} {}{got}",
                        a.path, a.value, e.path, e.message
                    ));
                    dropped_any = true;
                }
            }
            if !dropped_any {
                return Err(ImportError::Invalid(errors));
            }
        };
        for a in self.assignments.iter().filter(|a| !a.active && a.implied.is_none()) {
            let mut reason = a.drop_reason.clone().unwrap_or_default();
            reason.push_str(&match value_at(&cfg, &a.path) {
                Some((field, v, true)) => {
                    format!("; the manifest keeps Levee's default {field} = {}", compact(&v))
                }
                Some((field, v, false)) => format!("; the manifest has {field} = {} instead", compact(&v)),
                None => "; the manifest has nothing in its place".to_string(),
            });
            for &s in &a.sources {
                self.settings[s].dropped.push(reason.clone());
            }
        }
        let explicit: Vec<String> =
            self.assignments.iter().filter(|a| a.implied.is_none()).map(|a| a.path.clone()).collect();
        let mut notes = std::mem::take(&mut self.notes);
        for a in self.assignments.iter().filter(|a| a.implied.is_some() && !explicit.contains(&a.path)) {
            let why = a.implied.as_deref().unwrap_or_default();
            match &a.drop_reason {
                None => notes.push(format!("{} = {}: {why}", a.path, a.value)),
                Some(r) => notes.push(format!("not applied ({why}): {r}")),
            }
        }
        let set = |prefix: &str| {
            self.assignments
                .iter()
                .any(|a| a.active && (a.path == prefix || a.path.starts_with(&format!("{prefix}."))))
        };
        for (dep, policy) in &cfg.policy.dependencies {
            let value = serde_json::to_value(policy).unwrap_or_default();
            let mut defaults = Vec::new();
            for group in DEFAULTED {
                self.defaults_left(
                    &dep_path(dep, group),
                    group,
                    value.get(*group).unwrap_or_default(),
                    &mut defaults,
                );
            }
            if !defaults.is_empty() {
                notes.push(format!(
                    "policy.dependencies.{dep}: the source sets no equivalent of {}; Levee's defaults are in \
                     force (write them in the manifest to change them)",
                    defaults.join(", ")
                ));
            }
        }
        let policy = serde_json::to_value(&cfg.policy).unwrap_or_default();
        let mut service: Vec<String> = SERVICE_DEFAULTS
            .iter()
            .filter(|(field, _)| !set(&format!("policy.{field}")))
            .map(|(field, what)| {
                format!("{field} = {} ({what})", compact(policy.get(*field).unwrap_or_default()))
            })
            .collect();
        let inbound = policy.get("inbound").cloned().unwrap_or_default();
        let mode = compact(inbound.get("mode").unwrap_or_default());
        if !set("policy.inbound.limit") {
            let limit = inbound.get("limit").cloned().unwrap_or_default();
            let shown: Vec<String> = LIMIT_SHOWN
                .iter()
                .map(|k| format!("{k}: {}", compact(limit.get(*k).unwrap_or_default())))
                .collect();
            service.push(format!(
                "the inbound admission limit, on by default: inbound.limit = {{{}}}, inbound.mode = {mode} (with \
                 enforce, requests over the limit are rejected with 503 / RESOURCE_EXHAUSTED; shadow only counts \
                 them)",
                shown.join(", ")
            ));
        } else if !set("policy.inbound.mode") {
            service.push(format!("inbound.mode = {mode} (the inbound limit rejects what it sheds)"));
        }
        if !service.is_empty() {
            notes.push(format!(
                "policy: the source sets no equivalent of these service-level Levee defaults, which are in force \
                 (write them in the manifest to change them): {}",
                service.join("; ")
            ));
        }
        let mut settings = Vec::with_capacity(self.settings.len());
        for (id, s) in self.settings.iter().enumerate() {
            let to: Vec<String> = self
                .assignments
                .iter()
                .filter(|a| a.active && a.sources.contains(&id))
                .filter(|a| a.implied.is_none() || !explicit.contains(&a.path))
                .map(|a| match &a.implied {
                    None => format!("{} = {}", a.path, a.value),
                    Some(why) => format!("{} = {} ({why})", a.path, a.value),
                })
                .collect();
            let mut setting_notes = s.notes.clone();
            let outcome = if to.is_empty() {
                let mut reasons = s.dropped.clone();
                reasons.dedup();
                let reason = match (&s.reason, reasons.is_empty()) {
                    (Some(r), true) => r.clone(),
                    (Some(r), false) => format!("{r}; {}", reasons.join("; ")),
                    (None, false) => reasons.join("; "),
                    (None, true) => fallback(&s.path),
                };
                Outcome::NotMapped { reason }
            } else {
                setting_notes.extend(s.dropped.iter().cloned());
                Outcome::Mapped { to }
            };
            settings.push(Setting {
                document: s.doc + 1,
                path: s.path.clone(),
                value: s.value.clone(),
                outcome,
                notes: setting_notes,
            });
        }
        if manifest.service.is_empty() {
            manifest.service = self.suggested_service.clone().unwrap_or_default();
        }
        manifest.policy = cfg.policy;
        manifest.flags = cfg.flags;
        let report = Report {
            source: self.source,
            file: self.file,
            documents: self.documents,
            settings,
            notes,
            warnings: Vec::new(),
        };
        Ok((manifest, report))
    }
}
