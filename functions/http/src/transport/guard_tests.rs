//! The SSRF guard's classification of targets: forbidden ranges, every spelling of an IPv4
//! address inside IPv6, the allowlist and the scheme rules.

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
    // No flag allows another scheme, so its refusal names none, even with http on.
    let with_http = TargetPolicy {
        allow_http: true,
        ..policy.clone()
    };
    for p in [&policy, &with_http] {
        let refused = p.check_url("ftp://example.com/").unwrap_err();
        assert_eq!(refused, TargetError::SchemeUnsupported("ftp".into()));
        assert!(!refused.to_string().contains("--allow-http"), "{refused}");
    }
    assert_eq!(policy.check_url("not a url"), Err(TargetError::Malformed));
    for typo in [
        "https:///hooks",
        "https:hooks.example.com/",
        "https:/hooks.example.com/",
    ] {
        assert_eq!(
            policy.check_url(typo),
            Err(TargetError::NoHostWritten),
            "{typo}"
        );
    }
    assert!(policy.check_url("https://hooks.example.com/in").is_ok());
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn v4(s: &str) -> IpAddr {
    IpAddr::V4(s.parse().unwrap())
}

/// Each refused spelling must be forbidden, refused by the strict policy naming
/// `culprit`; each allowed spelling must be accepted.
fn assert_classified(refused: &[(&str, &str)], allowed: &[&str]) {
    for &(addr, culprit) in refused {
        assert!(is_forbidden(ip(addr)), "{addr} should be forbidden");
        assert_eq!(
            strict().check_ip(ip(addr)),
            Err(TargetError::ForbiddenAddress(ip(culprit))),
            "{addr} should be refused because of {culprit}"
        );
    }
    for &addr in allowed {
        assert!(!is_forbidden(ip(addr)), "{addr} should be allowed");
        assert_eq!(
            strict().check_ip(ip(addr)),
            Ok(()),
            "{addr} should be allowed"
        );
    }
}

#[test]
fn ipv4_mapped_addresses_are_their_ipv4_address() {
    assert_classified(
        &[
            ("::ffff:127.0.0.1", "127.0.0.1"),
            ("::ffff:7f00:1", "127.0.0.1"),
            ("::ffff:a9fe:a9fe", "169.254.169.254"),
            ("::ffff:0.0.0.0", "0.0.0.0"),
        ],
        &["::ffff:8.8.8.8", "::ffff:808:808"],
    );
    assert_eq!(canonical(ip("::ffff:7f00:1")), v4("127.0.0.1"));
}

#[test]
fn ipv4_translated_addresses_are_their_ipv4_address() {
    assert_classified(
        &[
            ("::ffff:0:7f00:1", "127.0.0.1"),
            ("::ffff:0:127.0.0.1", "127.0.0.1"),
            ("::ffff:0:a00:1", "10.0.0.1"),
            ("::ffff:0:169.254.169.254", "169.254.169.254"),
        ],
        &["::ffff:0:8.8.8.8", "::ffff:0:101:101"],
    );
    assert_eq!(canonical(ip("::ffff:0:127.0.0.1")), v4("127.0.0.1"));
}

#[test]
fn ipv4_compatible_addresses_are_their_ipv4_address() {
    assert_classified(
        &[
            ("::127.0.0.1", "127.0.0.1"),
            ("::7f00:1", "127.0.0.1"),
            ("::c0a8:101", "192.168.1.1"),
            ("::0.0.0.2", "0.0.0.2"),
            // IPv6's own loopback and unspecified addresses, not compatible ones.
            ("::1", "::1"),
            ("::", "::"),
        ],
        &["::8.8.8.8", "::101:101"],
    );
    assert_eq!(canonical(ip("::1")), ip("::1"));
    assert_eq!(canonical(ip("::")), ip("::"));
}

#[test]
fn nat64_well_known_prefix_is_its_ipv4_address() {
    assert_classified(
        &[
            ("64:ff9b::7f00:1", "127.0.0.1"),
            ("64:ff9b::127.0.0.1", "127.0.0.1"),
            ("64:ff9b::a9fe:a9fe", "169.254.169.254"),
            ("64:ff9b::ac10:1", "172.16.0.1"),
        ],
        &["64:ff9b::808:808", "64:ff9b::8.8.8.8", "64:ff9b::101:101"],
    );
    assert_eq!(canonical(ip("64:ff9b::808:808")), v4("8.8.8.8"));
}

#[test]
fn nat64_local_use_prefix_is_refused_whole() {
    // The local-use /48 is refused whatever it embeds, public IPv4 addresses in every
    // RFC 6052 position included; so is the rest of 64:ff9b::/32 outside the /96.
    assert_classified(
        &[
            ("64:ff9b:1::7f00:1", "64:ff9b:1::7f00:1"),
            ("64:ff9b:1::808:808", "64:ff9b:1::808:808"),
            ("64:ff9b:1:808:8:800::", "64:ff9b:1:808:8:800::"), // /48 reading
            ("64:ff9b:1:8:8:808::", "64:ff9b:1:8:8:808::"),     // /56 reading
            ("64:ff9b:1:0:8:808:800:0", "64:ff9b:1:0:8:808:800:0"), // /64 reading
            (
                "64:ff9b:1:ffff:ffff:ffff:ffff:ffff",
                "64:ff9b:1:ffff:ffff:ffff:ffff:ffff",
            ),
            ("64:ff9b:2::808:808", "64:ff9b:2::808:808"),
            ("64:ff9b:0:0:0:1:808:808", "64:ff9b::1:808:808"),
        ],
        &["64:ff9a:ffff:ffff:ffff:ffff:ffff:ffff", "64:ff9c::"],
    );
    // An operator whose receivers sit behind a local translator can allowlist it.
    let policy = TargetPolicy {
        allowed_ranges: vec!["64:ff9b:1::/48".parse().unwrap()],
        allow_http: false,
    };
    assert_eq!(policy.check_ip(ip("64:ff9b:1::7f00:1")), Ok(()));
}

#[test]
fn six_to_four_is_refused_by_its_ipv4_address() {
    assert_classified(
        &[
            ("2002:7f00:1::", "127.0.0.1"),
            ("2002:a00:1:1::1", "10.0.0.1"),
            ("2002:a9fe:a9fe:ffff:ffff:ffff:ffff:ffff", "169.254.169.254"),
            ("2002::1", "0.0.0.0"),
        ],
        &[
            "2002:808:808::",
            "2002:0808:0808:1::1",
            "2002:101:101::7f00:1",
        ],
    );
    // The target is the IPv6 host behind the 6to4 router, not the router.
    assert_eq!(canonical(ip("2002:808:808::")), ip("2002:808:808::"));
}

#[test]
fn teredo_is_refused_if_its_server_or_its_client_is_forbidden() {
    // Client 1.1.1.1 is stored inverted, as fefe:fefe; 127.0.0.1 as 80ff:fffe.
    assert_classified(
        &[
            ("2001:0:7f00:1::fefe:fefe", "127.0.0.1"), // server
            ("2001:0:a9fe:a9fe:8000:63bf:fefe:fefe", "169.254.169.254"), // server
            ("2001:0:808:808::80ff:fffe", "127.0.0.1"), // client
            ("2001:0:808:808:8000:63bf:f5ff:fffe", "10.0.0.1"), // client
            // RFC 4380's own example: client 192.0.2.45, a documentation address.
            ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "192.0.2.45"),
            // Both forbidden: the server is named first.
            ("2001:0:a00:1::80ff:fffe", "10.0.0.1"),
        ],
        &[
            "2001:0:808:808:8000:63bf:fefe:fefe",
            // 7f00:1 inverted is 128.255.255.254: a public client, not loopback.
            "2001:0:808:808::7f00:1",
        ],
    );
    assert_eq!(
        canonical(ip("2001:0:808:808::80ff:fffe")),
        ip("2001:0:808:808::80ff:fffe")
    );
}

#[test]
fn isatap_interface_identifiers_are_refused_by_their_ipv4_address() {
    assert_classified(
        &[
            ("2606:4700:1:2:0:5efe:7f00:1", "127.0.0.1"),
            ("2606:4700:1:2:0:5efe:127.0.0.1", "127.0.0.1"),
            ("2606:4700:1:2:200:5efe:a00:1", "10.0.0.1"),
            ("2606:4700:1:2:200:5efe:169.254.169.254", "169.254.169.254"),
            // Under a 6to4 prefix, the classic ISATAP-behind-6to4 deployment.
            ("2002:808:808:1:0:5efe:c0a8:101", "192.168.1.1"),
            // Under a forbidden prefix, the prefix is named first.
            ("fe80::5efe:7f00:1", "fe80::5efe:7f00:1"),
        ],
        &[
            "2606:4700:1:2:0:5efe:808:808",
            "2606:4700:1:2:200:5efe:8.8.8.8",
            "2606:4700:1:2:0:5eff:7f00:1",
        ],
    );
}

#[test]
fn special_purpose_ipv6_ranges_are_refused() {
    let refused = [
        "100::1",
        "100::ffff:ffff:ffff:ffff",
        "2001:2::1",
        "2001:2:0:ffff:ffff:ffff:ffff:ffff",
        "2001:20::1",
        "2001:2f:ffff::1",
        "2001:db8::1",
        "2001:db8:ffff::1",
        "3fff::1",
        "3fff:fff:ffff::1",
        "fec0::1",
    ];
    for addr in refused {
        assert_eq!(
            strict().check_ip(ip(addr)),
            Err(TargetError::ForbiddenAddress(ip(addr))),
            "{addr} should be refused"
        );
    }
    assert_classified(
        &[],
        &[
            "2606:4700::1111",
            "2001:4860:4860::8888",
            "2001:3::1",       // AMT, globally reachable
            "2001:30::1",      // DRIP, just past ORCHIDv2
            "2001:db9::1",     // just past 2001:db8::/32
            "3fff:1000::1",    // just past 3fff::/20
            "2620:4f:8000::1", // AS112 direct delegation
        ],
    );
}

#[test]
fn ipv4_hidden_in_ipv6_urls_is_refused() {
    let policy = TargetPolicy {
        allowed_ranges: vec![],
        allow_http: true,
    };
    for (url, culprit) in [
        ("http://[::ffff:0:7f00:1]/", "127.0.0.1"),
        ("http://[::ffff:0:127.0.0.1]/", "127.0.0.1"),
        ("http://[64:ff9b:1::7f00:1]/", "64:ff9b:1::7f00:1"),
        ("http://[64:ff9b::7f00:1]/", "127.0.0.1"),
        ("http://[2002:7f00:1::]/", "127.0.0.1"),
        ("http://[2001:0:808:808::80ff:fffe]/", "127.0.0.1"),
        (
            "http://[2606:4700:1:2:0:5efe:a9fe:a9fe]/",
            "169.254.169.254",
        ),
        ("http://[100::1]/", "100::1"),
    ] {
        assert!(
            matches!(policy.check_url(url), Err(TargetError::ForbiddenAddress(_))),
            "{url} should be refused"
        );
        assert_eq!(
            policy.check_url(url),
            Err(TargetError::ForbiddenAddress(ip(culprit))),
            "{url} should be refused because of {culprit}"
        );
    }
    for url in [
        "http://[::ffff:8.8.8.8]/",
        "http://[64:ff9b::808:808]/",
        "http://[2002:0808:0808::]/",
        "http://[2606:4700::1111]/",
    ] {
        assert!(policy.check_url(url).is_ok(), "{url} should be allowed");
    }
}

#[test]
fn allowlist_covers_the_target_or_every_address_that_forbids_it() {
    let loopback = TargetPolicy {
        allowed_ranges: vec!["127.0.0.0/8".parse().unwrap()],
        allow_http: false,
    };
    // Forms that are their IPv4 address match the allowlist by it.
    for addr in [
        "::ffff:0:7f00:1",
        "::7f00:1",
        "64:ff9b::7f00:1",
        "::ffff:127.0.0.1",
    ] {
        assert_eq!(loopback.check_ip(ip(addr)), Ok(()), "{addr}");
    }
    // A tunnel whose only forbidden endpoint is allowlisted is let through...
    assert_eq!(loopback.check_ip(ip("2002:7f00:1::")), Ok(()));
    assert_eq!(loopback.check_ip(ip("2001:0:808:808::80ff:fffe")), Ok(()));
    // ...but not when another endpoint, or the prefix, is still forbidden.
    assert_eq!(
        loopback.check_ip(ip("2001:0:a00:1::80ff:fffe")),
        Err(TargetError::ForbiddenAddress(v4("10.0.0.1")))
    );
    assert_eq!(
        loopback.check_ip(ip("2001:db8::5efe:7f00:1")),
        Err(TargetError::ForbiddenAddress(ip("2001:db8::5efe:7f00:1")))
    );
    // The local-use NAT64 prefix is not read, so an IPv4 allowlist does not reach it.
    assert_eq!(
        loopback.check_ip(ip("64:ff9b:1::7f00:1")),
        Err(TargetError::ForbiddenAddress(ip("64:ff9b:1::7f00:1")))
    );
    // Allowlisting the IPv6 range admits the tunnelled target whatever it embeds.
    let six_to_four = TargetPolicy {
        allowed_ranges: vec!["2002::/16".parse().unwrap()],
        allow_http: false,
    };
    assert_eq!(six_to_four.check_ip(ip("2002:a00:1::")), Ok(()));
    assert!(six_to_four.check_ip(ip("::ffff:0:a00:1")).is_err());
}
