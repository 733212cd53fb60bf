"""The guard in front of every local HTTP endpoint the project serves (the review page, the
Prometheus `/metrics`; V4): answer only to a Host this machine may be called by, and refuse
what a browser sends on behalf of another site.

Two attacks reach a server bound to this machine from a web page open in the user's browser:
DNS rebinding (a name the attacker controls resolves to 127.0.0.1, so the page reads the
answers as its own origin) and cross-site requests (the page fires requests it cannot read,
each one costing the server work). The first needs a host *name*: the guard accepts `localhost`
and IP literals (loopback ones only on a loopback server) and the names the operator lists.
The second is told by the browser itself: `Sec-Fetch-Site` other than `same-origin` / `none`,
or an `Origin` that is not the server's own, is refused. Clients that are not browsers
(Prometheus, curl) send neither header.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

SAME_SITE_VALUES = frozenset({"same-origin", "none"})
"""`Sec-Fetch-Site` values a request of the page itself (or one the user typed) carries."""


def _host_name(host: str) -> str | None:
    """The name or address part of a Host header value (`[::1]:80` -> `::1`); None when it
    is not one."""
    host = host.strip().lower()
    if not host or any(c.isspace() or c in "/@\\" for c in host):
        return None
    if host.startswith("["):
        end = host.find("]")
        rest = host[end + 1:]
        if end < 0 or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
        return host[1:end]
    name, _, port = host.partition(":")
    if port and not port.isdigit():
        return None
    return name.rstrip(".")


def _address(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def is_loopback_address(host: str) -> bool:
    """Whether an address to bind to is this machine only (`127.0.0.1`, `::1`, `localhost`)."""
    address = _address(host.strip("[]"))
    return address.is_loopback if address is not None else host == "localhost"


@dataclass(frozen=True, slots=True)
class HostPolicy:
    """Which Host headers a server answers to. A loopback server answers to `localhost` and
    loopback addresses; one bound elsewhere to any IP literal and `localhost`; both to the
    extra `names` the operator lists (the name a scraper calls it by)."""

    loopback_only: bool = True
    names: frozenset[str] = frozenset()

    @classmethod
    def for_bind(cls, bind_host: str, names: Iterable[str] = ()) -> HostPolicy:
        """The policy of a server listening on `bind_host`."""
        return cls(is_loopback_address(bind_host),
                   frozenset(n.strip().lower().rstrip(".") for n in names if n.strip()))

    def allows(self, host: str | None) -> bool:
        name = _host_name(host or "")
        if name is None:
            return False
        if name == "localhost" or name in self.names:
            return True
        address = _address(name)
        if address is None:
            return False
        return address.is_loopback or not self.loopback_only

    def describe(self) -> str:
        allowed = "127.0.0.1 (any loopback address) and localhost" if self.loopback_only \
            else "IP addresses and localhost"
        if self.names:
            allowed += ", " + ", ".join(sorted(self.names))
        return allowed


def cross_site(request: web.Request) -> str | None:
    """Why a request comes from another site, or None for the server's own pages, a typed
    address and clients that are not browsers."""
    fetch_site = request.headers.get("Sec-Fetch-Site")
    if fetch_site is not None and fetch_site.strip().lower() not in SAME_SITE_VALUES:
        return f"Sec-Fetch-Site: {fetch_site.strip()[:40]}"
    origin = request.headers.get("Origin")
    if origin is not None:
        parts = urlsplit(origin.strip())
        own = request.headers.get("Host", "").strip().lower()
        if parts.scheme not in ("http", "https") or parts.netloc.lower() != own:
            return "Origin is another site"
    return None


def local_guard(policy: HostPolicy, *, what: str,
                navigable: frozenset[str] = frozenset()) -> Callable[..., Awaitable[
                    web.StreamResponse]]:
    """An aiohttp middleware that refuses a Host outside `policy` (421) and a cross-site
    request (403) before any handler runs. `navigable` paths (a static page that holds no
    data) may still be opened from a link on another site; what they fetch may not."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not policy.allows(request.headers.get("Host")):
            raise web.HTTPMisdirectedRequest(
                text=f"this {what} answers only to {policy.describe()}\n")
        reason = cross_site(request)
        if reason is not None and not (
                request.path in navigable and request.method == "GET"
                and request.headers.get("Sec-Fetch-Mode", "").lower() == "navigate"
                and "Origin" not in request.headers):
            raise web.HTTPForbidden(text=f"this {what} refuses requests from other sites "
                                         f"({reason})\n")
        return await handler(request)

    return guard
