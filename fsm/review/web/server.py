"""The review page's local web server (`python -m fsm review DIR`): the list, one turn's story,
and the machine drawn with one journal or a heat map of several.

The pages are static files of this package; everything else is JSON or SVG generated from the
journals and from the same table the committed diagram is drawn from (`fsm.review.diagram`).
Journals hold what users wrote, and a journal is untrusted input. So the server binds to
127.0.0.1 unless told otherwise and sits behind the project's local guard (`fsm.local_http`:
no other Host, no cross-site request); it forbids every script but its own and every inline
style (Content-Security-Policy); the drawing it sends is rebuilt from an allow-list
(`svg.sanitize_svg`); and each expensive step runs off the event loop within a time and size
budget (`budget.Budgets`), so one crafted journal or a burst of requests cannot stall it.
The page itself inserts journal text only as text.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import Path
from typing import Any

from aiohttp import web

from ...journal import ScenarioError
from ...local_http import HostPolicy, local_guard
from ..diagram import journal_dot
from ..inspect import Journal
from .budget import Budgets, OverBudget, Workers
from .catalog import Catalog, NotListed, Query, QueryError, TooLarge, facets
from .render import Drawer, DrawingFailed
from .story import story
from .svg import UnsafeSvg, sanitize_svg

MAX_ROWS = 1000
"""The list shows at most this many matching turns (newest first); the count says how many
matched."""
STATIC_FILES = {"index.html": "text/html", "review.js": "text/javascript",
                "review.css": "text/css"}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; connect-src 'self'; "
                               "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "Cross-Origin-Resource-Policy": "same-origin",
}

CATALOG = web.AppKey("catalog", Catalog)
BUDGETS = web.AppKey("budgets", Budgets)
LISTING = web.AppKey("listing", Workers)
READING = web.AppKey("reading", Workers)
DRAWER = web.AppKey("drawer", Drawer)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _static(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


@web.middleware
async def _headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Security headers on every answer, errors included; a step over budget or a failed
    drawing is one line with its own status, never a bare 500."""
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        exc.headers.update(SECURITY_HEADERS)
        raise
    except OverBudget as exc:
        response = web.Response(status=exc.status, text=f"{exc}\n")
    except DrawingFailed as exc:
        response = web.Response(status=exc.status, text=f"{exc}\n")
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
    app = request.app
    catalog, budgets = app[CATALOG], app[BUDGETS]
    try:
        query = Query.parse(dict(request.query))
    except QueryError as exc:
        raise _bad(str(exc)) from None

    def listing() -> dict[str, Any]:
        scan = catalog.scan(budgets.scan_s)
        matching = [row for row in scan.rows if query.matches(row)]
        return {
            "folder": str(catalog.root), "total": len(scan.rows), "matching": len(matching),
            "pending": scan.pending,
            "rows": [row.as_json() for row in matching[:MAX_ROWS]],
            "problems": [{"id": p.id, "error": p.error} for p in scan.problems],
            "facets": facets(scan.rows),
        }

    return web.json_response(await app[LISTING].run("listing", budgets.work_s, listing))


def _ids(request: web.Request, most: int) -> list[str]:
    ids = list(dict.fromkeys(request.query.getall("id", [])))
    if not ids:
        raise _bad("id: name at least one journal of the list")
    if len(ids) > most:
        raise web.HTTPRequestEntityTooLarge(
            most, len(ids), text=f"id: {len(ids)} journals; the page draws at most {most} "
                                 "at once\n")
    return ids


def _read(catalog: Catalog, budgets: Budgets, ids: list[str]) -> list[Journal]:
    """The named journals (blocking: runs in a worker thread), within the request's bytes."""
    journals: list[Journal] = []
    total = 0
    for journal_id in ids:
        try:
            total += catalog.path_of(journal_id).stat().st_size
            if total > budgets.request_bytes:
                raise OverBudget(f"id: the journals named hold more than the "
                                 f"{budgets.request_bytes / 1e6:.0f} MB one request reads; "
                                 "name fewer", status=413)
            journals.append(catalog.load(journal_id))
        except NotListed:
            raise web.HTTPNotFound(
                text=f"id: {journal_id!r} is not a journal of the folder\n") from None
        except TooLarge as exc:
            raise OverBudget(f"{journal_id}: {exc}", status=413) from None
        except (ScenarioError, ValueError, OSError) as exc:
            raise web.HTTPUnprocessableEntity(text=f"{journal_id}: {exc}\n") from None
    return journals


async def _story(request: web.Request) -> web.Response:
    app = request.app
    catalog, budgets = app[CATALOG], app[BUDGETS]
    ids = _ids(request, 1)

    def tell() -> dict[str, Any]:
        journal, = _read(catalog, budgets, ids)
        told = story(journal)
        reply = told["reply"]
        if reply is not None:
            listed = catalog.ids_named([a["journal"] for a in reply["attempts"]])
            for attempt in reply["attempts"]:
                attempt["id"] = listed.get(attempt["journal"])
        return told

    return web.json_response(await app[READING].run("story", budgets.work_s, tell))


async def _svg(request: web.Request) -> web.Response:
    """One journal drawn on the machine, or several as a heat map."""
    app = request.app
    catalog, budgets = app[CATALOG], app[BUDGETS]
    ids = _ids(request, budgets.heat_journals)

    def dot() -> str:
        try:
            return journal_dot(_read(catalog, budgets, ids))
        except ScenarioError as exc:
            raise web.HTTPUnprocessableEntity(text=f"{exc}\n") from None

    source = await app[READING].run("drawing", budgets.work_s, dot)
    drawn = await app[DRAWER].svg(source)

    def clean() -> bytes:
        try:
            return sanitize_svg(drawn)
        except UnsafeSvg as exc:
            raise DrawingFailed(str(exc), 502) from None

    svg = await app[READING].run("drawing", budgets.work_s, clean)
    return web.Response(body=svg, content_type="image/svg+xml", charset="utf-8")


async def _close_workers(app: web.Application) -> None:
    app[LISTING].close()
    app[READING].close()


def create_app(root: Path, loopback_only: bool = True, *,
               budgets: Budgets | None = None) -> web.Application:
    """The review application over the journals under `root`. `loopback_only`: it is bound
    to this machine only, so only `localhost` and loopback addresses may name it."""
    budgets = budgets if budgets is not None else Budgets()
    policy = HostPolicy(loopback_only)
    app = web.Application(middlewares=[
        _headers, local_guard(policy, what="review server", navigable=frozenset({"/"}))])
    app[CATALOG] = Catalog(root, max_bytes=budgets.journal_bytes)
    app[BUDGETS] = budgets
    app[LISTING] = Workers(1, "review-list")
    app[READING] = Workers(budgets.workers, "review-read")
    app[DRAWER] = Drawer(budgets)
    app.on_cleanup.append(_close_workers)
    app.router.add_get("/", _index)
    app.router.add_get("/static/{name}", _asset)
    app.router.add_get("/api/journals", _list)
    app.router.add_get("/api/story", _story)
    app.router.add_get("/api/diagram.svg", _svg)
    return app
