"""REST building blocks of the emulator: answers shaped as Discord shapes them, the record of
each request, scripted faults, and request bodies read as Discord reads them (JSON, or
multipart with its `payload_json`).

Discord quirks kept here: JSON answers carry ``Content-Type: application/json`` with no
charset (discord.py compares it exactly), a 429 carries a ``Via`` header (without one
discord.py assumes a Cloudflare ban), and a 50035 names the field that failed in its
``errors`` object (Reference › Error Messages).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

JsonDict = dict[str, Any]

API_PREFIX = "/api/v10"
CDN_PREFIX = "/cdn"
SEND_MESSAGE = "POST /channels/{channel_id}/messages"

BODY = web.RequestKey("emu_body", object)
"""The request's JSON body (for multipart, its `payload_json`), read once by the middleware."""
FILES = web.RequestKey("emu_files", list)

# JSON error codes (Topics › Opcodes and Status Codes › JSON Error Codes).
UNKNOWN_CHANNEL = 10003
UNKNOWN_MEMBER = 10007
UNKNOWN_MESSAGE = 10008
UNKNOWN_USER = 10013
UNKNOWN_INTERACTION = 10062
ALREADY_ACKNOWLEDGED = 40060
MISSING_ACCESS = 50001
EMPTY_MESSAGE = 50006
NON_TEXT_CHANNEL = 50008
MISSING_PERMISSIONS = 50013
INVALID_FORM_BODY = 50035
ARCHIVED_THREAD = 50083
INVALID_WEBHOOK_TOKEN = 50027
REPLY_WITHOUT_HISTORY = 160002
THREAD_LOCKED = 160005


def json_response(payload: Any, status: int = 200,
                  headers: dict[str, str] | None = None) -> web.Response:
    """JSON with the exact content type discord.py expects (no charset suffix)."""
    all_headers = {"Content-Type": "application/json"}
    all_headers.update(headers or {})
    return web.Response(status=status, body=json.dumps(payload).encode("utf-8"),
                        headers=all_headers)


def error(status: int, code: int, message: str, **extra: Any) -> web.Response:
    return json_response({"code": code, "message": message, **extra}, status=status)


def forbidden(code: int = MISSING_PERMISSIONS) -> web.Response:
    """403 with Discord's message for `code`."""
    messages = {MISSING_ACCESS: "Missing Access", MISSING_PERMISSIONS: "Missing Permissions",
                REPLY_WITHOUT_HISTORY: "Cannot reply without permission to read message history",
                THREAD_LOCKED: "Thread is locked"}
    return error(403, code, messages.get(code, "Forbidden"))


def field_errors(errors: dict[str, tuple[str, str]]) -> web.Response:
    """Discord's 50035 with one entry per failed field (a dotted path such as
    ``embeds.0.title``), each ``(code, message)``, nested as its documentation shows:
    ``{"embeds": {"0": {"title": {"_errors": [{"code": ..., "message": ...}]}}}}``."""
    tree: JsonDict = {}
    for path, (code, message) in errors.items():
        node = tree
        for part in path.split("."):
            node = node.setdefault(part, {})
        node.setdefault("_errors", []).append({"code": code, "message": message})
    return error(400, INVALID_FORM_BODY, "Invalid Form Body", errors=tree)


def field_error(field_name: str, code: str, message: str) -> web.Response:
    return field_errors({field_name: (code, message)})


@dataclass(frozen=True, slots=True)
class RecordedFile:
    field_name: str
    filename: str
    size: int


@dataclass(slots=True)
class RecordedRequest:
    """One request the emulator saw; `status` is what it answered."""

    method: str
    route: str
    path: str
    params: dict[str, str]
    query: dict[str, str]
    headers: dict[str, str]
    json: Any
    files: list[RecordedFile]
    at: float
    status: int = 0
    response_headers: dict[str, str] | None = None
    """The answer's headers (the rate-limit ones among them)."""

    def param(self, name: str) -> str:
        return self.params[name]


@dataclass(frozen=True, slots=True)
class Fault:
    """A scripted answer that replaces (or delays) the normal one for one request."""

    status: int | None = None
    body: JsonDict | None = None
    headers: tuple[tuple[str, str], ...] = ()
    delay_s: float = 0.0
    commit: bool = False
    """Do what the request asks, then answer with the fault: "created, but the answer was
    lost"."""

    @classmethod
    def rate_limited(cls, retry_after: float, *, is_global: bool = False,
                     scope: str | None = None) -> Fault:
        """A 429 as Topics › Rate Limits shows them: scope `user` (a route's limit),
        `global`, or `shared` (a resource's limit, which does not count as invalid)."""
        scope = scope or ("global" if is_global else "user")
        headers = [
            ("Via", "1.1 google"),
            ("Retry-After", str(max(1, int(retry_after + 0.999)))),
            ("X-RateLimit-Scope", scope),
        ]
        if is_global:
            headers.append(("X-RateLimit-Global", "true"))
        message = ("The resource is being rate limited." if scope == "shared"
                   else "You are being rate limited.")
        body = {"message": message, "retry_after": retry_after, "global": is_global}
        return cls(status=429, body=body, headers=tuple(headers))

    @classmethod
    def server_error(cls, status: int = 500) -> Fault:
        return cls(status=status, body={"message": f"{status}: Internal Server Error", "code": 0})

    @classmethod
    def forbidden(cls, code: int = MISSING_PERMISSIONS) -> Fault:
        message = "Missing Access" if code == MISSING_ACCESS else "Missing Permissions"
        return cls(status=403, body={"message": message, "code": code})

    @classmethod
    def error(cls, status: int, code: int, message: str) -> Fault:
        return cls(status=status, body={"message": message, "code": code})

    @classmethod
    def answer_lost(cls, status: int = 502) -> Fault:
        """The request takes effect (a message is created) but its answer is a 5xx."""
        return cls(status=status, body={"message": f"{status}: Bad Gateway", "code": 0},
                   commit=True)

    @classmethod
    def delay(cls, seconds: float) -> Fault:
        """Answer normally, after `seconds` of loop time."""
        return cls(delay_s=seconds)

    def response(self) -> web.Response:
        assert self.status is not None
        return json_response(self.body or {}, status=self.status, headers=dict(self.headers))


def body_of(request: web.Request) -> Any:
    return request[BODY]


async def read_body(request: web.Request) -> tuple[Any, list[RecordedFile]]:
    """The JSON body (for multipart, its `payload_json`) and the files uploaded."""
    if not request.body_exists:
        return None, []
    if request.content_type.startswith("multipart/"):
        payload: Any = None
        files: list[RecordedFile] = []
        reader = await request.multipart()
        async for part in reader:
            if not isinstance(part, aiohttp.BodyPartReader):
                continue
            data = await part.read()
            if part.name == "payload_json":
                payload = json.loads(data)
            else:
                files.append(RecordedFile(part.name or "", part.filename or "", len(data)))
        return payload, files
    raw = await request.read()
    if not raw:
        return None, []
    try:
        return json.loads(raw), []
    except ValueError:
        return raw.decode("utf-8", "replace"), []
