"""The media fetcher reaches public addresses only: no IANA special-purpose block, and no
IPv6 form of a private IPv4 (NAT64, 6to4, Teredo, ISATAP, mapped, compatible, translated),
as a URL literal, as a DNS answer or after a redirect. Nothing here ever connects outside
loopback: a guard on the event loop records every connect attempt and refuses any other."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult
from hypothesis import given, settings
from hypothesis import strategies as st

from discord_io.address_policy import (
    IPV4_SPECIAL,
    IPV6_SPECIAL,
    SpecialBlock,
    embedded_ipv4,
    is_public,
    refusal,
)
from discord_io.media_fetch import FetchError, FetchLimits, MediaFetcher

V4 = ipaddress.IPv4Address
V6 = ipaddress.IPv6Address
LOOPBACK_SERVER = [ipaddress.ip_network("127.0.0.1/32")]


# ------------------------------------------------------------------ the connection guard


@contextmanager
def connection_guard() -> Iterator[list[Any]]:
    """Record every connect attempt on the running loop; refuse (never make) any that is not
    to loopback. The test asserts on the record, so a swallowed refusal still fails it."""
    loop = asyncio.get_running_loop()
    attempts: list[Any] = []
    outside: list[Any] = []
    real_sock_connect = loop.sock_connect
    real_create_connection = loop.create_connection

    def check(host: str | None, where: Any) -> None:
        attempts.append(where)
        if host is None or not ipaddress.ip_address(host.split("%")[0]).is_loopback:
            outside.append(where)
            raise ConnectionRefusedError(f"test guard: connect to {where} refused")

    async def sock_connect(sock: socket.socket, address: Any) -> None:
        check(address[0], address)
        await real_sock_connect(sock, address)

    async def create_connection(*args: Any, **kwargs: Any) -> Any:
        host = kwargs.get("host", args[1] if len(args) > 1 else None)
        if host is not None or kwargs.get("sock") is None:
            check(host, host)
        return await real_create_connection(*args, **kwargs)

    loop.sock_connect = sock_connect  # type: ignore[method-assign]
    loop.create_connection = create_connection  # type: ignore[method-assign]
    try:
        yield attempts
    finally:
        loop.sock_connect = real_sock_connect  # type: ignore[method-assign]
        loop.create_connection = real_create_connection  # type: ignore[method-assign]
    assert outside == [], f"a connection was attempted outside loopback: {outside}"


class StaticResolver(AbstractResolver):
    """DNS from a table: no look-up ever leaves the process."""

    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self.asked.append(host)
        if host not in self.answers:
            raise OSError(f"{host}: no such test host")
        return [
            ResolveResult(
                hostname=host,
                host=ip,
                port=port,
                family=socket.AF_INET6 if ":" in ip else socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
            for ip in self.answers[host]
        ]

    async def close(self) -> None:
        return None


# ----------------------------------------------------------------- generated embeddings


def address_in(block: SpecialBlock) -> st.SearchStrategy[ipaddress.IPv4Address | V6]:
    net = block.network
    first = int(net.network_address)
    kind: Callable[[int], ipaddress.IPv4Address | V6] = V4 if net.version == 4 else V6
    return st.integers(first, first + net.num_addresses - 1).map(kind)


def _from_int(value: int) -> V6:
    return V6(value & ((1 << 128) - 1))


def _rfc6052(prefix: int, prefix_len: int, v4: V4) -> V6:
    """RFC 6052 section 2.2: the IPv4 after the prefix, skipping bits 64-71."""
    bits = int(v4)
    if prefix_len == 96:
        return _from_int(prefix | bits)
    before = 64 - prefix_len
    high = bits >> (32 - before) if before > 0 else 0
    low = bits & ((1 << (32 - before)) - 1) if before < 32 else bits
    value = prefix | high << 64 | low << (56 - (32 - before))
    return _from_int(value)


EMBEDDINGS: dict[str, Callable[[V4, int], V6]] = {
    "mapped": lambda v4, _: _from_int(0xFFFF << 32 | int(v4)),
    "compatible": lambda v4, _: _from_int(int(v4)),
    "translated": lambda v4, _: _from_int(0xFFFF << 48 | int(v4)),
    "nat64": lambda v4, _: _from_int(0x64FF9B << 96 | int(v4)),
    "nat64-local/96": lambda v4, noise: _from_int(
        0x64FF9B0001 << 80 | (noise & 0xFFFF) << 32 | int(v4)
    ),
    "nat64-local/48": lambda v4, _: _rfc6052(0x64FF9B0001 << 80, 48, v4),
    "nat64-local/56": lambda v4, noise: _rfc6052(
        0x64FF9B0001 << 80 | (noise & 0xFF) << 72, 56, v4
    ),
    "nat64-local/64": lambda v4, noise: _rfc6052(
        0x64FF9B0001 << 80 | (noise & 0xFFFF) << 64, 64, v4
    ),
    "6to4": lambda v4, noise: _from_int(0x2002 << 112 | int(v4) << 80 | (noise & (2**80 - 1))),
    "teredo-server": lambda v4, noise: _from_int(
        0x20010000 << 96 | int(v4) << 64 | (noise & (2**64 - 1))
    ),
    "teredo-client": lambda v4, noise: _from_int(
        0x20010000 << 96 | (noise & (2**64 - 1)) << 32 & (2**96 - 1) | (~int(v4) & 0xFFFFFFFF)
    ),
    "isatap-global": lambda v4, noise: _from_int(
        0x2606_4700 << 96 | (noise & 0xFFFF_FFFF) << 64 | 0x5EFE << 32 | int(v4)
    ),
    "isatap-universal": lambda v4, noise: _from_int(
        0x2A00_1450 << 96 | (noise & 0xFFFF_FFFF) << 64 | 0x0200_5EFE << 32 | int(v4)
    ),
}


def test_the_embeddings_are_the_ones_the_standards_define() -> None:
    """covers R3: the generators produce the documented textbook forms."""
    v4 = V4("10.0.0.1")
    assert EMBEDDINGS["mapped"](v4, 0) == V6("::ffff:10.0.0.1")
    assert EMBEDDINGS["nat64"](v4, 0) == V6("64:ff9b::10.0.0.1")
    assert EMBEDDINGS["6to4"](v4, 0) == V6("2002:a00:1::")
    assert EMBEDDINGS["teredo-server"](v4, 0).teredo == (v4, V4("255.255.255.255"))
    assert EMBEDDINGS["teredo-client"](v4, 0).teredo == (V4("0.0.0.0"), v4)
    assert EMBEDDINGS["nat64-local/48"](V4("192.0.2.33"), 0) == V6("64:ff9b:1:c000:2:2100::")
    assert V4("10.0.0.1") in embedded_ipv4(EMBEDDINGS["isatap-global"](v4, 7))


@settings(max_examples=600, deadline=None)
@given(
    data=st.data(),
    block=st.sampled_from(IPV4_SPECIAL),
    form=st.sampled_from(sorted(EMBEDDINGS)),
    noise=st.integers(0, 2**80 - 1),
)
def test_every_special_ipv4_block_is_refused_however_it_is_wrapped(
    data: st.DataObject, block: SpecialBlock, form: str, noise: int
) -> None:
    """covers R3: an address from each IPv4 special-purpose block is refused bare and in
    every IPv6 form that carries an IPv4 (is_global let NAT64, 6to4, compatible, translated
    and Teredo forms of 127.0.0.1, 10/8 and 169.254.169.254 through)."""
    v4 = data.draw(address_in(block))
    assert isinstance(v4, V4)
    assert refusal(v4) is not None
    wrapped = EMBEDDINGS[form](v4, noise)
    assert not is_public(wrapped), (form, str(wrapped))
    assert not is_public(f"{wrapped}")


@settings(max_examples=400, deadline=None)
@given(data=st.data(), block=st.sampled_from(IPV6_SPECIAL))
def test_every_special_ipv6_block_is_refused(data: st.DataObject, block: SpecialBlock) -> None:
    """covers R3: an address from each IPv6 special-purpose block is refused, except the
    two pure IPv4 forms (mapped, NAT64 well-known prefix) holding a public IPv4."""
    ip = data.draw(address_in(block))
    assert isinstance(ip, V6)
    judged_by_ipv4 = str(block.network) in ("::ffff:0:0/96", "64:ff9b::/96")
    if judged_by_ipv4:
        assert is_public(ip) == is_public(V4(int(ip) & 0xFFFFFFFF))
    else:
        assert not is_public(ip), str(ip)


@pytest.mark.parametrize(
    "address",
    ["8.8.8.8", "1.1.1.1", "151.101.1.140", "2606:4700:4700::1111", "2a00:1450:4001::200e",
     "64:ff9b::8.8.8.8", "::ffff:1.1.1.1"],
)
def test_public_addresses_still_pass(address: str) -> None:
    """covers R3: the filter does not refuse the open internet (a NAT64 network reaches
    IPv4-only sites through 64:ff9b::/96)."""
    assert refusal(address) is None


# ------------------------------------------------------------------ through the fetcher

HOSTILE_LITERALS = [
    "http://[64:ff9b::a9fe:a9fe]/latest/meta-data",
    "http://[64:ff9b::127.0.0.1]/",
    "http://[64:ff9b:1::a00:1]/",
    "http://[2002:a00:1::1]/",
    "http://[::10.0.0.1]/",
    "http://[::ffff:0:127.0.0.1]/",
    "http://[::ffff:169.254.169.254]/",
    "http://[2001:0:4136:e378:8000:63bf:f5ff:fffe]/",
    "http://[fe80::1%25eth0]/",
    "http://192.0.0.8/",
    "http://192.0.0.170/",
    "http://100.64.0.1/",
    "http://198.18.0.1/",
    "http://0.0.0.0/",
    "http://[::]/",
]


@pytest.mark.asyncio
@pytest.mark.parametrize("url", HOSTILE_LITERALS)
async def test_special_literals_are_refused_before_any_connection(url: str) -> None:
    """covers R3: a URL literal in a special block, or embedding one, is refused by the URL
    check; no DNS look-up and no connect attempt happen."""
    dns = StaticResolver({})
    fetcher = MediaFetcher(resolver=dns)
    try:
        with connection_guard() as attempts, pytest.raises(FetchError, match="not public"):
            await fetcher.fetch(url, FetchLimits())
        assert attempts == [] and dns.asked == []
    finally:
        await fetcher.aclose()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "answers",
    [
        ["64:ff9b::a00:1"],
        ["2002:a9fe:a9fe::1"],
        ["::ffff:127.0.0.1", "::127.0.0.1"],
        ["192.0.0.8", "100.100.100.200"],
        ["2001:0:4136:e378:8000:63bf:f5ff:fffe"],
        ["2606:4700::5efe:a00:1"],
    ],
)
async def test_special_dns_answers_are_refused_before_any_connection(answers: list[str]) -> None:
    """covers R3: a public-looking name whose answers are all special (a DNS64 resolver
    turns internal names into 64:ff9b:: answers) is refused; nothing is connected to."""
    dns = StaticResolver({"internal.example": answers})
    fetcher = MediaFetcher(resolver=dns)
    try:
        with connection_guard() as attempts, pytest.raises(FetchError, match="download failed"):
            await fetcher.fetch("http://internal.example/a.gif", FetchLimits())
        assert attempts == [] and dns.asked == ["internal.example"]
    finally:
        await fetcher.aclose()


@asynccontextmanager
async def redirecting_server(location: str) -> AsyncIterator[tuple[str, list[str]]]:
    """A loopback server: `/start` redirects to `location`, `/ok` answers a body."""
    seen: list[str] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        seen.append(request.path)
        if request.path == "/ok":
            return web.Response(body=b"GIF89a", content_type="image/gif")
        return web.Response(status=302, headers={"Location": location})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}", seen
    finally:
        await runner.cleanup()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "location",
    [
        "http://[64:ff9b::a9fe:a9fe]/latest/meta-data",
        "http://[2002:a00:1::]/",
        "http://192.0.0.8/",
        "http://internal.example/",
    ],
)
async def test_special_addresses_are_refused_after_a_redirect(location: str) -> None:
    """covers R3: every hop is checked like the first; the refused hop is never connected
    to (only the loopback server that sent the redirect is)."""
    dns = StaticResolver({"internal.example": ["64:ff9b::a00:1"]})
    async with redirecting_server(location) as (url, seen):
        fetcher = MediaFetcher(allow_networks=LOOPBACK_SERVER, resolver=dns)
        try:
            with connection_guard() as attempts, pytest.raises(FetchError):
                await fetcher.fetch(f"{url}/start", FetchLimits())
        finally:
            await fetcher.aclose()
    assert seen == ["/start"]
    assert len(attempts) == 1


@pytest.mark.asyncio
async def test_an_allowed_redirect_is_followed() -> None:
    """covers R3: the control for the test above: the same fetcher follows a redirect to
    an allowed address, so the refusals are the policy's."""
    async with redirecting_server("/ok") as (url, seen):
        fetcher = MediaFetcher(allow_networks=LOOPBACK_SERVER, resolver=StaticResolver({}))
        try:
            with connection_guard():
                fetched = await fetcher.fetch(f"{url}/start", FetchLimits())
        finally:
            await fetcher.aclose()
    assert fetched.data == b"GIF89a" and seen == ["/start", "/ok"]
