"""The review page's local web server (`python -m fsm review DIR`): the list, one turn's story,
and the machine drawn with one journal or a heat map of several.

The pages are static files of this package; everything else is JSON or SVG generated from the
journals and from the same table the committed diagram is drawn from (`fsm.review.diagram`).
Journals hold what users wrote, so the server binds to 127.0.0.1 unless told otherwise, turns
away requests whose Host header names another machine (a web page elsewhere cannot reach it
by DNS rebinding), and forbids every script but its own (Content-Security-Policy); the page
itself inserts journal text only as text.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import Path

import graphviz
from aiohttp import web

from ...scenarios.format import ScenarioError
from ..diagram import journal_dot
from ..inspect import Journal, load_journal
from .catalog import Catalog, Query, QueryError, facets
from .story import story

MAX_ROWS = 1000
"""The list shows at most this many matching turns (newest first); the count says how many
matched."""
STATIC_FILES = {"index.html": "text/html", "review.js": "text/javascript",
                "review.css": "text/css"}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self' "
                               "'unsafe-inline'; img-src 'self' data:; connect-src 'self'; "
                               "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
"""`style-src 'unsafe-inline'`: graphviz writes presentation styles into the SVG it draws."""

CATALOG = web.AppKey("catalog", Catalog)
LOOPBACK_ONLY = web.AppKey("loopback_only", bool)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _static(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


def _is_loopback_host(host: str) -> bool:
    """Whether a Host header names this machine (a name, an IPv4 or bracketed IPv6)."""
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    name = name.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.app[LOOPBACK_ONLY] and not _is_loopback_host(request.host):
        raise web.HTTPMisdirectedRequest(text="this review server answers only to 127.0.0.1 "
                                              "and localhost\n")
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        exc.headers.update(SECURITY_HEADERS)
        raise
    response.headers.update(SECURITY_HEADERS)
    return response


async def _index(_request: web.Request) -> web.Response:
    return web.Response(body=_static("index.html"), content_type="text/html", charset="utf-8")


async def _asset(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    kind = STATIC_FILES.get(name)
    if kind is None:
        raise web.HTTPNotFound(text=f"no asset {name!r}\n")
    return web.Response(body=_static(name), content_type=kind, charset="utf-8")


def _bad(message: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(text=message + "\n")


async def _list(request: web.Request) -> web.Response:
    catalog = request.app[CATALOG]
    try:
        query = Query.parse(dict(request.query))
    except QueryError as exc:
        raise _bad(str(exc)) from None
    rows, problems = await asyncio.to_thread(catalog.scan)
    matching = [row for row in rows if query.matches(row)]
    return web.json_response({
        "folder": str(catalog.root), "total": len(rows), "matching": len(matching),
        "rows": [row.as_json() for row in matching[:MAX_ROWS]],
        "problems": [{"id": p.id, "error": p.error} for p in problems],
        "facets": facets(rows),
    })


def _journals(request: web.Request) -> list[Journal]:
    ids = request.query.getall("id", [])
    if not ids:
        raise _bad("id: name at least one journal of the list")
    catalog = request.app[CATALOG]
    journals = []
    for journal_id in ids:
        path = catalog.path_of(journal_id)
        if path is None:
            raise web.HTTPNotFound(text=f"id: {journal_id!r} is not a journal of the folder\n")
        try:
            journals.append(load_journal(path))
        except (ScenarioError, ValueError, OSError) as exc:
            raise web.HTTPUnprocessableEntity(text=f"{journal_id}: {exc}\n") from None
    return journals


async def _story(request: web.Request) -> web.Response:
    journals = _journals(request)
    if len(journals) != 1:
        raise _bad("id: a turn's story is of exactly one journal")
    return web.json_response(story(journals[0]))


def _render_svg(journals: list[Journal]) -> bytes:
    return bytes(graphviz.pipe("dot", "svg", journal_dot(journals).encode("utf-8")))


async def _svg(request: web.Request) -> web.Response:
    """One journal drawn on the machine, or several as a heat map."""
    journals = _journals(request)
    try:
        svg = await asyncio.to_thread(_render_svg, journals)
    except ScenarioError as exc:
        raise web.HTTPUnprocessableEntity(text=f"{exc}\n") from None
    except graphviz.ExecutableNotFound:
        raise web.HTTPServiceUnavailable(
            text="graphviz's `dot` is not installed (Debian package graphviz)\n") from None
    return web.Response(body=svg, content_type="image/svg+xml", charset="utf-8")


def create_app(root: Path, loopback_only: bool = True) -> web.Application:
    """The review application over the journals under `root`."""
    app = web.Application(middlewares=[_guard])
    app[CATALOG] = Catalog(root)
    app[LOOPBACK_ONLY] = loopback_only
    app.router.add_get("/", _index)
    app.router.add_get("/static/{name}", _asset)
    app.router.add_get("/api/journals", _list)
    app.router.add_get("/api/story", _story)
    app.router.add_get("/api/diagram.svg", _svg)
    return app
