//! An engine's URL, and the ZeroMQ endpoints its description names rewritten to be reachable
//! from here: an engine reports where it bound (`tcp://*:5557`, or, for SGLang, the loopback
//! address a wildcard bind is reachable on), and only the URL says which host that is
//! (`docs/engine-discovery.md`, "Endpoints").

use std::net::IpAddr;

/// An engine's HTTP base URL: `http://host[:port][/prefix]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineUrl {
    /// As the URL writes it: a name, an IPv4 address or a bracketed IPv6 address.
    pub host: String,
    pub port: u16,
    /// `""` or a path prefix without its trailing `/` (a proxy in front of the engine).
    pub prefix: String,
}

impl EngineUrl {
    /// Parse `text`; the error says what is wrong (the caller names the field).
    pub fn parse(text: &str) -> Result<EngineUrl, String> {
        let rest = if let Some(rest) = text.strip_prefix("http://") {
            rest
        } else if text.starts_with("https://") {
            return Err(
                "https is not supported: the engine's HTTP server is read over http://".into(),
            );
        } else {
            return Err("expected http://host[:port]".into());
        };
        let (authority, path) = match rest.find('/') {
            Some(at) => rest.split_at(at),
            None => (rest, ""),
        };
        if path.contains(['?', '#']) || authority.contains(['?', '#', '@']) {
            return Err(
                "a URL with user info, a query or a fragment is not an engine's base URL".into(),
            );
        }
        let (host, port) = split_host_port(authority)?;
        let port = match port {
            None => 80,
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| format!("port {p:?} is not a number in 1..=65535"))?,
        };
        check_host(&host)?;
        Ok(EngineUrl {
            host,
            port,
            prefix: path.trim_end_matches('/').to_owned(),
        })
    }

    /// The host without brackets, as a connection and a host rule take it.
    pub fn bare_host(&self) -> &str {
        self.host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(&self.host)
    }

    /// The URL in its canonical form (no trailing `/`).
    pub fn to_url(&self) -> String {
        format!("http://{}:{}{}", self.host, self.port, self.prefix)
    }

    /// `host:port`, the instance id an engine gets when the request names none.
    pub fn authority(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// Split `host[:port]`; IPv6 must be bracketed.
fn split_host_port(authority: &str) -> Result<(String, Option<&str>), String> {
    if authority.starts_with('[') {
        let end = authority
            .find(']')
            .ok_or("an IPv6 host needs its closing bracket")?;
        let (host, rest) = authority.split_at(end + 1);
        return match rest {
            "" => Ok((host.to_owned(), None)),
            _ => match rest.strip_prefix(':') {
                Some(port) => Ok((host.to_owned(), Some(port))),
                None => Err(format!("unexpected {rest:?} after the host")),
            },
        };
    }
    match authority.split_once(':') {
        Some((_, port)) if port.contains(':') => {
            Err("an IPv6 host must be written in brackets".into())
        }
        Some((host, port)) => Ok((host.to_owned(), Some(port))),
        None => Ok((authority.to_owned(), None)),
    }
}

fn check_host(host: &str) -> Result<(), String> {
    if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return v6
            .parse::<std::net::Ipv6Addr>()
            .map(|_| ())
            .map_err(|_| format!("{v6:?} is not an IPv6 address"));
    }
    let ok = !host.is_empty()
        && host.len() <= 253
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(format!("{host:?} is not a host name or an IP address"))
    }
}

/// An engine-reported endpoint made reachable from here: a wildcard or loopback host becomes
/// the engine's host (`url.host`, IPv6 kept bracketed); any other host is kept. Only
/// `tcp://host:port` with a non-zero port names a socket another machine can subscribe to.
pub fn reachable_endpoint(reported: &str, url: &EngineUrl) -> Result<String, String> {
    let rest = reported.strip_prefix("tcp://").ok_or_else(|| {
        format!("{reported:?} is not a tcp:// endpoint another host can subscribe to")
    })?;
    let (host, port) = rest
        .rsplit_once(':')
        .ok_or_else(|| format!("{reported:?} has no port"))?;
    match port.parse::<u16>() {
        Ok(p) if p != 0 => {}
        _ => {
            return Err(format!(
                "{reported:?}: the port must be a number in 1..=65535"
            ));
        }
    }
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let host = if stands_for_engine(bare) {
        url.host.clone()
    } else if bare.parse::<std::net::Ipv6Addr>().is_ok() {
        format!("[{bare}]")
    } else {
        check_host(bare).map_err(|e| format!("{reported:?}: {e}"))?;
        bare.to_owned()
    };
    Ok(format!("tcp://{host}:{port}"))
}

/// A host that names "the engine's own machine" as the engine sees it: a wildcard bind or a
/// loopback address.
fn stands_for_engine(host: &str) -> bool {
    match host {
        "*" | "localhost" | "" => true,
        _ => host
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.is_unspecified() || ip.to_canonical().is_loopback()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(text: &str) -> EngineUrl {
        EngineUrl::parse(text).unwrap()
    }

    #[test]
    fn urls_parse_with_default_port_prefix_and_bracketed_ipv6() {
        let u = url("http://10.0.0.5:8000");
        assert_eq!(
            (u.host.as_str(), u.port, u.prefix.as_str()),
            ("10.0.0.5", 8000, "")
        );
        assert_eq!(url("http://engine.ns.svc").port, 80);
        let u = url("http://[fd00::1]:8000/vllm/");
        assert_eq!(
            (u.host.as_str(), u.bare_host(), u.prefix.as_str()),
            ("[fd00::1]", "fd00::1", "/vllm")
        );
        assert_eq!(u.to_url(), "http://[fd00::1]:8000/vllm");
        assert_eq!(u.authority(), "[fd00::1]:8000");
    }

    #[test]
    fn bad_urls_say_why() {
        for (text, why) in [
            ("https://e:8000", "https"),
            ("ftp://e", "expected http://"),
            ("http://fd00::1:8000", "brackets"),
            ("http://e:0", "1..=65535"),
            ("http://e:99999", "1..=65535"),
            ("http://user@e:80", "user info"),
            ("http://e:80/x?y", "query"),
            ("http://:80", "host name"),
            ("http://[zz]:80", "IPv6"),
        ] {
            let e = EngineUrl::parse(text).unwrap_err();
            assert!(e.contains(why), "{text}: {e}");
        }
    }

    #[test]
    fn wildcard_and_loopback_hosts_become_the_engine_host() {
        let v4 = url("http://10.1.2.3:8000");
        let v6 = url("http://[fd00::7]:8000");
        for reported in [
            "tcp://*:5557",
            "tcp://0.0.0.0:5557",
            "tcp://127.0.0.1:5557",
            "tcp://[::]:5557",
            "tcp://[::1]:5557",
            "tcp://localhost:5557",
        ] {
            assert_eq!(
                reachable_endpoint(reported, &v4).unwrap(),
                "tcp://10.1.2.3:5557"
            );
            assert_eq!(
                reachable_endpoint(reported, &v6).unwrap(),
                "tcp://[fd00::7]:5557"
            );
        }
        // vLLM's IPv6 wildcard check is `"::" in endpoint`: unbracketed too.
        assert_eq!(
            reachable_endpoint("tcp://:::5558", &v4).unwrap(),
            "tcp://10.1.2.3:5558"
        );
    }

    #[test]
    fn other_hosts_are_kept_and_bad_endpoints_refused() {
        let u = url("http://10.1.2.3:8000");
        assert_eq!(
            reachable_endpoint("tcp://10.9.9.9:5557", &u).unwrap(),
            "tcp://10.9.9.9:5557"
        );
        assert_eq!(
            reachable_endpoint("tcp://fd00::9:5557", &u).unwrap(),
            "tcp://[fd00::9]:5557"
        );
        assert_eq!(
            reachable_endpoint("tcp://node-3:5557", &u).unwrap(),
            "tcp://node-3:5557"
        );
        for bad in [
            "ipc:///tmp/kv",
            "inproc://cache",
            "tcp://*:0",
            "tcp://*",
            "tcp://a b:1",
        ] {
            assert!(reachable_endpoint(bad, &u).is_err(), "{bad}");
        }
    }
}
