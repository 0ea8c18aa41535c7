//! The SSRF guard: a webhook URL is chosen by whoever subscribes, so carmy refuses to send to
//! addresses an outsider must not reach through it (loopback, private networks, cloud metadata
//! services…), unless the operator allows their networks (`[events] allow_networks`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

use ipnet::IpNet;
use reqwest::Url;

/// Networks the operator lets webhooks reach although they are not global (`[events]
/// allow_networks`), e.g. a receiver on the same private network.
#[derive(Debug, Clone, Default)]
pub struct AllowedNetworks(Vec<IpNet>);

impl AllowedNetworks {
    /// Reads CIDRs (`10.0.0.0/8`, `fd00::/8`) or single addresses; the error names the bad entry.
    pub fn parse<S: AsRef<str>>(cidrs: &[S]) -> Result<Self, String> {
        cidrs
            .iter()
            .map(|entry| {
                let entry = entry.as_ref();
                IpNet::from_str(entry)
                    .or_else(|_| IpAddr::from_str(entry).map(IpNet::from))
                    .map_err(|_| {
                        format!(
                            "`{entry}` is not a network in CIDR notation (like `10.0.0.0/8` or \
                             `fd00::/8`) nor an IP address"
                        )
                    })
            })
            .collect::<Result<_, _>>()
            .map(Self)
    }

    /// Whether `ip` (or the IPv4 address an IPv4-mapped `ip` stands for) is in one of them.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let canonical = ip.to_canonical();
        self.0
            .iter()
            .any(|network| network.contains(&ip) || network.contains(&canonical))
    }
}

/// Why a webhook URL or address is refused; `Display` is the sentence an API error shows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The scheme is not `https` (nor `http` where allowed).
    #[error("the webhook URL must use https (http only with `[events] allow_http = true`)")]
    NotHttps,
    /// The text is not a URL; the parser's complaint.
    #[error("the webhook URL is not a valid URL: {0}")]
    NotAUrl(String),
    /// The URL names no host to send to.
    #[error("the webhook URL has no host")]
    NoHost,
    /// The host name does not resolve to any address; the host.
    #[error("the webhook URL's host `{0}` does not resolve to any address")]
    Unresolvable(String),
    /// The host is, or resolves to, an address outside the global internet.
    #[error(
        "the webhook URL's host is or resolves to {address} ({range}), which webhooks may not \
         reach; the operator can allow its network with `[events] allow_networks`"
    )]
    NotGlobal {
        /// The refused address.
        address: IpAddr,
        /// The range it belongs to, as [`classify`] names it.
        range: &'static str,
    },
}

/// The range a non-global address belongs to ("loopback", "private", "link-local", "cgnat",
/// "unique-local", "multicast", "unspecified", "metadata", …); None for a global one.
///
/// IPv6 addresses that embed an IPv4 address (IPv4-mapped, IPv4-compatible, NAT64, 6to4) reach
/// that IPv4 address, so they are classified as it is.
pub fn classify(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(ip) => classify_v4(ip),
        IpAddr::V6(ip) => classify_v6(ip),
    }
}

/// Cloud instance metadata services, which hand out credentials to whoever asks from inside.
const METADATA_V4: [Ipv4Addr; 2] = [
    Ipv4Addr::new(169, 254, 169, 254), // AWS, GCP, Azure, Oracle, OpenStack…
    Ipv4Addr::new(100, 100, 100, 200), // Alibaba Cloud
];
const METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254); // AWS

/// IANA's special-purpose IPv4 registry, less the ranges that are globally reachable.
fn classify_v4(ip: Ipv4Addr) -> Option<&'static str> {
    if METADATA_V4.contains(&ip) {
        return Some("metadata");
    }
    Some(match ip.octets() {
        [0, 0, 0, 0] => "unspecified",
        [255, 255, 255, 255] => "broadcast",
        [0, ..] => "this-network",
        [10, ..] | [172, 16..=31, ..] | [192, 168, ..] => "private",
        [100, 64..=127, ..] => "cgnat",
        [127, ..] => "loopback",
        [169, 254, ..] => "link-local",
        [192, 0, 0, _] => "protocol-assignments",
        [192, 0, 2, _] | [198, 51, 100, _] | [203, 0, 113, _] => "documentation",
        [192, 88, 99, _] => "6to4-relay",
        [198, 18..=19, ..] => "benchmarking",
        [224..=239, ..] => "multicast",
        [240..=255, ..] => "reserved",
        _ => return None,
    })
}

/// IANA's special-purpose IPv6 registry; anything outside global unicast (2000::/3) is refused.
fn classify_v6(ip: Ipv6Addr) -> Option<&'static str> {
    if ip.is_unspecified() {
        return Some("unspecified");
    }
    if ip.is_loopback() {
        return Some("loopback");
    }
    if ip == METADATA_V6 {
        return Some("metadata");
    }
    let segments = ip.segments();
    let [high, low] = [segments[6], segments[7]].map(u16::to_be_bytes);
    let last_32_bits = Ipv4Addr::new(high[0], high[1], low[0], low[1]);
    match segments {
        // IPv4-mapped: the socket connects to the IPv4 address.
        [0, 0, 0, 0, 0, 0xffff, ..] => classify_v4(last_32_bits),
        // IPv4-compatible: deprecated, routed nowhere today.
        [0, 0, 0, 0, 0, 0, ..] => classify_v4(last_32_bits).or(Some("ipv4-compatible")),
        // NAT64 (well-known prefix): the translator forwards to the IPv4 address.
        [0x64, 0xff9b, 0, 0, 0, 0, ..] => classify_v4(last_32_bits),
        // 6to4: a relay forwards to the IPv4 address in bits 16 to 48.
        [0x2002, a, b, ..] => {
            let [a, b] = [a, b].map(u16::to_be_bytes);
            classify_v4(Ipv4Addr::new(a[0], a[1], b[0], b[1]))
        }
        [0x64, 0xff9b, 0x1, ..] => Some("local-nat64"),
        [0x2001, 0xdb8, ..] | [0x3fff, 0..=0x0fff, ..] => Some("documentation"),
        [0x2001, 0..=0x01ff, ..] => Some("protocol-assignments"),
        [0xfc00..=0xfdff, ..] => Some("unique-local"),
        [0xfe80..=0xfebf, ..] => Some("link-local"),
        [0xfec0..=0xfeff, ..] => Some("site-local"),
        [0xff00..=0xffff, ..] => Some("multicast"),
        [0x2000..=0x3fff, ..] => None,
        _ => Some("reserved"),
    }
}

/// Refuses `ip` unless it is global or allowed.
pub(crate) fn check_address(ip: IpAddr, allowed: &AllowedNetworks) -> Result<(), Refusal> {
    match classify(ip) {
        Some(range) if !allowed.contains(ip) => Err(Refusal::NotGlobal { address: ip, range }),
        _ => Ok(()),
    }
}

/// Parses a webhook URL and checks what needs no DNS: the scheme, and an IP-literal host (which
/// the HTTP client connects to without resolving it).
pub(crate) fn check_without_dns(
    url: &str,
    allow_http: bool,
    allowed: &AllowedNetworks,
) -> Result<Url, Refusal> {
    let url = Url::parse(url).map_err(|error| Refusal::NotAUrl(error.to_string()))?;
    match url.scheme() {
        "https" => {}
        "http" if allow_http => {}
        _ => return Err(Refusal::NotHttps),
    }
    if let Some(ip) = literal_address(&url)? {
        check_address(ip, allowed)?;
    }
    Ok(url)
}

/// The address a URL's host is written as, or None for a name to resolve.
fn literal_address(url: &Url) -> Result<Option<IpAddr>, Refusal> {
    let host = url.host_str().ok_or(Refusal::NoHost)?;
    // An IPv6 literal keeps its brackets in a URL.
    let literal = host
        .strip_prefix('[')
        .and_then(|host| host.strip_suffix(']'))
        .unwrap_or(host);
    Ok(literal.parse().ok())
}

/// The creation-time check of a webhook URL: scheme, host, and every address it resolves to.
pub(crate) async fn check_url(
    url: &str,
    allow_http: bool,
    allowed: &AllowedNetworks,
) -> Result<(), Refusal> {
    let url = check_without_dns(url, allow_http, allowed)?;
    if literal_address(&url)?.is_none() {
        let host = url.host_str().ok_or(Refusal::NoHost)?;
        resolve_checked(host, allowed).await?;
    }
    Ok(())
}

/// Resolves `host` and checks every address: one refused address refuses them all, since the
/// client could pick any of them.
pub(crate) async fn resolve_checked(
    host: &str,
    allowed: &AllowedNetworks,
) -> Result<Vec<SocketAddr>, Refusal> {
    let unresolvable = || Refusal::Unresolvable(host.to_owned());
    // Port 0: the HTTP client puts the URL's port in.
    let addresses: Vec<SocketAddr> = tokio::net::lookup_host((host, 0))
        .await
        .map_err(|_| unresolvable())?
        .collect();
    if addresses.is_empty() {
        return Err(unresolvable());
    }
    for address in &addresses {
        check_address(address.ip(), allowed)?;
    }
    Ok(addresses)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_non_global_range_is_classified() {
        for (address, range) in [
            // IPv4
            ("0.0.0.0", "unspecified"),
            ("0.1.2.3", "this-network"),
            ("10.0.0.1", "private"),
            ("10.255.255.255", "private"),
            ("172.16.0.1", "private"),
            ("172.31.255.254", "private"),
            ("192.168.1.1", "private"),
            ("100.64.0.1", "cgnat"),
            ("100.127.255.254", "cgnat"),
            ("127.0.0.1", "loopback"),
            ("127.255.255.254", "loopback"),
            ("169.254.0.1", "link-local"),
            ("169.254.169.254", "metadata"),
            ("100.100.100.200", "metadata"),
            ("192.0.0.8", "protocol-assignments"),
            ("192.0.2.1", "documentation"),
            ("198.51.100.1", "documentation"),
            ("203.0.113.1", "documentation"),
            ("192.88.99.1", "6to4-relay"),
            ("198.18.0.1", "benchmarking"),
            ("198.19.255.254", "benchmarking"),
            ("224.0.0.1", "multicast"),
            ("239.255.255.250", "multicast"),
            ("240.0.0.1", "reserved"),
            ("255.255.255.254", "reserved"),
            ("255.255.255.255", "broadcast"),
            // IPv6
            ("::", "unspecified"),
            ("::1", "loopback"),
            ("fe80::1", "link-local"),
            ("febf::1", "link-local"),
            ("fec0::1", "site-local"),
            ("fc00::1", "unique-local"),
            ("fd12:3456::1", "unique-local"),
            ("fd00:ec2::254", "metadata"),
            ("ff02::1", "multicast"),
            ("ff0e::1", "multicast"),
            ("2001:db8::1", "documentation"),
            ("3fff::1", "documentation"),
            ("2001::1", "protocol-assignments"),
            ("2001:1ff::1", "protocol-assignments"),
            ("64:ff9b:1::1", "local-nat64"),
            ("100::1", "reserved"),
            ("5f00::1", "reserved"),
            ("4000::1", "reserved"),
            // IPv4-mapped
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:10.1.2.3", "private"),
            ("::ffff:169.254.169.254", "metadata"),
            ("::ffff:100.64.0.1", "cgnat"),
            ("::ffff:0.0.0.0", "unspecified"),
            // IPv4-compatible
            ("::127.0.0.1", "loopback"),
            ("::192.168.0.1", "private"),
            ("::169.254.169.254", "metadata"),
            ("::8.8.8.8", "ipv4-compatible"),
            // NAT64
            ("64:ff9b::127.0.0.1", "loopback"),
            ("64:ff9b::172.16.0.1", "private"),
            ("64:ff9b::169.254.169.254", "metadata"),
            // 6to4
            ("2002:7f00:1::1", "loopback"),
            ("2002:c0a8:101::1", "private"),
            ("2002:a9fe:a9fe::1", "metadata"),
            ("2002:e000:1::", "multicast"),
        ] {
            let ip: IpAddr = address.parse().unwrap();
            assert_eq!(classify(ip), Some(range), "{address}");
            assert_eq!(
                check_address(ip, &AllowedNetworks::default()),
                Err(Refusal::NotGlobal { address: ip, range }),
                "{address}"
            );
        }
    }

    #[test]
    fn global_addresses_are_not_classified() {
        // Classification only: nothing is sent to them.
        for address in [
            "8.8.8.8",
            "1.1.1.1",
            "172.32.0.1",
            "100.128.0.1",
            "192.0.3.1",
            "223.255.255.254",
            "2606:4700::1111",
            "2a00:1450:4001::1",
            "::ffff:8.8.8.8",
            "64:ff9b::8.8.8.8",
            "2002:808:808::1",
        ] {
            let ip: IpAddr = address.parse().unwrap();
            assert_eq!(classify(ip), None, "{address}");
            assert_eq!(check_address(ip, &AllowedNetworks::default()), Ok(()));
        }
    }

    #[test]
    fn allowed_networks_override_a_refusal() {
        let allowed = AllowedNetworks::parse(&["10.0.0.0/8", "fd00::/8", "127.0.0.1"]).unwrap();
        for address in ["10.1.2.3", "::ffff:10.1.2.3", "fd12::1", "127.0.0.1"] {
            let ip: IpAddr = address.parse().unwrap();
            assert!(allowed.contains(ip), "{address}");
            assert_eq!(check_address(ip, &allowed), Ok(()), "{address}");
        }
        for address in ["11.0.0.1", "192.168.0.1", "127.0.0.2", "fc00::1"] {
            let ip: IpAddr = address.parse().unwrap();
            assert!(!allowed.contains(ip), "{address}");
        }
        assert!(check_address("192.168.0.1".parse().unwrap(), &allowed).is_err());
    }

    #[test]
    fn bad_networks_are_refused_naming_the_entry() {
        for bad in [
            "10.0.0.0/33",
            "10.0.0/8",
            "fd00::/129",
            "private",
            "",
            " 10.0.0.0/8",
        ] {
            let error = AllowedNetworks::parse(&["192.168.0.0/16", bad]).unwrap_err();
            assert!(error.contains(&format!("`{bad}`")), "{error}");
        }
        assert!(AllowedNetworks::parse::<&str>(&[]).unwrap().0.is_empty());
    }

    #[test]
    fn urls_are_checked_for_scheme_host_and_literal_addresses() {
        let none = AllowedNetworks::default();
        let check = |url, allow_http| check_without_dns(url, allow_http, &none).map(|_| ());
        assert_eq!(check("https://example.com/hook", false), Ok(()));
        assert_eq!(
            check("http://example.com/hook", false),
            Err(Refusal::NotHttps)
        );
        assert_eq!(check("http://example.com/hook", true), Ok(()));
        assert_eq!(
            check("ftp://example.com/hook", true),
            Err(Refusal::NotHttps)
        );
        assert!(matches!(
            check("example.com/hook", true),
            Err(Refusal::NotAUrl(_))
        ));
        assert!(matches!(
            check("https://10.0.0.1/hook", false),
            Err(Refusal::NotGlobal {
                range: "private",
                ..
            })
        ));
        assert!(matches!(
            check("https://[::ffff:127.0.0.1]:8443/hook", false),
            Err(Refusal::NotGlobal {
                range: "loopback",
                ..
            })
        ));
        // The URL standard reads these as 127.0.0.1.
        for obscured in ["https://2130706433/", "https://0x7f.1/", "https://127.1/"] {
            assert!(
                matches!(
                    check(obscured, false),
                    Err(Refusal::NotGlobal {
                        range: "loopback",
                        ..
                    })
                ),
                "{obscured}"
            );
        }
    }
}
