//! The SSRF guard: which target addresses deliveries may reach.
//!
//! A tenant chooses the URL, so without a guard Entrega would POST wherever it is told,
//! including the cloud metadata service and the operator's own private network. Every
//! address is classified; forbidden ranges are refused unless the operator allowlists
//! them (`--allow-target`). The check runs on the address actually connected to (the
//! resolver below hands reqwest only checked addresses), so a DNS answer that changes
//! between check and connect cannot slip through.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use url::{Host, Url};

/// What the operator allows beyond public `https` targets.
#[derive(Debug, Clone, Default)]
pub struct TargetPolicy {
    pub allowed_ranges: Vec<IpNet>,
    pub allow_http: bool,
}

/// Why a target URL or address is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("not a valid absolute URL")]
    Malformed,
    #[error("only https targets are allowed (the operator has not allowed http)")]
    SchemeNotAllowed,
    #[error("URLs with a user name or password are not allowed")]
    Credentials,
    #[error("the target address {0} is in a forbidden range (loopback, private, link-local, …)")]
    ForbiddenAddress(IpAddr),
}

impl TargetPolicy {
    /// From `ENTREGA_ALLOW_TARGETS` (comma-separated CIDRs or addresses) and
    /// `ENTREGA_ALLOW_HTTP` (`1`/`true`), as the Lambda functions are configured.
    pub fn from_env() -> Result<Self, String> {
        let ranges = std::env::var("ENTREGA_ALLOW_TARGETS").unwrap_or_default();
        let allowed_ranges = ranges
            .split(',')
            .map(str::trim)
            .filter(|r| !r.is_empty())
            .map(|r| {
                r.parse::<IpNet>()
                    .or_else(|_| r.parse::<IpAddr>().map(IpNet::from))
                    .map_err(|_| format!("ENTREGA_ALLOW_TARGETS: `{r}` is not a CIDR range"))
            })
            .collect::<Result<_, _>>()?;
        let allow_http = matches!(
            std::env::var("ENTREGA_ALLOW_HTTP").as_deref(),
            Ok("1" | "true" | "yes")
        );
        Ok(Self {
            allowed_ranges,
            allow_http,
        })
    }

    /// Check a URL before it is stored or sent: its scheme, and its host when the host
    /// is an address (names are checked when they resolve, at connect time).
    pub fn check_url(&self, raw: &str) -> Result<Url, TargetError> {
        let url = Url::parse(raw).map_err(|_| TargetError::Malformed)?;
        match url.scheme() {
            "https" => {}
            "http" if self.allow_http => {}
            _ => return Err(TargetError::SchemeNotAllowed),
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(TargetError::Credentials);
        }
        match url.host() {
            None => return Err(TargetError::Malformed),
            Some(Host::Ipv4(ip)) => self.check_ip(IpAddr::V4(ip))?,
            Some(Host::Ipv6(ip)) => self.check_ip(IpAddr::V6(ip))?,
            // RFC 6761: these names are loopback by definition, whatever DNS says.
            Some(Host::Domain(name)) if is_localhost_name(name) => {
                self.check_ip(IpAddr::V4(Ipv4Addr::LOCALHOST))?
            }
            Some(Host::Domain(_)) => {}
        }
        Ok(url)
    }

    /// Refuse a forbidden address unless an allowlisted range contains it.
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), TargetError> {
        let ip = canonical(ip);
        if !is_forbidden(ip) || self.allowed_ranges.iter().any(|net| net.contains(&ip)) {
            Ok(())
        } else {
            Err(TargetError::ForbiddenAddress(ip))
        }
    }
}

fn is_localhost_name(name: &str) -> bool {
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost" || name.ends_with(".localhost")
}

/// IPv4-mapped and IPv4-compatible IPv6 addresses are their IPv4 address: a guard that
/// only looked at the IPv6 form would let `[::ffff:127.0.0.1]` through.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match embedded_v4(v6) {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    match s {
        // ::ffff:a.b.c.d (mapped) and ::a.b.c.d (compatible, deprecated)
        [0, 0, 0, 0, 0, 0xffff, _, _] | [0, 0, 0, 0, 0, 0, _, _]
            if v6 != Ipv6Addr::UNSPECIFIED && v6 != Ipv6Addr::LOCALHOST =>
        {
            let o = v6.octets();
            Some(Ipv4Addr::new(o[12], o[13], o[14], o[15]))
        }
        // 64:ff9b::/96 NAT64 reaches the embedded IPv4 address.
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => {
            let o = v6.octets();
            Some(Ipv4Addr::new(o[12], o[13], o[14], o[15]))
        }
        _ => None,
    }
}

/// Addresses a webhook must never reach by default.
pub fn is_forbidden(ip: IpAddr) -> bool {
    match canonical(ip) {
        IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local() // 169.254/16, the cloud metadata service
                || v4.is_multicast()
                || v4.is_broadcast()
                || v4.is_documentation()
                || a == 0 // "this network", including 0.0.0.0
                || (a == 100 && (64..128).contains(&b)) // CGNAT 100.64/10
                || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
                || (a == 198 && (b == 18 || b == 19)) // benchmarking
                || a >= 240 // reserved
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00 // unique local fc00::/7
                || (first & 0xffc0) == 0xfe80 // link-local fe80::/10
                || (first & 0xffc0) == 0xfec0 // site-local fec0::/10 (deprecated)
                || first == 0x2002 && is_forbidden_6to4(v6)
                || (first == 0x2001 && v6.segments()[1] == 0x0db8) // documentation
        }
    }
}

/// 6to4 (2002::/16) carries an IPv4 address in bits 16–48.
fn is_forbidden_6to4(v6: Ipv6Addr) -> bool {
    let o = v6.octets();
    is_forbidden(IpAddr::V4(Ipv4Addr::new(o[2], o[3], o[4], o[5])))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strict() -> TargetPolicy {
        TargetPolicy::default()
    }

    #[test]
    fn forbidden_ranges_are_classified_without_sending_anything() {
        for ip in [
            "127.0.0.1",
            "127.255.0.9",
            "10.0.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.255",
            "224.0.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "240.0.0.1",
            "::1",
            "::",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:10.1.2.3",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:1::",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert!(is_forbidden(ip), "{ip} should be forbidden");
            assert!(strict().check_ip(ip).is_err());
        }
        for ip in [
            "1.1.1.1",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert!(!is_forbidden(ip), "{ip} should be allowed");
        }
    }

    #[test]
    fn every_loopback_spelling_in_a_url_is_refused() {
        let policy = TargetPolicy {
            allowed_ranges: vec![],
            allow_http: true,
        };
        for url in [
            "http://127.0.0.1:9/x",
            "http://localhost:9/",
            "http://LOCALHOST./",
            "http://a.localhost/",
            "http://[::1]:9/",
            "http://127.1/",
            "http://0x7f000001/",
            "http://2130706433/",
            "http://[::ffff:127.0.0.1]/",
            "http://0.0.0.0/",
            "http://0177.0.0.1/",
            "http://169.254.169.254/latest/meta-data/",
            "http://[fc00::1]/",
        ] {
            assert!(
                matches!(policy.check_url(url), Err(TargetError::ForbiddenAddress(_))),
                "{url} should be refused"
            );
        }
    }

    #[test]
    fn allowlist_and_scheme_rules() {
        let policy = TargetPolicy {
            allowed_ranges: vec!["127.0.0.0/8".parse().unwrap()],
            allow_http: false,
        };
        assert_eq!(
            policy.check_url("http://example.com/"),
            Err(TargetError::SchemeNotAllowed)
        );
        assert!(policy.check_url("https://127.0.0.1:8443/hook").is_ok());
        assert!(policy.check_url("https://[::ffff:127.0.0.1]/").is_ok());
        assert!(policy.check_url("https://10.0.0.1/").is_err());
        assert_eq!(
            policy.check_url("https://u:p@example.com/"),
            Err(TargetError::Credentials)
        );
        assert_eq!(
            policy.check_url("ftp://example.com/"),
            Err(TargetError::SchemeNotAllowed)
        );
        assert_eq!(policy.check_url("not a url"), Err(TargetError::Malformed));
        assert!(policy.check_url("https://hooks.example.com/in").is_ok());
    }
}
