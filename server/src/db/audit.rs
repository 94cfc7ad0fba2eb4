//! The audit log: appended in the transaction of the change it records, read with filters;
//! and what a write's row says it changed (`before`, `after`, `detail`).

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use sqlx::AnyConnection;

use super::{AuditFilter, AuditOutcome, AuditRow, Parts, Reader, Store, timed};

impl Reader {
    /// Audit rows matching the filter, newest first.
    pub async fn audit(&self, f: &AuditFilter) -> anyhow::Result<Vec<AuditRow>> {
        let _t = timed("audit_read");
        // Every filter is optional; `$n IS NULL OR col = $n` keeps one static statement.
        let rows = sqlx::query(
            "SELECT id, at, actor, via, request_id, action, environment, service, target, outcome, reason, \
             before, after, revision, detail FROM audit \
             WHERE ($1 IS NULL OR environment = $1) AND ($2 IS NULL OR service = $2) \
             AND ($3 IS NULL OR actor = $3) AND ($4 IS NULL OR at >= $4) AND ($5 IS NULL OR at <= $5) \
             AND ($6 IS NULL OR id < $6) \
             AND ($8 IS NULL OR action = $8 OR action LIKE $8 || '.%') AND ($9 IS NULL OR action NOT LIKE $9) \
             ORDER BY id DESC LIMIT $7",
        )
        .bind(f.environment.clone())
        .bind(f.service.clone())
        .bind(f.actor.clone())
        .bind(f.since)
        .bind(f.until)
        .bind(f.before_id)
        .bind(f.limit)
        .bind(f.action.clone())
        .bind(f.exclude_action.clone())
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(AuditRow::from_row).collect()
    }
}

impl Store {
    /// Appends an audit row outside of a mutation (e.g. a refused attempt).
    pub async fn append_audit(&self, row: &AuditRow) -> anyhow::Result<()> {
        let _g = self.write_guard().await;
        let mut conn = self.pool.acquire().await?;
        insert_audit(&mut conn, row).await
    }
}

/// Appends `row` on `conn` (inside the transaction of the change it records).
pub(crate) async fn insert_audit(conn: &mut AnyConnection, row: &AuditRow) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO audit (at, actor, via, request_id, action, environment, service, target, outcome, reason, \
         before, after, revision, detail) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
    )
    .bind(row.at)
    .bind(&row.actor)
    .bind(row.via.as_str())
    .bind(&row.request_id)
    .bind(&row.action)
    .bind(row.environment.clone())
    .bind(row.service.clone())
    .bind(&row.target)
    .bind(row.outcome.as_str())
    .bind(&row.reason)
    .bind(row.before.clone())
    .bind(row.after.clone())
    .bind(row.revision)
    .bind(row.detail.clone())
    .execute(conn)
    .await?;
    // Rows written inside their transaction (a rolled-back one is counted too).
    metrics::counter!("levee_server_audit_writes_total", "outcome" => if row.outcome == AuditOutcome::Ok { "ok" } else { "refused" })
        .increment(1);
    Ok(())
}

/// What an edit changed, as JSON for the audit row's `before` and `after`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuditDiff {
    /// JSON of what was there; `None` when it did not exist.
    pub before: Option<String>,
    /// JSON of what is there now; `None` when it was removed.
    pub after: Option<String>,
    /// What happened, in words, beyond the values (the audit row's `detail`).
    pub detail: Option<String>,
}

impl AuditDiff {
    /// The JSON of `before` and `after`.
    pub fn of<T: Serialize>(before: Option<&T>, after: Option<&T>) -> AuditDiff {
        let json = |v: Option<&T>| v.and_then(|v| serde_json::to_string(v).ok());
        AuditDiff { before: json(before), after: json(after), detail: None }
    }

    /// The value of `subject` in `old` and in `new` parts.
    pub fn between(subject: &Subject, old: &Parts, new: &Parts) -> AuditDiff {
        let json = |p: &Parts| subject.value(p).map(|v| v.to_string());
        AuditDiff { before: json(old), after: json(new), detail: None }
    }

    /// The entries that differ between `old` and `new` ([`Entries::changed`]), as they were
    /// and as they are: the shape of every write of several entries at once (a profile
    /// applied or reverted, the expiry).
    pub fn entries(old: &Parts, new: &Parts) -> AuditDiff {
        AuditDiff::between(&Subject::Entries(Entries::changed(old, new)), old, new)
    }

    /// With `detail`.
    pub fn with_detail(self, detail: impl Into<String>) -> AuditDiff {
        AuditDiff { detail: Some(detail.into()), ..self }
    }
}

/// What a change is about inside a service. Its value in the service's parts is what the
/// audit row records as `before` and `after`; a refused attempt, which changes nothing,
/// records the value as it is stored on both sides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Subject {
    /// A flag, by key.
    Flag(String),
    /// A fault rule, by id.
    Fault(String),
    /// A breaker override: dependency and operation (`""`: the dependency-level breaker).
    Breaker(String, String),
    /// The policy.
    Policy,
    /// What a whole-service write declares: `{"policy": …, "flags": {…}}`.
    Declared,
    /// The whole configuration (the snapshot body).
    Config,
    /// Several entries at once (see [`Entries`]).
    Entries(Entries),
}

impl Subject {
    /// The subject's JSON value in `p`; `None` when it does not exist there.
    pub fn value(&self, p: &Parts) -> Option<serde_json::Value> {
        match self {
            Subject::Flag(k) => p.flags.get(k).map(json),
            Subject::Fault(id) => p.faults.get(id).map(json),
            Subject::Breaker(d, o) => p.overrides.get(&(d.clone(), o.clone())).map(json),
            Subject::Policy => Some(json(&p.policy)),
            Subject::Declared => {
                Some(serde_json::json!({"policy": json(&p.policy), "flags": json(&p.flags)}))
            }
            Subject::Config => Some(json(&p.config())),
            Subject::Entries(e) => Some(e.value(p)),
        }
    }
}

/// `v` as a JSON value (`null` if a serde type could not be written, which ours cannot fail).
fn json<T: Serialize + ?Sized>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
}

/// A set of entries of a service, named by key: what an emergency profile sets or
/// restores, what the expiry removes. Its value is one JSON object with a member per kind
/// named (`flags`, `faults`, `breaker_overrides` — keyed `dependency` or
/// `dependency/operation` —, `levers`, `policy`), each entry its JSON value or `null`
/// where it does not exist.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Entries {
    pub flags: BTreeSet<String>,
    pub faults: BTreeSet<String>,
    pub breakers: BTreeSet<(String, String)>,
    /// The service's lever override.
    pub levers: bool,
    /// The policy.
    pub policy: bool,
}

impl Entries {
    /// The entries that differ between `old` and `new`.
    pub fn changed(old: &Parts, new: &Parts) -> Entries {
        fn keys<K: Ord + Clone, T: PartialEq>(a: &BTreeMap<K, T>, b: &BTreeMap<K, T>) -> BTreeSet<K> {
            a.keys().chain(b.keys()).filter(|k| a.get(*k) != b.get(*k)).cloned().collect()
        }
        Entries {
            flags: keys(&old.flags, &new.flags),
            faults: keys(&old.faults, &new.faults),
            breakers: keys(&old.overrides, &new.overrides),
            levers: old.levers != new.levers,
            policy: old.policy != new.policy,
        }
    }

    fn value(&self, p: &Parts) -> serde_json::Value {
        use serde_json::{Map, Value};
        fn entries<'k, K: 'k, T: Serialize + 'k>(
            keys: impl IntoIterator<Item = &'k K>,
            name: impl Fn(&K) -> String,
            get: impl Fn(&K) -> Option<&'k T>,
        ) -> Value {
            Value::Object(
                keys.into_iter().map(|k| (name(k), get(k).map_or(Value::Null, |v| json(v)))).collect(),
            )
        }
        let mut out = Map::new();
        if !self.flags.is_empty() {
            out.insert("flags".into(), entries(&self.flags, String::clone, |k| p.flags.get(k)));
        }
        if !self.faults.is_empty() {
            out.insert("faults".into(), entries(&self.faults, String::clone, |k| p.faults.get(k)));
        }
        if !self.breakers.is_empty() {
            let name = |(d, o): &(String, String)| if o.is_empty() { d.clone() } else { format!("{d}/{o}") };
            out.insert("breaker_overrides".into(), entries(&self.breakers, name, |k| p.overrides.get(k)));
        }
        if self.levers {
            out.insert("levers".into(), json(&p.levers));
        }
        if self.policy {
            out.insert("policy".into(), json(&p.policy));
        }
        Value::Object(out)
    }
}
