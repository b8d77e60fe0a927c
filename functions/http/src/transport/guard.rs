//! The SSRF guard: which target addresses deliveries may reach.
//!
//! A tenant chooses the URL, so without a guard Entrega would POST wherever it is told,
//! including the cloud metadata service and the operator's own private network. Every
//! address is classified; forbidden ranges are refused unless the operator allowlists
//! them (`--allow-target`). The check runs on the address actually connected to (the
//! resolver below hands reqwest only checked addresses), so a DNS answer that changes
//! between check and connect cannot slip through.
//!
//! IPv6 has many ways to carry an IPv4 address (mapped, translated, NAT64, 6to4,
//! Teredo, ISATAP, …), and each is classified by the IPv4 address it carries, so that
//! `[::ffff:0:127.0.0.1]` is refused like `127.0.0.1`.

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
    #[error("the host must follow `scheme://` (as in https://hooks.example.com/path)")]
    NoHostWritten,
    #[error("only https targets are allowed; an operator allows http with --allow-http (ENTREGA_ALLOW_HTTP=1)")]
    SchemeNotAllowed,
    /// Not http(s) at all: no flag allows it, so the message names none.
    #[error(
        "a webhook target is an https:// URL (or http:// where an operator allows it), not {0}://"
    )]
    SchemeUnsupported(String),
    #[error("URLs with a user name or password are not allowed")]
    Credentials,
    #[error("the target address {0} is in a forbidden range (loopback, private, link-local, …); an operator allows a range with --allow-target CIDR (ENTREGA_ALLOW_TARGETS)")]
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
        // The URL standard forgives a missing or extra slash: `http:///x` and `http:x`
        // both parse as `http://x/`. A URL without its host where a host belongs is a
        // typo, and the host it would be sent to is a guess: refuse it.
        let host_written = raw
            .split_once("://")
            .is_some_and(|(_, rest)| !rest.is_empty() && !rest.starts_with(['/', '\\']));
        if !host_written {
            return Err(TargetError::NoHostWritten);
        }
        match url.scheme() {
            "https" => {}
            "http" if self.allow_http => {}
            "http" => return Err(TargetError::SchemeNotAllowed),
            other => return Err(TargetError::SchemeUnsupported(other.to_owned())),
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

    /// Refuse a forbidden address unless the allowlist covers it: either the target
    /// itself, as [`canonical`] spells it (so allowlisting `127.0.0.0/8` also admits
    /// `::ffff:127.0.0.1`), or every address that makes it forbidden (so the address an
    /// error names is the one to allowlist). The error names the first address that makes
    /// the target forbidden and is not allowlisted.
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), TargetError> {
        let ip = canonical(ip);
        if self.allowlists(ip) {
            return Ok(());
        }
        match forbidden_because(ip).find(|&why| !self.allowlists(why)) {
            Some(why) => Err(TargetError::ForbiddenAddress(why)),
            None => Ok(()),
        }
    }

    fn allowlists(&self, ip: IpAddr) -> bool {
        self.allowed_ranges.iter().any(|net| net.contains(&ip))
    }
}

fn is_localhost_name(name: &str) -> bool {
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost" || name.ends_with(".localhost")
}

/// An IPv6 form that *is* an IPv4 address becomes that IPv4 address: a guard that only
/// looked at the IPv6 form would let `[::ffff:127.0.0.1]` through. Tunnelled forms
/// (6to4, Teredo, ISATAP) stay IPv6: they name an IPv6 host, and their IPv4 addresses
/// are only where the packets travel.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match embedded_v4(v6) {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// The IPv4 address an IPv6 address stands for, when connecting to it reaches exactly
/// that IPv4 host. Each form has a fixed place for the address: the last 32 bits.
fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    let last32 = v4_from(s[6], s[7]);
    match s {
        // ::ffff:a.b.c.d, IPv4-mapped (RFC 4291 §2.5.5.2): a dual-stack socket's IPv4 peer.
        [0, 0, 0, 0, 0, 0xffff, _, _] => Some(last32),
        // ::ffff:0:a.b.c.d, IPv4-translated (RFC 2765 §2.1): an SIIT translator forwards
        // it to the IPv4 address.
        [0, 0, 0, 0, 0xffff, 0, _, _] => Some(last32),
        // ::a.b.c.d, IPv4-compatible (RFC 4291 §2.5.5.1, deprecated). :: and ::1 are
        // IPv6's own unspecified and loopback addresses, and are classified as such.
        [0, 0, 0, 0, 0, 0, _, _] if v6 != Ipv6Addr::UNSPECIFIED && v6 != Ipv6Addr::LOCALHOST => {
            Some(last32)
        }
        // 64:ff9b::a.b.c.d, the well-known NAT64 prefix (RFC 6052 §2.1), which only ever
        // comes as a /96: a NAT64 gateway forwards to the embedded IPv4 address.
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(last32),
        _ => None,
    }
}

/// The IPv4 addresses an IPv6 address's packets are tunnelled to or through, by the
/// transition mechanisms that carry IPv6 over IPv4. The target is the IPv6 host, but a
/// tenant who puts a loopback or private IPv4 address there aims the tunnel at the
/// operator's own network, so a forbidden endpoint makes the target forbidden.
fn tunnel_endpoints(v6: Ipv6Addr) -> [Option<Ipv4Addr>; 4] {
    let (teredo_server, teredo_client) = teredo(v6).unzip();
    [six_to_four(v6), teredo_server, teredo_client, isatap(v6)]
}

/// 6to4 (2002::/16, RFC 3056 §2): the 6to4 router's IPv4 address is bits 16–48, and
/// packets are encapsulated straight to it.
fn six_to_four(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    (s[0] == 0x2002).then(|| v4_from(s[1], s[2]))
}

/// Teredo (2001::/32, RFC 4380 §4): the Teredo server's IPv4 address is bits 32–64 and
/// the client's is the last 32 bits, inverted so that NATs leave it alone. Returns
/// `(server, client)`.
fn teredo(v6: Ipv6Addr) -> Option<(Ipv4Addr, Ipv4Addr)> {
    let s = v6.segments();
    (s[0] == 0x2001 && s[1] == 0).then(|| (v4_from(s[2], s[3]), !v4_from(s[6], s[7])))
}

/// ISATAP (RFC 5214 §6.1): an interface identifier `0:5efe:a.b.c.d`, or `200:5efe:…`
/// with the universal/local bit set for a global IPv4 address, names the node's IPv4
/// address under any prefix — the link-local one or a global one a router advertises.
fn isatap(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    ((s[4] & !0x0200) == 0 && s[5] == 0x5efe).then(|| v4_from(s[6], s[7]))
}

fn v4_from(high: u16, low: u16) -> Ipv4Addr {
    Ipv4Addr::from((u32::from(high) << 16) | u32::from(low))
}

/// Addresses a webhook must never reach by default.
pub fn is_forbidden(ip: IpAddr) -> bool {
    forbidden_because(ip).next().is_some()
}

/// Every address that makes `ip` forbidden, none for a reachable target: the target
/// itself (as [`canonical`] spells it) if it is in a forbidden range, then each
/// [`tunnel_endpoints`] address that is.
fn forbidden_because(ip: IpAddr) -> impl Iterator<Item = IpAddr> {
    let ip = canonical(ip);
    let endpoints = match ip {
        IpAddr::V6(v6) => tunnel_endpoints(v6),
        IpAddr::V4(_) => [None; 4],
    };
    std::iter::once(ip)
        .chain(endpoints.into_iter().flatten().map(IpAddr::V4))
        .filter(|&addr| in_forbidden_range(addr))
}

/// The ranges themselves, with no look inside an IPv6 address for an IPv4 one.
fn in_forbidden_range(ip: IpAddr) -> bool {
    match ip {
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
            let s = v6.segments();
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00 // unique local fc00::/7
                || (s[0] & 0xffc0) == 0xfe80 // link-local fe80::/10
                || (s[0] & 0xffc0) == 0xfec0 // site-local fec0::/10 (deprecated)
                || is_local_nat64(v6)
                || s[..4] == [0x100, 0, 0, 0] // discard-only 100::/64 (RFC 6666)
                || s[..3] == [0x2001, 2, 0] // benchmarking 2001:2::/48 (RFC 5180)
                || (s[0] == 0x2001 && (s[1] & 0xfff0) == 0x20) // ORCHIDv2 2001:20::/28
                || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation 2001:db8::/32
                || (s[0] == 0x3fff && (s[1] & 0xf000) == 0) // documentation 3fff::/20
        }
    }
}

/// 64:ff9b::/32 outside the well-known /96 (which [`canonical`] has already turned into
/// its IPv4 address): the local-use prefix 64:ff9b:1::/48 (RFC 8215), and the rest of
/// the /32, unassigned space where no public address lives.
//
// The whole range is refused rather than read. A local-use prefix is by definition a
// site's own translator, not globally reachable, so it only ever leads into some site's
// network, like fc00::/7; a public receiver is reachable by its public address anyway.
// And where the IPv4 address sits depends on a prefix length only that site knows
// (RFC 6052 §2.2: /48, /56, /64 or /96 within the /48, skipping bits 64–72), so any
// reading of it would be a guess. An operator whose receivers sit behind such a
// translator allowlists the range.
fn is_local_nat64(v6: Ipv6Addr) -> bool {
    let s = v6.segments();
    s[0] == 0x64 && s[1] == 0xff9b
}

#[cfg(test)]
#[path = "guard_tests.rs"]
mod tests;
