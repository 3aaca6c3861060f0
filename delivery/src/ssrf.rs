//! The SSRF guard: endpoints must not reach loopback, private, link-local (cloud metadata),
//! multicast or reserved addresses unless an operator allow-lists them.
//!
//! Two entry points, because the HTTP client does not call the DNS resolver for IP-literal hosts:
//! - [`GuardedResolver`] is the HTTP client's resolver: it filters the addresses a name resolves
//!   to, so the check runs on the addresses actually connected to (this defeats DNS rebinding);
//! - [`SsrfGuard::check_url`] checks IP-literal hosts before a request is sent. It relies on
//!   `url::Url`'s WHATWG parser, which normalises `2130706433`, `0x7f000001`, `0177.0.0.1` and
//!   `127.1` to `127.0.0.1`.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::client::legacy::connect::dns::Name;
use ipnet::IpNet;
use url::{Host, Url};

/// Ranges no endpoint may reach unless allow-listed: every entry of the IANA IPv4 and IPv6
/// special-purpose address registries that is not globally reachable, plus multicast, the
/// deprecated site-local range and the forms that embed an IPv4 address (an attacker picks the
/// embedded one). IPv4-mapped IPv6 (`::ffff:0:0/96`) is not listed: it is canonicalised to the
/// IPv4 address it carries and judged as that. Checked most specific first, so a refusal names
/// the narrowest range.
const BLOCKED: &[&str] = &[
    // IPv4 (RFC 6890 registry)
    "0.0.0.0/8",          // "this network"
    "10.0.0.0/8",         // private
    "100.64.0.0/10",      // carrier-grade NAT
    "127.0.0.0/8",        // loopback
    "169.254.0.0/16",     // link-local, cloud metadata (169.254.169.254)
    "172.16.0.0/12",      // private
    "192.0.0.0/24",       // IETF protocol assignments (DS-Lite, NAT64 discovery, …)
    "192.0.2.0/24",       // TEST-NET-1
    "192.88.99.0/24",     // deprecated 6to4 relay anycast (RFC 7526)
    "192.168.0.0/16",     // private
    "198.18.0.0/15",      // benchmarking
    "198.51.100.0/24",    // TEST-NET-2
    "203.0.113.0/24",     // TEST-NET-3
    "224.0.0.0/4",        // multicast
    "240.0.0.0/4",        // reserved
    "255.255.255.255/32", // limited broadcast
    // IPv6 (RFC 6890 registry)
    "::/128",          // unspecified
    "::1/128",         // loopback
    "::/96",           // IPv4-compatible (deprecated; embeds an IPv4 address)
    "::ffff:0:0:0/96", // IPv4-translated (SIIT, RFC 2765; embeds an IPv4 address)
    "64:ff9b::/96",    // NAT64 well-known prefix (embeds an IPv4 address)
    "64:ff9b:1::/48",  // NAT64 local-use prefix (RFC 8215)
    "100::/64",        // discard-only (RFC 6666)
    "100:0:0:1::/64",  // dummy prefix (RFC 9780)
    "2001::/23",       // IETF protocol assignments; its few anycast services take no webhooks
    "2001::/32",       // Teredo (embeds IPv4 addresses)
    "2001:2::/48",     // benchmarking
    "2001:10::/28",    // ORCHID (deprecated)
    "2001:20::/28",    // ORCHIDv2 (identifiers, not routable)
    "2001:db8::/32",   // documentation
    "2002::/16",       // 6to4 (embeds an IPv4 address)
    "3fff::/20",       // documentation (RFC 9637)
    "5f00::/16",       // segment routing SIDs (RFC 9602)
    "fc00::/7",        // unique local
    "fe80::/10",       // link-local
    "fec0::/10",       // site-local (deprecated, RFC 3879)
    "ff00::/8",        // multicast
];

/// An address the guard refuses; the error a blocked resolution or request carries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockedAddress {
    #[error("address {ip} is in the blocked range {range}")]
    InRange { ip: IpAddr, range: IpNet },
    #[error("host {host} has no address outside the blocked ranges")]
    NoAllowedAddress { host: String },
}

/// Decides whether an address may be connected to.
#[derive(Debug, Clone)]
pub struct SsrfGuard {
    /// Operator exemptions (`http.allow_cidrs`); they win over the blocked ranges.
    allow: Vec<IpNet>,
    blocked: Vec<IpNet>,
}

impl SsrfGuard {
    /// A guard exempting `allow_cidrs` (e.g. `127.0.0.0/8` for local development).
    pub fn new(allow_cidrs: &[String]) -> Result<Self, String> {
        let allow = allow_cidrs
            .iter()
            .map(|c| {
                c.parse::<IpNet>()
                    .map_err(|e| format!("allow CIDR `{c}` is invalid: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let blocked = BLOCKED
            .iter()
            .map(|c| {
                c.parse::<IpNet>()
                    .map_err(|e| format!("built-in blocked range `{c}` is invalid: {e}"))
            })
            .collect::<Result<Vec<IpNet>, _>>()?;
        // Most specific first: `255.255.255.255` is refused as the broadcast address, not as
        // part of 240.0.0.0/4, and Teredo as Teredo rather than as 2001::/23.
        let mut blocked = blocked;
        blocked.sort_by_key(|net| std::cmp::Reverse(net.prefix_len()));
        Ok(SsrfGuard { allow, blocked })
    }

    /// `Ok` when `ip` may be connected to. IPv4-mapped IPv6 (`::ffff:a.b.c.d`) is judged as the
    /// IPv4 address it carries.
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), BlockedAddress> {
        let ip = ip.to_canonical();
        if self.allow.iter().any(|net| net.contains(&ip)) {
            return Ok(());
        }
        match self.blocked.iter().find(|net| net.contains(&ip)) {
            Some(range) => Err(BlockedAddress::InRange { ip, range: *range }),
            None => Ok(()),
        }
    }

    /// Checks the host of `url` when it is an IP literal; names are left to [`GuardedResolver`].
    pub fn check_url(&self, url: &Url) -> Result<(), BlockedAddress> {
        match url.host() {
            Some(Host::Ipv4(ip)) => self.check_ip(IpAddr::V4(ip)),
            Some(Host::Ipv6(ip)) => self.check_ip(IpAddr::V6(ip)),
            Some(Host::Domain(_)) | None => Ok(()),
        }
    }
}

/// The HTTP client's DNS resolver: resolves with the system resolver, drops blocked addresses,
/// and fails with [`BlockedAddress`] when none is left.
#[derive(Debug, Clone)]
pub struct GuardedResolver {
    guard: Arc<SsrfGuard>,
}

impl GuardedResolver {
    pub fn new(guard: Arc<SsrfGuard>) -> Self {
        GuardedResolver { guard }
    }

    /// Resolves `host`, keeping only allowed addresses (port 0: the client sets the URL's port).
    pub async fn lookup(&self, host: &str) -> Result<Vec<std::net::SocketAddr>, BoxError> {
        // A name like `[::1]` never gets here (IP literals bypass the resolver), but a bare IPv6
        // string could; lookup_host handles both names and literals.
        let resolved = tokio::net::lookup_host((host, 0)).await?;
        let mut kept = Vec::new();
        let mut first_blocked = None;
        for addr in resolved {
            match self.guard.check_ip(addr.ip()) {
                Ok(()) => kept.push(addr),
                Err(blocked) => {
                    first_blocked.get_or_insert(blocked);
                }
            }
        }
        if kept.is_empty() {
            let err = first_blocked.unwrap_or_else(|| BlockedAddress::NoAllowedAddress {
                host: host.to_string(),
            });
            return Err(Box::new(err));
        }
        Ok(kept)
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The HTTP client's resolver (hyper-util's `HttpConnector` takes any such service).
impl tower_service::Service<Name> for GuardedResolver {
    type Response = std::vec::IntoIter<std::net::SocketAddr>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.lookup(name.as_str()).await?.into_iter()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn guard() -> SsrfGuard {
        SsrfGuard::new(&[]).expect("guard")
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("test address")
    }

    #[test]
    fn every_blocked_range_is_blocked_at_both_ends() {
        let g = guard();
        for range in BLOCKED {
            let net: IpNet = range.parse().expect("range");
            for addr in [net.network(), net.broadcast()] {
                assert!(
                    g.check_ip(addr).is_err(),
                    "{addr} in {range} must be blocked"
                );
            }
        }
        for s in [
            "0.0.0.0",
            "10.1.2.3",
            "100.64.0.1",
            "127.0.0.1",
            "169.254.169.254",
            "172.16.0.1",
            "172.31.255.255",
            "192.0.0.8",
            "192.0.2.1",
            "192.168.1.1",
            "198.18.0.1",
            "198.19.255.255",
            "198.51.100.7",
            "203.0.113.9",
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "ff02::1",
            "64:ff9b::7f00:1",
            "2001:db8::1",
            "2002:7f00:1::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
        ] {
            assert!(g.check_ip(ip(s)).is_err(), "{s} must be blocked");
        }
    }

    /// One case per non-globally-reachable range of the IANA IPv4 and IPv6 special-purpose
    /// address registries (plus multicast, site-local and the deprecated embedded-IPv4 forms):
    /// `(range that must refuse it, an address inside it)`. A failure names the range.
    const IANA_CASES: &[(&str, &str)] = &[
        // IPv4 special-purpose registry
        ("0.0.0.0/8", "0.1.2.3"),
        ("10.0.0.0/8", "10.20.30.40"),
        ("100.64.0.0/10", "100.127.255.254"),
        ("127.0.0.0/8", "127.8.9.10"),
        ("169.254.0.0/16", "169.254.169.254"),
        ("172.16.0.0/12", "172.20.0.1"),
        ("192.0.0.0/24", "192.0.0.170"),
        ("192.0.2.0/24", "192.0.2.55"),
        ("192.88.99.0/24", "192.88.99.1"),
        ("192.168.0.0/16", "192.168.100.1"),
        ("198.18.0.0/15", "198.19.1.1"),
        ("198.51.100.0/24", "198.51.100.200"),
        ("203.0.113.0/24", "203.0.113.77"),
        ("224.0.0.0/4", "239.255.255.250"),
        ("240.0.0.0/4", "250.1.2.3"),
        ("255.255.255.255/32", "255.255.255.255"),
        // IPv6 special-purpose registry
        ("::/128", "::"),
        ("::1/128", "::1"),
        ("::/96", "::7f00:1"),
        ("::ffff:0:0:0/96", "::ffff:0:7f00:1"),
        ("64:ff9b::/96", "64:ff9b::a00:1"),
        ("64:ff9b:1::/48", "64:ff9b:1:abcd::1"),
        ("100::/64", "100::dead:beef"),
        ("100:0:0:1::/64", "100:0:0:1::1"),
        ("2001::/32", "2001:0:4136:e378:8000:63bf:3fff:fdd2"),
        ("2001:2::/48", "2001:2:0:1::1"),
        ("2001:10::/28", "2001:10:1::1"),
        ("2001:20::/28", "2001:20:1::1"),
        ("2001::/23", "2001:5::1"),
        ("2001::/23", "2001:1ff::1"),
        ("2001:db8::/32", "2001:db8:85a3::8a2e:370:7334"),
        ("2002::/16", "2002:a00:1::1"),
        ("3fff::/20", "3fff:fff::1"),
        ("5f00::/16", "5f00:1::1"),
        ("fc00::/7", "fdff:ffff::1"),
        ("fe80::/10", "febf::1"),
        ("fec0::/10", "fec0::1"),
        ("ff00::/8", "ff05::1:3"),
    ];

    #[test]
    fn every_iana_special_purpose_range_is_blocked() {
        let g = guard();
        let mut failures = Vec::new();
        for (range, sample) in IANA_CASES {
            let expected: IpNet = range.parse().expect("range");
            let addr = ip(sample);
            assert!(
                expected.contains(&addr),
                "bad case: {sample} is not in {range}"
            );
            match g.check_ip(addr) {
                Err(BlockedAddress::InRange { range: got, .. }) if got == expected => {}
                other => failures.push(format!(
                    "range {range}: {sample} must be refused as in {range}, got {other:?}"
                )),
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    /// `::ffff:0:0/96` (IPv4-mapped) is not a blocked range of its own: it is canonicalised and
    /// judged as the IPv4 address it carries, so a mapped public address stays reachable.
    #[test]
    fn ipv4_mapped_range_is_judged_by_its_ipv4_address() {
        let g = guard();
        assert_eq!(
            g.check_ip(ip("::ffff:192.168.1.1")),
            Err(BlockedAddress::InRange {
                ip: ip("192.168.1.1"),
                range: "192.168.0.0/16".parse().expect("net"),
            })
        );
        assert!(g.check_ip(ip("::ffff:192.88.99.1")).is_err());
        assert_eq!(g.check_ip(ip("::ffff:8.8.8.8")), Ok(()));
    }

    /// Globally reachable neighbours of the blocked ranges stay allowed (the ranges are not
    /// wider than the registry says).
    #[test]
    fn neighbours_of_blocked_ranges_are_allowed() {
        let g = guard();
        for s in [
            "192.88.98.255",
            "192.88.100.0",
            "192.31.196.1",
            "64:ff9b:2::1",
            "2001:200::1",
            "2001:db9::1",
            "3fff:1000::1",
            "2620:4f:8000::1",
        ] {
            assert_eq!(g.check_ip(ip(s)), Ok(()), "{s} must be allowed");
        }
    }

    #[test]
    fn public_addresses_are_allowed() {
        let g = guard();
        for s in [
            "93.184.216.34",
            "1.1.1.1",
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1111",
            "2a00:1450:4001::200e",
            "::ffff:93.184.216.34",
        ] {
            assert_eq!(g.check_ip(ip(s)), Ok(()), "{s} must be allowed");
        }
    }

    #[test]
    fn blocked_error_names_the_range() {
        let err = guard()
            .check_ip(ip("::ffff:10.0.0.1"))
            .expect_err("blocked");
        assert_eq!(
            err,
            BlockedAddress::InRange {
                ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
                range: "10.0.0.0/8".parse().expect("net"),
            }
        );
    }

    #[test]
    fn odd_spellings_of_loopback_are_blocked_through_url_parsing() {
        let g = guard();
        for url in [
            "http://127.0.0.1/",
            "http://2130706433/",
            "http://0x7f000001/",
            "http://0177.0.0.1/",
            "http://127.1/",
            "http://0x7f.1/",
            "http://127.0.0.1./",
            "http://[::1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://[::ffff:7f00:1]/",
            "http://[0:0:0:0:0:ffff:127.0.0.1]:8080/x",
            "https://169.254.169.254/latest/meta-data/",
            "http://0/",
        ] {
            let parsed = Url::parse(url).expect(url);
            assert!(
                matches!(parsed.host(), Some(Host::Ipv4(_)) | Some(Host::Ipv6(_))),
                "{url} must parse to an IP literal, got {:?}",
                parsed.host()
            );
            assert!(g.check_url(&parsed).is_err(), "{url} must be blocked");
        }
        let public = Url::parse("https://93.184.216.34/hook").expect("url");
        assert_eq!(g.check_url(&public), Ok(()));
        let name = Url::parse("https://example.com/hook").expect("url");
        assert_eq!(g.check_url(&name), Ok(()), "names are the resolver's job");
    }

    #[test]
    fn allow_list_wins() {
        let g =
            SsrfGuard::new(&["127.0.0.0/8".to_string(), "fd00::/8".to_string()]).expect("guard");
        assert_eq!(g.check_ip(ip("127.0.0.1")), Ok(()));
        assert_eq!(g.check_ip(ip("::ffff:127.0.0.2")), Ok(()));
        assert_eq!(g.check_ip(ip("fd00::5")), Ok(()));
        assert!(g.check_ip(ip("10.0.0.1")).is_err());
        assert!(g.check_ip(ip("::1")).is_err());
        assert!(SsrfGuard::new(&["localhost".to_string()]).is_err());
    }

    #[tokio::test]
    async fn resolver_blocks_localhost() {
        let resolver = GuardedResolver::new(Arc::new(guard()));
        let err = resolver.lookup("localhost").await.expect_err("blocked");
        let blocked = err.downcast_ref::<BlockedAddress>();
        assert!(
            matches!(blocked, Some(BlockedAddress::InRange { .. })),
            "expected a BlockedAddress, got {err}"
        );
        let err = resolver.lookup("127.0.0.1").await.expect_err("blocked");
        assert!(err.is::<BlockedAddress>(), "{err}");
    }

    #[tokio::test]
    async fn resolver_keeps_only_allowed_addresses() {
        let resolver = GuardedResolver::new(Arc::new(
            SsrfGuard::new(&["127.0.0.0/8".to_string()]).expect("guard"),
        ));
        let kept = resolver
            .lookup("localhost")
            .await
            .expect("127.0.0.1 allowed");
        assert!(!kept.is_empty());
        let loopback: IpNet = "127.0.0.0/8".parse().expect("net");
        assert!(kept.iter().all(|a| loopback.contains(&a.ip())), "{kept:?}");
    }
}
