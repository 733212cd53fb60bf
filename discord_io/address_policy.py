"""Which IP addresses a model-chosen URL may reach: the IANA special-purpose blocks, and the
IPv4 addresses hidden inside IPv6 ones.

`ipaddress.is_global` is not enough: it lets through IPv6 forms that embed a private IPv4
(NAT64 `64:ff9b::10.0.0.1`, 6to4 `2002:a00:1::`, IPv4-compatible `::127.0.0.1`, ...), and on
a NAT64/DNS64 network those reach internal hosts. So every embedded IPv4 is unwrapped and
judged on its own, and every block of the IANA IPv4 and IPv6 Special-Purpose Address
Registries (plus multicast and the IPv6 space outside global unicast) is refused outright.
Two forms mean nothing but "this IPv4 host" and are judged by their embedded IPv4 alone:
IPv4-mapped addresses and the NAT64 well-known prefix (without it an IPv6-only host behind
NAT64 could fetch nothing from the IPv4 internet).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class SpecialBlock:
    """One registry row: the block, its name in the registry, and the RFC that defines it."""

    network: IPNetwork
    name: str
    rfc: str

    def __str__(self) -> str:
        return f"{self.network} ({self.name}, {self.rfc})"


def _block(cidr: str, name: str, rfc: str) -> SpecialBlock:
    return SpecialBlock(ipaddress.ip_network(cidr), name, rfc)


IPV4_SPECIAL: tuple[SpecialBlock, ...] = (
    # IANA IPv4 Special-Purpose Address Registry
    _block("0.0.0.0/8", "this network", "RFC 791"),
    _block("0.0.0.0/32", "this host on this network", "RFC 1122"),
    _block("10.0.0.0/8", "private-use", "RFC 1918"),
    _block("100.64.0.0/10", "shared address space", "RFC 6598"),
    _block("127.0.0.0/8", "loopback", "RFC 1122"),
    _block("169.254.0.0/16", "link local", "RFC 3927"),
    _block("172.16.0.0/12", "private-use", "RFC 1918"),
    _block("192.0.0.0/24", "IETF protocol assignments", "RFC 6890"),
    _block("192.0.0.0/29", "IPv4 service continuity prefix", "RFC 7335"),
    _block("192.0.0.8/32", "IPv4 dummy address", "RFC 7600"),
    _block("192.0.0.9/32", "port control protocol anycast", "RFC 7723"),
    _block("192.0.0.10/32", "traversal using relays around NAT anycast", "RFC 8155"),
    _block("192.0.0.170/31", "NAT64/DNS64 discovery", "RFC 8880"),
    _block("192.0.2.0/24", "documentation (TEST-NET-1)", "RFC 5737"),
    _block("192.31.196.0/24", "AS112-v4", "RFC 7535"),
    _block("192.52.193.0/24", "automatic multicast tunneling", "RFC 7450"),
    _block("192.88.99.0/24", "deprecated 6to4 relay anycast", "RFC 7526"),
    _block("192.168.0.0/16", "private-use", "RFC 1918"),
    _block("192.175.48.0/24", "direct delegation AS112 service", "RFC 7534"),
    _block("198.18.0.0/15", "benchmarking", "RFC 2544"),
    _block("198.51.100.0/24", "documentation (TEST-NET-2)", "RFC 5737"),
    _block("203.0.113.0/24", "documentation (TEST-NET-3)", "RFC 5737"),
    _block("240.0.0.0/4", "reserved", "RFC 1112"),
    _block("255.255.255.255/32", "limited broadcast", "RFC 919"),
    # IANA IPv4 Multicast Address Space Registry
    _block("224.0.0.0/4", "multicast", "RFC 5771"),
)

IPV6_SPECIAL: tuple[SpecialBlock, ...] = (
    # IANA IPv6 Special-Purpose Address Registry
    _block("::1/128", "loopback address", "RFC 4291"),
    _block("::/128", "unspecified address", "RFC 4291"),
    _block("::ffff:0:0/96", "IPv4-mapped address", "RFC 4291"),
    _block("64:ff9b::/96", "IPv4-IPv6 translation", "RFC 6052"),
    _block("64:ff9b:1::/48", "local-use IPv4/IPv6 translation", "RFC 8215"),
    _block("100::/64", "discard-only address block", "RFC 6666"),
    _block("100:0:0:1::/64", "dummy IPv6 prefix", "RFC 9780"),
    _block("2001::/23", "IETF protocol assignments", "RFC 2928"),
    _block("2001::/32", "TEREDO", "RFC 4380"),
    _block("2001:1::1/128", "port control protocol anycast", "RFC 7723"),
    _block("2001:1::2/128", "traversal using relays around NAT anycast", "RFC 8155"),
    _block("2001:1::3/128", "DNS-SD service registration protocol anycast", "RFC 9665"),
    _block("2001:2::/48", "benchmarking", "RFC 5180"),
    _block("2001:3::/32", "automatic multicast tunneling", "RFC 7450"),
    _block("2001:4:112::/48", "AS112-v6", "RFC 7535"),
    _block("2001:10::/28", "deprecated ORCHID", "RFC 4843"),
    _block("2001:20::/28", "ORCHIDv2", "RFC 7343"),
    _block("2001:30::/28", "drone remote ID protocol entity tags", "RFC 9374"),
    _block("2001:db8::/32", "documentation", "RFC 3849"),
    _block("2002::/16", "6to4", "RFC 3056"),
    _block("2620:4f:8000::/48", "direct delegation AS112 service", "RFC 7534"),
    _block("3fff::/20", "documentation", "RFC 9637"),
    _block("5f00::/16", "segment routing (SRv6) SIDs", "RFC 9602"),
    _block("fc00::/7", "unique-local", "RFC 4193"),
    _block("fe80::/10", "link-local unicast", "RFC 4291"),
    # Not in the registry, still never a public web server
    _block("::/96", "deprecated IPv4-compatible address", "RFC 4291"),
    _block("::ffff:0:0:0/96", "IPv4-translated address", "RFC 2765"),
    _block("fec0::/10", "deprecated site-local", "RFC 3879"),
    _block("ff00::/8", "multicast", "RFC 4291"),
)

GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")
"""RFC 4291 section 2.4: the rest of the IPv6 space is unassigned or special."""

_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")
_NAT64_WELL_KNOWN = ipaddress.IPv6Network("64:ff9b::/96")
_JUDGED_BY_EMBEDDED = (_MAPPED, _NAT64_WELL_KNOWN)
_COMPATIBLE = ipaddress.IPv6Network("::/96")
_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")
_ISATAP_IDS = (0x0000_5EFE, 0x0200_5EFE)


def _v4(bits: int) -> ipaddress.IPv4Address:
    return ipaddress.IPv4Address(bits & 0xFFFF_FFFF)


def _rfc6052_candidates(value: int) -> list[ipaddress.IPv4Address]:
    """The IPv4 an RFC 6052 address carries, for each prefix length the operator may use
    (bits 64-71 are the reserved "u" octet, skipped)."""
    def bits(start: int, length: int) -> int:
        return (value >> (128 - start - length)) & ((1 << length) - 1)

    return [
        _v4(bits(32, 32)),
        _v4(bits(40, 24) << 8 | bits(72, 8)),
        _v4(bits(48, 16) << 16 | bits(72, 16)),
        _v4(bits(56, 8) << 24 | bits(72, 24)),
        _v4(bits(72, 32)),
        _v4(bits(96, 32)),
    ]


def embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """Every IPv4 address `ip` may stand for: mapped, compatible, translated, NAT64 (both
    prefixes), 6to4, Teredo (server and client) and ISATAP interface identifiers."""
    value = int(ip)
    found: list[ipaddress.IPv4Address] = []
    if any(ip in net for net in (_MAPPED, _COMPATIBLE, _TRANSLATED, _NAT64_WELL_KNOWN)):
        found.append(_v4(value))
    if ip in _NAT64_LOCAL:
        found.extend(_rfc6052_candidates(value))
    if ip.sixtofour is not None:
        found.append(ip.sixtofour)
    if ip.teredo is not None:
        found.extend(ip.teredo)
    if (value >> 32) & 0xFFFF_FFFF in _ISATAP_IDS:
        found.append(_v4(value))
    return found


def special_block(ip: IPAddress) -> SpecialBlock | None:
    """The most specific special-purpose block `ip` is in, if any."""
    table = IPV4_SPECIAL if ip.version == 4 else IPV6_SPECIAL
    hits = [block for block in table if ip in block.network]
    return max(hits, key=lambda block: block.network.prefixlen, default=None)


def refusal(address: str | IPAddress) -> str | None:
    """Why `address` may not be fetched from, or None when it is a public address."""
    try:
        ip = ipaddress.ip_address(address) if isinstance(address, str) else address
    except ValueError:
        return "not an IP address"
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.scope_id:
            return "a scoped (interface-bound) address"
        for inner in embedded_ipv4(ip):
            why = refusal(inner)
            if why is not None:
                return f"{ip} embeds {inner}: {why}"
        if any(ip in net for net in _JUDGED_BY_EMBEDDED):
            return None
        if ip not in GLOBAL_UNICAST:
            return f"{ip} is outside global unicast space (RFC 4291)"
    block = special_block(ip)
    if block is not None:
        return f"{ip} is in {block}"
    if not ip.is_global:
        return f"{ip} is not globally reachable"
    return None


def is_public(address: str | IPAddress) -> bool:
    return refusal(address) is None
