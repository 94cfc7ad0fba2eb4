//! A service's outbound policy as Envoy API resources: per dependency, a Listener (an API
//! listener with an HttpConnectionManager, what gRPC's proxyless client asks for), a
//! RouteConfiguration (timeouts, retries, faults), a Cluster (bulkhead, retry budget,
//! outlier detection) and a ClusterLoadAssignment (the endpoints the server's settings
//! name). All four are named after the dependency. docs/xds.md has the table of what maps
//! to what and what has no xDS counterpart.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::{
    CircuitBreakers, Cluster, OutlierDetection as EnvoyOutlier, circuit_breakers, cluster,
};
use envoy_types::pb::envoy::config::core::v3::{
    Address, AggregatedConfigSource, ApiVersion, ConfigSource, Locality, RoutingPriority, SocketAddress,
    address, config_source, socket_address,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
};
use envoy_types::pb::envoy::config::listener::v3::{ApiListener, Listener};
use envoy_types::pb::envoy::config::route::v3::{
    HeaderMatcher, RetryPolicy, Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost,
    header_matcher, retry_policy, route, route_action, route_match,
};
use envoy_types::pb::envoy::extensions::filters::common::fault::v3::{FaultDelay, fault_delay};
use envoy_types::pb::envoy::extensions::filters::http::fault::v3::{FaultAbort, HttpFault, fault_abort};
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, Rds, http_connection_manager, http_filter,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{RegexMatcher, StringMatcher, string_matcher};
use envoy_types::pb::envoy::r#type::v3::{FractionalPercent, Percent, fractional_percent};
use envoy_types::pb::google::protobuf::{Any, Duration as PbDuration, UInt32Value};
use levee_agent::policy::{
    BreakerOverrideState, DependencyPolicy, FaultAction, FaultRule, Retry, ServiceConfig, Timestamp,
};
use prost::{Message, Name};

/// Type URL of listeners (LDS).
pub const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
/// Type URL of route configurations (RDS).
pub const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
/// Type URL of clusters (CDS).
pub const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
/// Type URL of cluster load assignments (EDS).
pub const ENDPOINT: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
/// Every type this server serves.
pub const TYPES: [&str; 4] = [LISTENER, ROUTE, CLUSTER, ENDPOINT];

/// Name of the fault filter, in the connection manager and in each route's per-filter
/// configuration (Envoy and gRPC look the route's override up by this name).
pub const FAULT_FILTER: &str = "envoy.filters.http.fault";
/// Name of the router filter, last in the chain.
pub const ROUTER_FILTER: &str = "envoy.filters.http.router";

/// What a retry is made for: Levee retries connection failures, resets, attempt timeouts,
/// HTTP 408, 429, 502, 503, 504 and gRPC UNAVAILABLE (`ErrorKind::is_retryable`). Envoy's
/// `gateway-error` is 502, 503, 504 and a per-try timeout; gRPC reads only the gRPC codes
/// and ignores the rest.
pub const RETRY_ON: &str =
    "connect-failure,refused-stream,reset,gateway-error,retriable-status-codes,unavailable";
/// The HTTP statuses `retriable-status-codes` adds to `gateway-error`.
pub const RETRIABLE_STATUS_CODES: [u32; 2] = [408, 429];
/// The HTTP status of a fault rule's `connection_error`: there is no connection fault in
/// xDS; 503 is what a proxy answers for an unreachable upstream (gRPC: UNAVAILABLE, which
/// is retryable like a connection error).
pub const CONNECTION_ERROR_STATUS: u32 = 503;

/// Endpoints of dependencies, per environment, from the server's settings
/// (`xds_endpoints`): Levee stores policies, not where services run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Endpoints {
    by_dependency: BTreeMap<(String, String), Vec<SocketAddr>>,
}

impl Endpoints {
    /// Parses `ENVIRONMENT/DEPENDENCY=IP:PORT` entries; an entry per endpoint, several for
    /// one dependency add up.
    ///
    /// # Errors
    /// The first entry not of that form, with why.
    pub fn parse<'a>(entries: impl IntoIterator<Item = &'a str>) -> Result<Endpoints, String> {
        let mut out = Endpoints::default();
        for e in entries {
            let (key, addr) = e.split_once('=').ok_or_else(|| {
                format!(
                    "{e:?}: an endpoint is ENVIRONMENT/DEPENDENCY=IP:PORT (e.g. prod/pricing=10.0.0.7:8080)"
                )
            })?;
            let (env, dep) = key
                .trim()
                .split_once('/')
                .ok_or_else(|| format!("{e:?}: the key is ENVIRONMENT/DEPENDENCY (e.g. prod/pricing)"))?;
            for (what, name) in [("environment", env), ("dependency", dep)] {
                levee_agent::policy::check_name(name)
                    .map_err(|why| format!("{e:?}: the {what} name {why}"))?;
            }
            let addr: SocketAddr = addr.trim().parse().map_err(|_| {
                format!("{e:?}: {:?} is not IP:PORT (xDS endpoints are addresses, not names)", addr.trim())
            })?;
            out.by_dependency.entry((env.to_string(), dep.to_string())).or_default().push(addr);
        }
        Ok(out)
    }

    /// The endpoints of `dependency` in `environment` (none when the settings name none).
    pub fn of(&self, environment: &str, dependency: &str) -> &[SocketAddr] {
        self.by_dependency.get(&(environment.to_string(), dependency.to_string())).map_or(&[], Vec::as_slice)
    }
}

/// One resource: its name and the message packed as `Any`.
#[derive(Clone, Debug, PartialEq)]
pub struct Named {
    pub name: String,
    pub resource: Any,
}

/// Every resource of one service's revision, by type.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Resources {
    pub listeners: Vec<Named>,
    pub routes: Vec<Named>,
    pub clusters: Vec<Named>,
    pub endpoints: Vec<Named>,
}

impl Resources {
    /// The resources of `type_url` (None: a type this server does not serve).
    pub fn of_type(&self, type_url: &str) -> Option<&[Named]> {
        Some(match type_url {
            LISTENER => &self.listeners,
            ROUTE => &self.routes,
            CLUSTER => &self.clusters,
            ENDPOINT => &self.endpoints,
            _ => return None,
        })
    }
}

fn pack<T: Message + Name>(m: &T) -> Any {
    Any { type_url: T::type_url(), value: m.encode_to_vec() }
}

fn duration(d: Duration) -> PbDuration {
    PbDuration { seconds: d.as_secs() as i64, nanos: d.subsec_nanos() as i32 }
}

fn u32v(value: u32) -> UInt32Value {
    UInt32Value { value }
}

fn ads() -> ConfigSource {
    ConfigSource {
        resource_api_version: ApiVersion::V3 as i32,
        config_source_specifier: Some(config_source::ConfigSourceSpecifier::Ads(AggregatedConfigSource {})),
        ..Default::default()
    }
}

/// A percentage of Levee (0 to 100, fractional) in millionths.
fn fraction(percent: f64) -> FractionalPercent {
    FractionalPercent {
        numerator: (percent.clamp(0.0, 100.0) * 10_000.0).round() as u32,
        denominator: fractional_percent::DenominatorType::Million as i32,
    }
}

/// Builds every resource of `config`, the configuration of a service in `environment`, as
/// served at `now` (fault rules, breaker overrides and levers past their expiry are left out,
/// as the agent leaves them out).
pub fn build(environment: &str, config: &ServiceConfig, endpoints: &Endpoints, now: Timestamp) -> Resources {
    let mut out = Resources::default();
    let policy = &config.policy;
    let retries_paused = match &config.levers {
        Some(l) if l.expires_at > now => l.retries_paused.unwrap_or(policy.inbound.retries_paused),
        _ => policy.inbound.retries_paused,
    };
    for (name, dep) in &policy.dependencies {
        let route_ctx = RouteCtx { config, name, dep, retries_paused, now };
        out.listeners.push(Named { name: name.clone(), resource: pack(&listener(name)) });
        out.routes.push(Named { name: name.clone(), resource: pack(&route_ctx.route_configuration()) });
        out.clusters.push(Named { name: name.clone(), resource: pack(&cluster(name, dep)) });
        out.endpoints.push(Named {
            name: name.clone(),
            resource: pack(&load_assignment(name, endpoints.of(environment, name))),
        });
    }
    out
}

/// An API listener (no address: the client is the proxy) whose connection manager takes
/// its routes from RDS over the same ADS stream, with the fault filter before the router.
fn listener(name: &str) -> Listener {
    let hcm = HttpConnectionManager {
        stat_prefix: name.to_string(),
        route_specifier: Some(http_connection_manager::RouteSpecifier::Rds(Rds {
            config_source: Some(ads()),
            route_config_name: name.to_string(),
        })),
        http_filters: vec![
            HttpFilter {
                name: FAULT_FILTER.to_string(),
                // Empty: each route says its faults (`typed_per_filter_config`).
                config_type: Some(http_filter::ConfigType::TypedConfig(pack(&HttpFault::default()))),
                ..Default::default()
            },
            HttpFilter {
                name: ROUTER_FILTER.to_string(),
                config_type: Some(http_filter::ConfigType::TypedConfig(pack(&Router::default()))),
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    Listener {
        name: name.to_string(),
        api_listener: Some(ApiListener { api_listener: Some(pack(&hcm)) }),
        ..Default::default()
    }
}

struct RouteCtx<'a> {
    config: &'a ServiceConfig,
    name: &'a str,
    dep: &'a DependencyPolicy,
    retries_paused: bool,
    now: Timestamp,
}

impl RouteCtx<'_> {
    /// One virtual host for every authority: a route per operation whose name can be
    /// matched (a gRPC method or a path template), then the dependency's own.
    fn route_configuration(&self) -> RouteConfiguration {
        let mut routes = Vec::new();
        for (op, o) in &self.dep.operations {
            let Some(matcher) = operation_match(op) else { continue };
            let attempt = o.attempt_timeout.unwrap_or(self.dep.attempt_timeout);
            let retry = o.retry.as_ref().unwrap_or(&self.dep.retry);
            // An operation known not to be idempotent is never retried.
            let retry = if o.idempotent == Some(false) { None } else { Some(retry) };
            routes.push(self.route(op, matcher, attempt, retry, Some(op)));
        }
        let all = RouteMatch {
            path_specifier: Some(route_match::PathSpecifier::Prefix("/".to_string())),
            ..Default::default()
        };
        routes.push(self.route(self.name, all, self.dep.attempt_timeout, Some(&self.dep.retry), None));
        RouteConfiguration {
            name: self.name.to_string(),
            virtual_hosts: vec![VirtualHost {
                name: self.name.to_string(),
                domains: vec!["*".to_string()],
                routes,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn route(
        &self,
        name: &str,
        matcher: RouteMatch,
        attempt_timeout: Duration,
        retry: Option<&Retry>,
        operation: Option<&str>,
    ) -> Route {
        let policy = &self.config.policy;
        let attempt = self.dep.criticality.attempt_cap(attempt_timeout, policy.non_critical_cap);
        let attempts = match retry {
            Some(r) if !self.retries_paused => r.max_attempts.max(1),
            _ => 1,
        };
        // The longest a call can last: its attempts and the longest backoff between them,
        // and never past the request's deadline.
        let backoffs = retry.map_or(Duration::ZERO, |r| r.cap) * (attempts - 1);
        let whole = attempt * attempts + backoffs;
        let retry_policy = retry.filter(|_| attempts > 1).map(|r| RetryPolicy {
            retry_on: RETRY_ON.to_string(),
            num_retries: Some(u32v(attempts - 1)),
            per_try_timeout: Some(duration(attempt)),
            retriable_status_codes: RETRIABLE_STATUS_CODES.to_vec(),
            retry_back_off: Some(retry_policy::RetryBackOff {
                base_interval: Some(duration(r.base)),
                max_interval: Some(duration(r.cap.max(r.base))),
            }),
            ..Default::default()
        });
        let action = RouteAction {
            cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(self.name.to_string())),
            // Without a deadline from the caller (Envoy; gRPC reads only the next field).
            timeout: Some(duration(whole.min(policy.default_deadline))),
            max_stream_duration: Some(route_action::MaxStreamDuration {
                max_stream_duration: Some(duration(whole.min(policy.default_deadline))),
                // A caller's deadline is kept up to this (gRPC: the call's deadline).
                grpc_timeout_header_max: Some(duration(whole.min(policy.max_deadline))),
                grpc_timeout_header_offset: None,
            }),
            retry_policy,
            ..Default::default()
        };
        let mut typed_per_filter_config = std::collections::HashMap::new();
        typed_per_filter_config.insert(FAULT_FILTER.to_string(), pack(&self.faults(operation)));
        Route {
            name: name.to_string(),
            r#match: Some(matcher),
            action: Some(route::Action::Route(action)),
            typed_per_filter_config,
            ..Default::default()
        }
    }

    /// The faults of a route: the operation's rules before the dependency's (the agent
    /// tries them in that order and the first that fires decides; xDS has one abort and one
    /// delay, so the first of each is served), and a breaker forced open as an abort of every
    /// call.
    fn faults(&self, operation: Option<&str>) -> HttpFault {
        let mut fault = HttpFault::default();
        if self.forced_open(operation) {
            fault.abort = Some(FaultAbort {
                percentage: Some(fraction(100.0)),
                error_type: Some(fault_abort::ErrorType::HttpStatus(CONNECTION_ERROR_STATUS)),
            });
            return fault;
        }
        if !self.config.faults_allowed {
            return fault;
        }
        let live = |r: &&FaultRule| r.dependency == self.name && r.expires_at > self.now;
        let ops = self
            .config
            .faults
            .iter()
            .filter(live)
            .filter(|r| operation.is_some() && r.operation.as_deref() == operation);
        let deps = self.config.faults.iter().filter(live).filter(|r| r.operation.is_none());
        for rule in ops.chain(deps) {
            match &rule.action {
                FaultAction::Delay { delay } if fault.delay.is_none() => {
                    fault.delay = Some(FaultDelay {
                        percentage: Some(fraction(rule.percent)),
                        fault_delay_secifier: Some(fault_delay::FaultDelaySecifier::FixedDelay(duration(
                            *delay,
                        ))),
                    });
                }
                FaultAction::Abort { status } if fault.abort.is_none() => {
                    fault.abort = Some(FaultAbort {
                        percentage: Some(fraction(rule.percent)),
                        error_type: Some(fault_abort::ErrorType::HttpStatus(u32::from(*status))),
                    });
                }
                FaultAction::ConnectionError if fault.abort.is_none() => {
                    fault.abort = Some(FaultAbort {
                        percentage: Some(fraction(rule.percent)),
                        error_type: Some(fault_abort::ErrorType::HttpStatus(CONNECTION_ERROR_STATUS)),
                    });
                }
                _ => {}
            }
        }
        fault
    }

    /// Whether an operator forced the breaker of this route open (the operation's own, or
    /// the dependency's for the dependency's route), and the override has not expired.
    fn forced_open(&self, operation: Option<&str>) -> bool {
        self.config.breaker_overrides.iter().any(|o| {
            o.dependency == self.name
                && o.operation.as_deref() == operation
                && o.state == BreakerOverrideState::ForcedOpen
                && o.expires_at.is_none_or(|at| at > self.now)
        })
    }
}

/// How a request is matched to an operation: a gRPC method (`/shop.Pricing/Quote`) or a path
/// by its exact path, a path template with `{parameters}` by a regular expression, and a
/// leading HTTP method (`GET /users/{id}`) by the `:method` header. None for a name that
/// is not a path.
pub fn operation_match(op: &str) -> Option<RouteMatch> {
    let (method, path) = match op.split_once(' ') {
        Some((m, p)) if !m.is_empty() && m.bytes().all(|b| b.is_ascii_uppercase()) => (Some(m), p.trim()),
        _ => (None, op.trim()),
    };
    if !path.starts_with('/') || path.contains(' ') {
        return None;
    }
    let path_specifier = if path.contains('{') {
        let mut re = String::new();
        let mut rest = path;
        while let Some(open) = rest.find('{') {
            re.push_str(&escape(&rest[..open]));
            let close = rest[open..].find('}')? + open;
            re.push_str("[^/]+");
            rest = &rest[close + 1..];
        }
        re.push_str(&escape(rest));
        route_match::PathSpecifier::SafeRegex(RegexMatcher { regex: re, ..Default::default() })
    } else {
        route_match::PathSpecifier::Path(path.to_string())
    };
    let headers = method
        .map(|m| HeaderMatcher {
            name: ":method".to_string(),
            header_match_specifier: Some(header_matcher::HeaderMatchSpecifier::StringMatch(StringMatcher {
                match_pattern: Some(string_matcher::MatchPattern::Exact(m.to_string())),
                ignore_case: false,
            })),
            ..Default::default()
        })
        .into_iter()
        .collect();
    Some(RouteMatch { path_specifier: Some(path_specifier), headers, ..Default::default() })
}

/// `s` as an RE2 literal.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if r"\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A cluster whose endpoints come from EDS over the same stream: the bulkhead as the
/// concurrent-request threshold, the retry budget as Envoy's, outlier detection as is.
fn cluster(name: &str, dep: &DependencyPolicy) -> Cluster {
    let retry = &dep.retry;
    // Levee's budget is a rate (retries per success, a floor per second); Envoy's bounds
    // retries in flight: the same share of requests in flight, and the floor in flight for
    // as long as an attempt lasts (Little's law).
    let floor = (retry.budget.min_retries_per_sec * dep.attempt_timeout.as_secs_f64()).ceil().max(1.0) as u32;
    let thresholds = circuit_breakers::Thresholds {
        priority: RoutingPriority::Default as i32,
        max_requests: Some(u32v(dep.bulkhead.max_concurrent)),
        retry_budget: Some(circuit_breakers::thresholds::RetryBudget {
            budget_percent: Some(Percent { value: (retry.budget.ratio * 100.0).clamp(0.0, 100.0) }),
            min_retry_concurrency: Some(u32v(floor)),
        }),
        ..Default::default()
    };
    let outlier_detection = dep.outlier_detection.as_ref().map(|o| EnvoyOutlier {
        consecutive_5xx: Some(u32v(o.consecutive_errors)),
        enforcing_consecutive_5xx: Some(u32v(100)),
        interval: Some(duration(o.interval)),
        base_ejection_time: Some(duration(o.base_ejection_time)),
        max_ejection_percent: Some(u32v(o.max_ejection_percent)),
        // Only consecutive errors eject in Levee: Envoy's success-rate ejection is off.
        enforcing_success_rate: Some(u32v(0)),
        ..Default::default()
    });
    Cluster {
        name: name.to_string(),
        cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(cluster::DiscoveryType::Eds as i32)),
        eds_cluster_config: Some(cluster::EdsClusterConfig {
            eds_config: Some(ads()),
            service_name: name.to_string(),
        }),
        // A connection is part of an attempt.
        connect_timeout: Some(duration(dep.attempt_timeout)),
        circuit_breakers: Some(CircuitBreakers { thresholds: vec![thresholds], ..Default::default() }),
        outlier_detection,
        ..Default::default()
    }
}

fn load_assignment(name: &str, addrs: &[SocketAddr]) -> ClusterLoadAssignment {
    let lb_endpoints = addrs
        .iter()
        .map(|a| LbEndpoint {
            host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                address: Some(Address {
                    address: Some(address::Address::SocketAddress(SocketAddress {
                        address: a.ip().to_string(),
                        port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(a.port()))),
                        ..Default::default()
                    })),
                }),
                ..Default::default()
            })),
            ..Default::default()
        })
        .collect::<Vec<_>>();
    ClusterLoadAssignment {
        cluster_name: name.to_string(),
        endpoints: if lb_endpoints.is_empty() {
            Vec::new()
        } else {
            vec![LocalityLbEndpoints {
                lb_endpoints,
                // gRPC refuses endpoints without a locality, and ignores a locality
                // without a weight.
                locality: Some(Locality::default()),
                load_balancing_weight: Some(u32v(1)),
                ..Default::default()
            }]
        },
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(json: serde_json::Value) -> ServiceConfig {
        levee_agent::policy::decode_json::<ServiceConfig>(json.to_string().as_bytes())
            .expect("a valid configuration")
    }

    fn routes(c: &ServiceConfig, now: Timestamp) -> BTreeMap<String, RouteConfiguration> {
        build("prod", c, &Endpoints::default(), now)
            .routes
            .iter()
            .map(|n| (n.name.clone(), RouteConfiguration::decode(n.resource.value.as_slice()).unwrap()))
            .collect()
    }

    fn fault_of(r: &Route) -> HttpFault {
        HttpFault::decode(r.typed_per_filter_config[FAULT_FILTER].value.as_slice()).unwrap()
    }

    fn action(r: &Route) -> &RouteAction {
        match &r.action {
            Some(route::Action::Route(a)) => a,
            other => panic!("a route action, not {other:?}"),
        }
    }

    #[test]
    fn endpoints_are_environment_dependency_and_an_address() {
        let e = Endpoints::parse([
            "prod/pricing=10.0.0.7:8080",
            " prod/pricing = [::1]:9000",
            "dev/pricing=127.0.0.1:1",
        ])
        .unwrap();
        assert_eq!(e.of("prod", "pricing").len(), 2);
        assert_eq!(e.of("dev", "pricing"), ["127.0.0.1:1".parse().unwrap()]);
        assert!(e.of("prod", "search").is_empty());
        for (bad, says) in [
            ("prod/pricing", "ENVIRONMENT/DEPENDENCY=IP:PORT"),
            ("pricing=10.0.0.7:80", "the key is ENVIRONMENT/DEPENDENCY"),
            ("prod/Pricing=10.0.0.7:80", "dependency name"),
            ("prod/pricing=pricing.svc:80", "not IP:PORT"),
        ] {
            let err = Endpoints::parse([bad]).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn operations_match_by_path_template_and_method() {
        let exact = operation_match("/shop.Pricing/Quote").unwrap();
        assert_eq!(
            exact.path_specifier,
            Some(route_match::PathSpecifier::Path("/shop.Pricing/Quote".into()))
        );
        assert!(exact.headers.is_empty());
        let templ = operation_match("GET /users/{id}/orders.json").unwrap();
        match templ.path_specifier {
            Some(route_match::PathSpecifier::SafeRegex(r)) => {
                assert_eq!(r.regex, r"/users/[^/]+/orders\.json")
            }
            other => panic!("a regex, not {other:?}"),
        }
        assert_eq!(templ.headers[0].name, ":method");
        assert!(operation_match("quote").is_none(), "not a path: left out");
        assert!(operation_match("/users/{id").is_none(), "an unclosed parameter: left out");
    }

    #[test]
    fn faults_operation_first_one_abort_one_delay_expired_and_disallowed_left_out() {
        let now = Timestamp::parse("2030-01-01T00:00:00Z").unwrap();
        let mut c = config(serde_json::json!({
            "faults_allowed": true,
            "policy": {"dependencies": {"pricing": {"operations": {"/p.P/Q": {}}}}},
            "faults": [
                {"id": "a", "dependency": "pricing", "action": {"type": "abort", "status": 500}, "percent": 10,
                 "expires_at": "2030-01-02T00:00:00Z"},
                {"id": "b", "dependency": "pricing", "operation": "/p.P/Q", "action": {"type": "connection_error"},
                 "percent": 25.5, "expires_at": "2030-01-02T00:00:00Z"},
                {"id": "c", "dependency": "pricing", "action": {"type": "delay", "delay": "2s"}, "percent": 50,
                 "expires_at": "2030-01-02T00:00:00Z"},
                {"id": "d", "dependency": "pricing", "action": {"type": "abort", "status": 429}, "percent": 100,
                 "expires_at": "2029-12-31T00:00:00Z"}
            ]
        }));
        let r = routes(&c, now);
        let vh = &r["pricing"].virtual_hosts[0];
        let op = fault_of(&vh.routes[0]);
        let abort = op.abort.unwrap();
        assert_eq!(abort.error_type, Some(fault_abort::ErrorType::HttpStatus(CONNECTION_ERROR_STATUS)));
        assert_eq!(abort.percentage.unwrap().numerator, 255_000);
        assert!(op.delay.is_some(), "the dependency's delay applies to its operations too");
        let all = fault_of(&vh.routes[1]);
        assert_eq!(all.abort.unwrap().error_type, Some(fault_abort::ErrorType::HttpStatus(500)), "d expired");
        c.faults_allowed = false;
        assert_eq!(fault_of(&routes(&c, now)["pricing"].virtual_hosts[0].routes[1]), HttpFault::default());
    }

    #[test]
    fn a_breaker_forced_open_aborts_every_call_and_paused_retries_retry_nothing() {
        let now = Timestamp::parse("2030-01-01T00:00:00Z").unwrap();
        let c = config(serde_json::json!({
            "policy": {"dependencies": {"pricing": {"retry": {"max_attempts": 3}}, "search": {}}},
            "breaker_overrides": [{"dependency": "pricing", "state": "forced_open"},
                                  {"dependency": "search", "state": "forced_open", "expires_at": "2029-01-01T00:00:00Z"}],
            "levers": {"retries_paused": true, "expires_at": "2030-01-01T01:00:00Z"}
        }));
        let r = routes(&c, now);
        let pricing = &r["pricing"].virtual_hosts[0].routes[0];
        assert_eq!(fault_of(pricing).abort.unwrap().percentage.unwrap().numerator, 1_000_000);
        assert!(action(pricing).retry_policy.is_none(), "retries paused by a lever");
        assert_eq!(
            fault_of(&r["search"].virtual_hosts[0].routes[0]),
            HttpFault::default(),
            "expired override"
        );
        let later = Timestamp::parse("2030-01-01T02:00:00Z").unwrap();
        let r = routes(&c, later);
        let retry = action(&r["pricing"].virtual_hosts[0].routes[0]).retry_policy.clone().unwrap();
        assert_eq!(retry.num_retries.unwrap().value, 2, "the lever expired");
    }
}
