"""Bounded downloads for enrichment tools: size and time limits, and no private addresses.

The URLs come from the model (so ultimately from chat users), which makes every fetch a
potential server-side request forgery. By default only http(s) to public addresses is
allowed: IP literals are checked before connecting, host names through a resolver that drops
every non-public answer, and redirects are followed by hand so every hop is checked the same
way. "Public" is `address_policy.is_public`: no IANA special-purpose block, no IPv6 form of a
private IPv4. Tests against a loopback server opt out with `allow_private=True`, or let just
their server's address through with `allow_networks`.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Collection
from dataclasses import dataclass

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from .address_policy import IPNetwork, is_public

DEFAULT_MAX_BYTES = 8 * 1024 * 1024
DEFAULT_TIMEOUT_S = 15.0
MAX_REDIRECTS = 3
USER_AGENT = "turn-engine-media-fetch/1"


class FetchError(Exception):
    """A download that was refused or failed; the message is safe to show the model."""


@dataclass(frozen=True, slots=True)
class FetchLimits:
    max_bytes: int = DEFAULT_MAX_BYTES
    timeout_s: float = DEFAULT_TIMEOUT_S


@dataclass(frozen=True, slots=True)
class Fetched:
    data: bytes
    content_type: str
    url: str


def _allowed(address: str, allow_networks: Collection[IPNetwork]) -> bool:
    """Public, or inside a network the caller let through (tests: their loopback server)."""
    if is_public(address):
        return True
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip.version == net.version and ip in net for net in allow_networks)


class PublicOnlyResolver(AbstractResolver):
    """Resolves like `inner` (aiohttp's default resolver), minus non-public answers."""

    def __init__(
        self,
        inner: AbstractResolver | None = None,
        *,
        allow_networks: Collection[IPNetwork] = (),
    ) -> None:
        self._inner = inner or aiohttp.DefaultResolver()
        self._allow_networks = tuple(allow_networks)

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        answers = await self._inner.resolve(host, port, family)
        public = [a for a in answers if _allowed(a["host"], self._allow_networks)]
        if not public:
            raise OSError(f"{host} does not resolve to a public address")
        return public

    async def close(self) -> None:
        await self._inner.close()


def check_url(
    url: str, *, allow_private: bool = False, allow_networks: Collection[IPNetwork] = ()
) -> URL:
    """Parse `url` and refuse what may not be fetched."""
    try:
        parsed = URL(url)
    except (ValueError, TypeError) as exc:
        raise FetchError("not a valid URL") from exc
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise FetchError("only http(s) URLs can be fetched")
    if parsed.user or parsed.password:
        raise FetchError("URLs with credentials are not fetched")
    if not allow_private:
        host = parsed.host.lower().rstrip(".")
        if host == "localhost" or host.endswith(".localhost"):
            raise FetchError("that address is not public")
        literal = host.strip("[]")
        try:
            ipaddress.ip_address(literal)
        except ValueError:
            pass
        else:
            if not _allowed(literal, allow_networks):
                raise FetchError("that address is not public")
    return parsed


class MediaFetcher:
    """Owns one aiohttp session for tool downloads; close it with `aclose`."""

    def __init__(
        self,
        *,
        allow_private: bool = False,
        allow_networks: Collection[IPNetwork] = (),
        resolver: AbstractResolver | None = None,
    ) -> None:
        """`resolver` does the DNS look-ups (aiohttp's default); its answers are filtered."""
        self.allow_private = allow_private
        self.allow_networks = tuple(allow_networks)
        self._dns = resolver
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            resolver = self._dns if self.allow_private else PublicOnlyResolver(
                self._dns, allow_networks=self.allow_networks
            )
            connector = aiohttp.TCPConnector(resolver=resolver, limit=16)
            self._session = aiohttp.ClientSession(
                connector=connector, headers={"User-Agent": USER_AGENT}
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def fetch(self, url: str, limits: FetchLimits) -> Fetched:
        """The body at `url`, within `limits` (loop-clock timeout over all hops)."""
        try:
            async with asyncio.timeout(limits.timeout_s):
                return await self._fetch(url, limits)
        except TimeoutError as exc:
            raise FetchError(f"the download took longer than {limits.timeout_s:g} s") from exc
        except aiohttp.ClientError as exc:
            raise FetchError(f"the download failed ({type(exc).__name__})") from exc
        except OSError as exc:
            raise FetchError(f"the download failed: {exc.strerror or exc}") from exc

    async def _fetch(self, url: str, limits: FetchLimits) -> Fetched:
        current = self._check(url)
        session = self._client()
        for _hop in range(MAX_REDIRECTS + 1):
            async with session.get(current, allow_redirects=False) as response:
                if response.status in (301, 302, 303, 307, 308):
                    location = response.headers.get("Location")
                    if not location:
                        raise FetchError("redirect without a location")
                    current = self._check(str(current.join(URL(location))))
                    continue
                if response.status != 200:
                    raise FetchError(f"the server answered HTTP {response.status}")
                data = await _read_capped(response, limits.max_bytes)
                return Fetched(data=data, content_type=response.content_type, url=str(current))
        raise FetchError("too many redirects")

    def _check(self, url: str) -> URL:
        return check_url(url, allow_private=self.allow_private, allow_networks=self.allow_networks)


async def _read_capped(response: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    declared = response.content_length
    if declared is not None and declared > max_bytes:
        raise FetchError(f"the file is larger than {max_bytes} bytes")
    body = bytearray()
    async for block in response.content.iter_chunked(64 * 1024):
        body += block
        if len(body) > max_bytes:
            raise FetchError(f"the file is larger than {max_bytes} bytes")
    return bytes(body)
