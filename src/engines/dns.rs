//! A fleet from a name (`engines_dns`): every address the name resolves to is an engine, as a
//! Kubernetes headless Service lists its ready pods. The name is resolved again every
//! `refresh`; addresses that appear are followed, addresses that go are removed. A failed
//! lookup changes nothing (a DNS outage must not unregister a healthy fleet).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::error::OpError;
use crate::gateway::engines_api::EngineRequest;

use super::fleet::Fleet;
use super::spec::{EngineSpec, Origin};

/// The `engines_dns` key: a `host:port` name and what every engine behind it shares.
#[derive(Debug, Clone, PartialEq)]
pub struct DnsFleet {
    pub name: String,
    /// The fields every engine of the name shares (its `url` and `instance_id` are set per
    /// address).
    pub template: EngineRequest,
    pub refresh: Duration,
}

impl DnsFleet {
    /// The specs of the engines at `addresses`.
    fn specs(&self, addresses: &[std::net::SocketAddr]) -> Vec<EngineSpec> {
        let mut specs = Vec::new();
        for address in addresses {
            let mut request = self.template.clone();
            request.url = Some(format!("http://{address}"));
            request.instance_id = None;
            match EngineSpec::from_request(request, "type", Origin::Dns) {
                Ok(spec) => specs.push(spec),
                Err(e) => tracing::warn!("engines_dns {}: {address} skipped: {e}", self.name),
            }
        }
        specs
    }

    /// Check the template once, at start (the configuration's error names the field).
    pub fn check(&self) -> Result<(), OpError> {
        let mut request = self.template.clone();
        request.url = Some(format!("http://{}", self.name));
        EngineSpec::from_request(request, "type", Origin::Dns).map(|_| ())
    }
}

/// Resolve `dns.name` every `dns.refresh` and follow its addresses, until `stop`.
pub async fn follow(fleet: Arc<Fleet>, dns: DnsFleet, stop: CancellationToken) {
    let mut tick = tokio::time::interval(dns.refresh);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_error: Option<String> = None;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        match tokio::net::lookup_host(dns.name.as_str()).await {
            Ok(found) => {
                let mut addresses: Vec<_> = found.collect();
                addresses.sort();
                addresses.dedup();
                last_error = None;
                fleet.set_origin(Origin::Dns, dns.specs(&addresses)).await;
            }
            Err(e) => {
                let why = e.to_string();
                if last_error.as_ref() != Some(&why) {
                    tracing::warn!("engines_dns {}: lookup failed, fleet kept: {why}", dns.name);
                }
                last_error = Some(why);
            }
        }
    }
}
