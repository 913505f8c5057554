//! What a registration may ask for: which hosts the service connects out to, how long its names
//! may be, and how many subscriptions there may be. Every refusal names the field (as the caller
//! spelled it) and the label it is counted under in `conductor_registrations_refused_total`.
//!
//! Host names in endpoints are matched by name only, never resolved: a resolution at
//! registration time would not bind the addresses the subscriber connects to later.

use std::net::IpAddr;

use crate::error::OpError;
use crate::model::{FieldNames, PublisherConfig};

/// Default of `max_subscriptions`: a fleet of 512 engines with 8 DP ranks each.
pub const DEFAULT_MAX_SUBSCRIPTIONS: usize = 4096;
/// Default of `max_name_bytes`: far above real model, adapter and instance names.
pub const DEFAULT_MAX_NAME_BYTES: usize = 256;
/// Longest endpoint: `tcp://`, a host name of the DNS maximum (253), a port, with room to spare.
/// Fixed, unlike names: it follows from the format, not from a deployment.
pub const MAX_ENDPOINT_BYTES: usize = 512;

/// One entry of `allowed_endpoint_hosts`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostRule {
    /// A host name, lower-cased; matches that name only.
    Name(String),
    /// An address and prefix length (a bare address is a full-length prefix).
    Net { addr: IpAddr, prefix: u8 },
}

impl HostRule {
    /// `10.0.0.0/8`, `fd00::/8`, `192.168.1.7`, `::1` or a host name.
    pub fn parse(text: &str) -> Result<HostRule, String> {
        let text = text.trim();
        let (addr, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        if let Ok(addr) = addr.parse::<IpAddr>() {
            let addr = addr.to_canonical();
            let max = if addr.is_ipv4() { 32 } else { 128 };
            let prefix = match prefix {
                None => max,
                Some(p) => p
                    .parse::<u8>()
                    .ok()
                    .filter(|p| *p <= max)
                    .ok_or_else(|| format!("{text:?}: the prefix length must be 0..={max}"))?,
            };
            return Ok(HostRule::Net { addr, prefix });
        }
        let name_ok = prefix.is_none()
            && !text.is_empty()
            && text
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_');
        if !name_ok {
            return Err(format!(
                "{text:?} is neither an IP address, a CIDR block nor a host name"
            ));
        }
        Ok(HostRule::Name(text.to_ascii_lowercase()))
    }

    fn matches(&self, host: &Host<'_>) -> bool {
        match (self, host) {
            (HostRule::Name(name), Host::Name(h)) => name.eq_ignore_ascii_case(h),
            (HostRule::Net { addr, prefix }, Host::Ip(ip)) => in_prefix(*addr, *prefix, *ip),
            _ => false,
        }
    }
}

fn in_prefix(net: IpAddr, prefix: u8, ip: IpAddr) -> bool {
    match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(i)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            u32::from(n) & mask == u32::from(i) & mask
        }
        (IpAddr::V6(n), IpAddr::V6(i)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            u128::from(n) & mask == u128::from(i) & mask
        }
        _ => false,
    }
}

enum Host<'a> {
    Ip(IpAddr),
    Name(&'a str),
}

/// The host of a validated `tcp://host:port` endpoint.
fn endpoint_host(endpoint: &str) -> Option<Host<'_>> {
    let rest = endpoint.strip_prefix("tcp://")?;
    let (host, _port) = rest.rsplit_once(':')?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    Some(match host.parse::<IpAddr>() {
        // An IPv4-mapped IPv6 address is the IPv4 address it carries.
        Ok(ip) => Host::Ip(ip.to_canonical()),
        Err(_) => Host::Name(host),
    })
}

/// A refused registration: the answer, and the label it is counted under.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub label: &'static str,
    pub error: OpError,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistrationPolicy {
    /// `None`: any host.
    pub allowed_hosts: Option<Vec<HostRule>>,
    pub max_subscriptions: usize,
    pub max_name_bytes: usize,
}

impl Default for RegistrationPolicy {
    fn default() -> Self {
        RegistrationPolicy {
            allowed_hosts: None,
            max_subscriptions: DEFAULT_MAX_SUBSCRIPTIONS,
            max_name_bytes: DEFAULT_MAX_NAME_BYTES,
        }
    }
}

impl RegistrationPolicy {
    /// Names and endpoints of one registration.
    pub fn check(&self, config: &PublisherConfig, names: FieldNames) -> Result<(), Refusal> {
        let seed = config.hash_profile.python_hash_seed();
        let names_max = (self.max_name_bytes, "max_name_bytes");
        let endpoints_max = (MAX_ENDPOINT_BYTES, "the longest endpoint");
        let lengths = [
            (
                "instance_id",
                "instance_id",
                config.instance_id.as_str(),
                names_max,
            ),
            ("endpoint", "endpoint", &config.endpoint, endpoints_max),
            (
                "replay_endpoint",
                "replay_endpoint",
                &config.replay_endpoint,
                endpoints_max,
            ),
            (
                "model_name",
                names.model_name,
                &config.model_name,
                names_max,
            ),
            ("lora_name", "lora_name", &config.lora_name, names_max),
            ("tenant_id", "tenant_id", &config.tenant_id, names_max),
            ("python_hash_seed", "python_hash_seed", seed, names_max),
        ];
        for (label, field, value, (max, what)) in lengths {
            if value.len() > max {
                let message = format!(
                    "{field} is {} bytes; the limit is {max} ({what})",
                    value.len()
                );
                return Err(Refusal {
                    label,
                    error: OpError::invalid(field, "too_long", message),
                });
            }
        }
        let endpoints = [
            ("endpoint", config.endpoint.as_str()),
            ("replay_endpoint", &config.replay_endpoint),
        ];
        for (field, endpoint) in endpoints {
            if endpoint.is_empty() || self.host_allowed(endpoint) {
                continue;
            }
            let message =
                format!("{field} {endpoint:?}: the host is not in allowed_endpoint_hosts");
            return Err(Refusal {
                label: field,
                error: OpError::invalid(field, "not_allowed", message),
            });
        }
        Ok(())
    }

    /// Whether `tcp://host:port`'s host is allowed (any host without `allowed_endpoint_hosts`).
    pub fn host_allowed(&self, endpoint: &str) -> bool {
        let Some(rules) = &self.allowed_hosts else {
            return true;
        };
        endpoint_host(endpoint).is_some_and(|host| rules.iter().any(|r| r.matches(&host)))
    }

    /// Whether one more subscription fits next to `current` ones.
    pub fn check_capacity(&self, current: usize) -> Result<(), Refusal> {
        if current < self.max_subscriptions {
            return Ok(());
        }
        let message = format!(
            "{current} subscriptions are registered, the limit (max_subscriptions); unregister one first"
        );
        Err(Refusal {
            label: "max_subscriptions",
            error: OpError {
                reason: "limit_exceeded",
                ..OpError::invalid_registration(message)
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::registration::{HTTP_NAMES, PYTHON_NAMES};

    fn config(endpoint: &str) -> PublisherConfig {
        PublisherConfig::test_vllm("i", endpoint)
    }

    fn allowing(rules: &[&str]) -> RegistrationPolicy {
        RegistrationPolicy {
            allowed_hosts: Some(rules.iter().map(|r| HostRule::parse(r).unwrap()).collect()),
            ..Default::default()
        }
    }

    fn allowed(policy: &RegistrationPolicy, endpoint: &str) -> bool {
        policy.check(&config(endpoint), PYTHON_NAMES).is_ok()
    }

    #[test]
    fn hosts_match_by_cidr_address_or_name() {
        let p = allowing(&[
            "10.0.0.0/8",
            "192.168.1.7",
            "fd00::/8",
            "::1",
            "Pub.Internal",
        ]);
        for ok in [
            "tcp://10.255.0.1:5557",
            "tcp://192.168.1.7:1",
            "tcp://[fd12::1]:5557",
            "tcp://[::1]:5557",
            "tcp://[::ffff:10.1.2.3]:5557",
            "tcp://pub.internal:5557",
            "tcp://PUB.internal:5557",
        ] {
            assert!(allowed(&p, ok), "{ok}");
        }
        for refused in [
            "tcp://11.0.0.1:5557",
            "tcp://192.168.1.8:1",
            "tcp://[fe80::1]:5557",
            "tcp://[::2]:5557",
            "tcp://other.internal:5557",
            "tcp://pub.internal.evil:5557",
            "tcp://localhost:5557",
        ] {
            let e = p.check(&config(refused), PYTHON_NAMES).unwrap_err();
            assert_eq!(e.label, "endpoint");
            assert_eq!(
                (e.error.field.as_deref(), e.error.reason),
                (Some("endpoint"), "not_allowed")
            );
            assert!(
                e.error.message.contains("allowed_endpoint_hosts"),
                "{}",
                e.error.message
            );
        }
        assert!(allowed(&allowing(&["0.0.0.0/0"]), "tcp://8.8.8.8:1"));
        assert!(
            !allowed(&allowing(&["0.0.0.0/0"]), "tcp://[::1]:1"),
            "v4 rules only match v4"
        );
        assert!(allowed(&allowing(&["::/0"]), "tcp://[2001:db8::1]:1"));
        assert!(allowed(&RegistrationPolicy::default(), "tcp://anything:1"));
    }

    #[test]
    fn the_replay_endpoint_is_checked_too() {
        let p = allowing(&["127.0.0.1"]);
        let mut c = config("tcp://127.0.0.1:1");
        c.replay_endpoint = "tcp://127.0.0.2:2".into();
        let e = p.check(&c, PYTHON_NAMES).unwrap_err();
        assert_eq!(e.error.field.as_deref(), Some("replay_endpoint"));
    }

    #[test]
    fn bad_rules_are_errors() {
        for bad in [
            "10.0.0.0/33",
            "::/129",
            "10.0.0.0/x",
            "",
            "a b",
            "host/8",
            "*",
        ] {
            assert!(HostRule::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            HostRule::parse("::ffff:10.0.0.1").unwrap(),
            HostRule::parse("10.0.0.1").unwrap()
        );
    }

    #[test]
    fn long_names_are_refused_naming_the_callers_field() {
        let p = RegistrationPolicy {
            max_name_bytes: 4,
            ..Default::default()
        };
        let mut c = config("tcp://h:1");
        assert!(
            p.check(&c, PYTHON_NAMES).is_err(),
            "the endpoint is 9 bytes"
        );
        let p = RegistrationPolicy {
            max_name_bytes: 16,
            ..Default::default()
        };
        c.model_name = "m".repeat(17);
        let e = p.check(&c, HTTP_NAMES).unwrap_err();
        assert_eq!(
            (e.label, e.error.field.as_deref()),
            ("model_name", Some("modelname"))
        );
        assert_eq!(e.error.reason, "too_long");
        assert!(e.error.message.contains("max_name_bytes"));
        c.model_name = "m".repeat(16);
        assert!(p.check(&c, HTTP_NAMES).is_ok(), "the limit itself is fine");
        c.lora_name = "é".repeat(9);
        let e = p.check(&c, PYTHON_NAMES).unwrap_err();
        assert_eq!(
            e.error.field.as_deref(),
            Some("lora_name"),
            "bytes, not characters"
        );
    }

    #[test]
    fn the_subscription_cap() {
        let p = RegistrationPolicy {
            max_subscriptions: 2,
            ..Default::default()
        };
        assert!(p.check_capacity(1).is_ok());
        let e = p.check_capacity(2).unwrap_err();
        assert_eq!(
            (e.label, e.error.reason),
            ("max_subscriptions", "limit_exceeded")
        );
        assert!(e.error.message.contains("max_subscriptions"));
    }
}
