//! The emergency-profile builder of the profiles page: a form listing the environment's
//! services, each with its bool flags (leave, on, off), its dependencies' breakers (leave,
//! forced open, forced closed, disabled), read-only mode (where the policy names a
//! read-only flag) and the operator levers (shed a share of sheddable traffic, pause
//! retries, a fixed inbound limit). What is chosen becomes a [`ProfileSpec`], the same
//! definition the JSON editor and the API take, so the action validates it once.
//!
//! Starter profiles fill the form from the services as they are, for the usual
//! emergencies: every non-critical dependency switched off, load shed, read-only. An
//! existing profile opens in the form too, to be changed and saved as its next version.
//!
//! Field names carry what they set: `flag:{service}:{key}`, `breaker:{service}:{dependency}`,
//! `read_only:{service}`, `pause_retries:{service}`, `shed:{service}`, `limit:{service}`
//! (no name has a `:`).

use std::collections::BTreeMap;

use levee_agent::policy::{BreakerOverrideState, DependencyCriticality, FlagType, ServiceConfig};

use crate::actions::{ProfileBreaker, ProfileService, ProfileSpec};

/// One bool flag of a service in the builder.
pub struct FlagField {
    pub key: String,
    pub field: String,
    /// What it does, in words (the dependency or feature it switches).
    pub note: String,
    /// The value now.
    pub now: String,
    /// `""` (leave), `true` or `false`.
    pub chosen: String,
}

/// One dependency's breaker in the builder.
pub struct BreakerField {
    pub dependency: String,
    pub field: String,
    /// `""` (leave), `forced_open`, `forced_closed` or `disabled`.
    pub chosen: String,
}

/// One service of the builder.
pub struct ServiceFields {
    pub name: String,
    pub flags: Vec<FlagField>,
    pub breakers: Vec<BreakerField>,
    /// The policy's read-only flag, when it names one.
    pub read_only_flag: Option<String>,
    pub read_only: bool,
    pub pause_retries: bool,
    pub shed: String,
    pub limit: String,
}

/// The builder as shown: every service, with what is chosen.
pub struct Builder {
    pub name: String,
    pub description: String,
    pub services: Vec<ServiceFields>,
}

/// The starter profiles the page offers: (query value, title, what it does).
pub const STARTERS: [(&str, &str, &str); 3] = [
    (
        "dependencies-off",
        "Non-critical dependencies off",
        "switches off every non-critical dependency that has a kill switch; callers get its fallback",
    ),
    (
        "shed-load",
        "Shed load",
        "sheds half of the sheddable inbound traffic and pauses every outgoing retry, in every service",
    ),
    (
        "read-only",
        "Read-only",
        "turns on read-only mode in every service whose policy names a read-only flag",
    ),
];

/// The definition of starter `name` for the services as they are (`None`: no such starter).
pub fn starter(name: &str, services: &[(String, ServiceConfig)]) -> Option<ProfileSpec> {
    let (_, title, does) = STARTERS.iter().find(|(n, _, _)| *n == name)?;
    let mut spec = ProfileSpec { description: format!("{title}: {does}"), services: BTreeMap::new() };
    for (svc, cfg) in services {
        let mut s = ProfileService::default();
        match name {
            "dependencies-off" => {
                for d in cfg.policy.dependencies.values() {
                    let key = d
                        .enabled_flag
                        .as_deref()
                        .filter(|_| d.criticality == DependencyCriticality::NonCritical);
                    if let Some(k) =
                        key.filter(|k| cfg.flags.get(*k).is_some_and(|f| f.kind == FlagType::Bool))
                    {
                        s.flags.insert(k.to_string(), false.into());
                    }
                }
            }
            "shed-load" => {
                s.shed_sheddable_percent = Some(50.0);
                s.pause_retries = true;
            }
            _ => s.read_only = cfg.policy.inbound.read_only_flag.is_some(),
        }
        if s != ProfileService::default() {
            spec.services.insert(svc.clone(), s);
        }
    }
    Some(spec)
}

/// What flag `key` switches in `cfg`, in words.
fn switches(cfg: &ServiceConfig, key: &str) -> String {
    let mut out: Vec<String> = cfg
        .policy
        .dependencies
        .iter()
        .filter(|(_, d)| d.enabled_flag.as_deref() == Some(key))
        .map(|(n, d)| {
            let c =
                if d.criticality == DependencyCriticality::Critical { "critical" } else { "non-critical" };
            format!("kill switch of dependency {n} ({c})")
        })
        .collect();
    out.extend(
        cfg.policy
            .degradation_matrix
            .iter()
            .filter(|r| r.enabled_flag.as_deref() == Some(key))
            .map(|r| format!("switch of feature {}", r.feature)),
    );
    if cfg.policy.inbound.read_only_flag.as_deref() == Some(key) {
        out.push("read-only flag (use read-only mode below)".into());
    }
    out.join("; ")
}

fn state_value(s: BreakerOverrideState) -> &'static str {
    match s {
        BreakerOverrideState::ForcedOpen => "forced_open",
        BreakerOverrideState::ForcedClosed => "forced_closed",
        BreakerOverrideState::Disabled => "disabled",
    }
}

impl Builder {
    /// The builder for `services`, filled from `spec` (empty for a new profile).
    pub fn of(name: &str, spec: &ProfileSpec, services: &[(String, ServiceConfig)]) -> Builder {
        let none = ProfileService::default();
        let services = services
            .iter()
            .map(|(svc, cfg)| {
                let p = spec.services.get(svc).unwrap_or(&none);
                ServiceFields {
                    name: svc.clone(),
                    flags: cfg
                        .flags
                        .iter()
                        .filter(|(_, f)| f.kind == FlagType::Bool)
                        .map(|(k, f)| FlagField {
                            key: k.clone(),
                            field: format!("flag:{svc}:{k}"),
                            note: switches(cfg, k),
                            now: f.value.to_string(),
                            chosen: p.flags.get(k).map(|v| v.to_string()).unwrap_or_default(),
                        })
                        .collect(),
                    breakers: cfg
                        .policy
                        .dependencies
                        .keys()
                        .map(|d| BreakerField {
                            dependency: d.clone(),
                            field: format!("breaker:{svc}:{d}"),
                            chosen: p
                                .breakers
                                .iter()
                                .find(|b| &b.dependency == d && b.operation.is_none())
                                .map(|b| state_value(b.state).to_string())
                                .unwrap_or_default(),
                        })
                        .collect(),
                    read_only_flag: cfg.policy.inbound.read_only_flag.clone(),
                    read_only: p.read_only,
                    pause_retries: p.pause_retries,
                    shed: p.shed_sheddable_percent.map(|v| v.to_string()).unwrap_or_default(),
                    limit: p.inbound_limit.map(|v| v.to_string()).unwrap_or_default(),
                }
            })
            .collect();
        Builder { name: name.to_string(), description: spec.description.clone(), services }
    }
}

/// The form as posted: its name, description and reason, and the definition its fields
/// make; or what is wrong with a field, named.
pub struct Built {
    pub name: String,
    pub description: String,
    pub reason: String,
    pub spec: Result<ProfileSpec, String>,
}

/// Reads the builder's fields. Unknown fields are refused, naming them (a form from
/// another version of the page must not be half-read).
pub fn read(pairs: &[(String, String)]) -> Built {
    let mut built = Built {
        name: String::new(),
        description: String::new(),
        reason: String::new(),
        spec: Ok(ProfileSpec::default()),
    };
    let mut services: BTreeMap<String, ProfileService> = BTreeMap::new();
    let mut error = None;
    for (field, value) in pairs {
        let value = value.trim();
        match field.as_str() {
            "name" => built.name = value.to_string(),
            "description" => built.description = value.to_string(),
            "reason" => built.reason = value.to_string(),
            "csrf" => {}
            _ => {
                if let Err(m) = read_field(&mut services, field, value) {
                    error.get_or_insert(m);
                }
            }
        }
    }
    services.retain(|_, s| *s != ProfileService::default());
    built.spec = match error {
        Some(m) => Err(m),
        None if services.is_empty() => {
            Err("the profile sets nothing: choose at least one flag, breaker or lever".to_string())
        }
        None => Ok(ProfileSpec { description: built.description.clone(), services }),
    };
    built
}

fn read_field(
    services: &mut BTreeMap<String, ProfileService>,
    field: &str,
    value: &str,
) -> Result<(), String> {
    let mut parts = field.splitn(3, ':');
    let (kind, svc, rest) = (parts.next().unwrap_or(""), parts.next(), parts.next());
    let Some(svc) = svc.filter(|s| !s.is_empty()) else {
        return Err(format!("the form has an unknown field {field:?}; reload the page"));
    };
    let s = services.entry(svc.to_string()).or_default();
    match (kind, rest) {
        ("flag", Some(key)) => match value {
            "" => {}
            "true" => _ = s.flags.insert(key.to_string(), true.into()),
            "false" => _ = s.flags.insert(key.to_string(), false.into()),
            v => return Err(format!("{svc}: flag {key}: {v:?} is not on (true) or off (false)")),
        },
        ("breaker", Some(dep)) => {
            if !value.is_empty() {
                let state = serde_json::from_value(serde_json::Value::String(value.to_string())).map_err(|_| {
                    format!("{svc}: breaker {dep}: {value:?} is not one of forced_open, forced_closed, disabled")
                })?;
                s.breakers.push(ProfileBreaker { dependency: dep.to_string(), operation: None, state });
            }
        }
        ("read_only", None) => s.read_only = !value.is_empty(),
        ("pause_retries", None) => s.pause_retries = !value.is_empty(),
        ("shed", None) if !value.is_empty() => {
            let p = value
                .parse::<f64>()
                .ok()
                .filter(|p| (0.0..=100.0).contains(p))
                .ok_or_else(|| format!("{svc}: shed: {value:?} is not a percentage from 0 to 100"))?;
            s.shed_sheddable_percent = Some(p);
        }
        ("limit", None) if !value.is_empty() => {
            let n = value.parse::<u32>().ok().filter(|n| (1..=100_000).contains(n)).ok_or_else(|| {
                format!("{svc}: inbound limit: {value:?} is not a whole number from 1 to 100000")
            })?;
            s.inbound_limit = Some(n);
        }
        ("shed" | "limit", None) => {}
        _ => return Err(format!("the form has an unknown field {field:?}; reload the page")),
    }
    Ok(())
}

/// The builder showing what was posted (after a refusal), over `services`.
pub fn shown_again(b: &Built, pairs: &[(String, String)], services: &[(String, ServiceConfig)]) -> Builder {
    let mut builder = Builder::of(&b.name, &ProfileSpec::default(), services);
    builder.description = b.description.clone();
    let value = |field: &str| pairs.iter().find(|(f, _)| f == field).map(|(_, v)| v.trim().to_string());
    for s in &mut builder.services {
        for f in &mut s.flags {
            f.chosen = value(&f.field).unwrap_or_default();
        }
        for b in &mut s.breakers {
            b.chosen = value(&b.field).unwrap_or_default();
        }
        s.read_only = value(&format!("read_only:{}", s.name)).is_some_and(|v| !v.is_empty());
        s.pause_retries = value(&format!("pause_retries:{}", s.name)).is_some_and(|v| !v.is_empty());
        s.shed = value(&format!("shed:{}", s.name)).unwrap_or_default();
        s.limit = value(&format!("limit:{}", s.name)).unwrap_or_default();
    }
    builder
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
    }

    #[test]
    fn the_fields_chosen_make_the_definition_and_the_rest_is_left_out() {
        let b = read(&pairs(&[
            ("csrf", "x"),
            ("name", "recs-down"),
            ("description", "recommendations down"),
            ("flag:checkout:recommendations.enabled", "false"),
            ("flag:checkout:new-ui", ""),
            ("breaker:checkout:payments", "forced_open"),
            ("breaker:checkout:recommendations", ""),
            ("shed:checkout", "50"),
            ("limit:checkout", ""),
            ("pause_retries:search", "on"),
            ("shed:cart", ""),
        ]));
        let spec = b.spec.unwrap();
        assert_eq!(spec.services.keys().collect::<Vec<_>>(), ["checkout", "search"], "cart sets nothing");
        let c = &spec.services["checkout"];
        assert_eq!(c.flags.get("recommendations.enabled"), Some(&false.into()));
        assert_eq!(c.flags.len(), 1);
        assert_eq!((c.breakers.len(), c.breakers[0].state), (1, BreakerOverrideState::ForcedOpen));
        assert_eq!((c.shed_sheddable_percent, c.inbound_limit), (Some(50.0), None));
        assert!(spec.services["search"].pause_retries);
        assert_eq!(spec.description, "recommendations down");
    }

    #[test]
    fn a_bad_field_is_named_with_what_it_takes() {
        let e = read(&pairs(&[("shed:checkout", "150")])).spec.unwrap_err();
        assert_eq!(e, "checkout: shed: \"150\" is not a percentage from 0 to 100");
        let e = read(&pairs(&[("limit:checkout", "0")])).spec.unwrap_err();
        assert!(e.contains("from 1 to 100000"), "{e}");
        let e = read(&pairs(&[("breaker:checkout:payments", "open")])).spec.unwrap_err();
        assert!(e.contains("forced_open, forced_closed, disabled"), "{e}");
        let e = read(&pairs(&[("nonsense", "1")])).spec.unwrap_err();
        assert!(e.contains("unknown field \"nonsense\""), "{e}");
        let e = read(&pairs(&[("name", "x"), ("flag:checkout:a", "")])).spec.unwrap_err();
        assert!(e.contains("sets nothing"), "{e}");
    }
}
