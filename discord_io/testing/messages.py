"""The channel and message routes, held to Discord's permission rules for the bot
(Resources › Message, Resources › Channel, Topics › Threads):

- no VIEW_CHANNEL: 403 50001 (Missing Access) on every route of the channel;
- a send needs SEND_MESSAGES, in a thread SEND_MESSAGES_IN_THREADS instead (403 50013); a
  reply (`message_reference`) also needs READ_MESSAGE_HISTORY (403 160002); a forum or media
  channel takes no messages of its own (400 50008);
- a history read without READ_MESSAGE_HISTORY is 200 `[]`, a single message 403 50001;
- a locked thread refuses sends and edits to whoever lacks MANAGE_THREADS (403 160005); a
  send to an archived thread unarchives it (THREAD_UPDATE), an edit there is 400 50083;
- `enforce_nonce`: a send repeating a nonce of the last minutes returns the message made
  then, and creates nothing; a body Discord refuses is 400 50035 with an `errors` object
  naming each field (Reference › Error Messages).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from . import permissions as perms
from .rest import (
    ARCHIVED_THREAD,
    EMPTY_MESSAGE,
    FILES,
    MISSING_ACCESS,
    NON_TEXT_CHANNEL,
    REPLY_WITHOUT_HISTORY,
    THREAD_LOCKED,
    UNKNOWN_CHANNEL,
    UNKNOWN_MESSAGE,
    RecordedFile,
    body_of,
    error,
    field_errors,
    forbidden,
    json_response,
)
from .world import GUILD_FORUM, GUILD_MEDIA, World, as_referenced

JsonDict = dict[str, Any]
MessageEvent = Callable[[str, int, JsonDict], Awaitable[None]]
"""A message event for the gateway: its name, the channel, the message (or its id)."""

MAX_CONTENT = 2000
MAX_EMBEDS = 10
MAX_EMBED_TITLE = 256
MAX_EMBED_DESCRIPTION = 4096
MAX_NONCE = 25
NONCE_WINDOW_S = 300.0
"""How long a nonce is remembered ("the past few minutes", Resources › Message)."""


@dataclass(frozen=True, slots=True)
class _Nonce:
    message_id: int
    at: float


class MessageRoutes:
    """Channel, message, reaction and typing routes; `on_unarchived(thread_id)` announces a
    thread a send unarchived (the gateway's THREAD_UPDATE)."""

    def __init__(self, world: World, on_unarchived: Callable[[int], Awaitable[None]],
                 on_message: MessageEvent) -> None:
        self._world = world
        self._on_unarchived = on_unarchived
        self._on_message = on_message
        """The gateway's MESSAGE_CREATE/UPDATE/DELETE for what the bot did."""
        self.deleted: list[tuple[int, int]] = []
        self.deduplicated: list[int] = []
        """Ids of messages a repeated nonce returned instead of a new message."""
        self._nonces: dict[tuple[int, str], _Nonce] = {}

    # ---- access --------------------------------------------------------------------------

    def _channel(self, request: web.Request, *, needs: int = 0,
                 rule: Callable[[int], web.Response | None] | None = None) -> int | web.Response:
        """The channel of the route, or the refusal: 404 10003, 403 50001 without
        VIEW_CHANNEL, 403 50013 without `needs`, or what `rule` (a send's, an edit's) says."""
        world = self._world
        channel_id = int(request.match_info["channel_id"])
        if channel_id not in world.channels:
            return error(404, UNKNOWN_CHANNEL, "Unknown Channel")
        granted = world.permissions(channel_id, world.bot_id)
        if not granted & perms.VIEW_CHANNEL:
            return forbidden(MISSING_ACCESS)
        if needs and granted & needs != needs:
            return forbidden()
        refused = rule(channel_id) if rule is not None else None
        return refused if refused is not None else channel_id

    def _may_read_history(self, channel_id: int) -> bool:
        return bool(self._world.permissions(channel_id, self._world.bot_id)
                    & perms.READ_MESSAGE_HISTORY)

    def _send_refused(self, channel_id: int) -> web.Response | None:
        """Why the bot may not post in the channel, if it may not."""
        world = self._world
        channel = world.channels[channel_id]
        granted = world.permissions(channel_id, world.bot_id)
        if channel["type"] in (GUILD_FORUM, GUILD_MEDIA):
            return error(400, NON_TEXT_CHANNEL, "Cannot send messages in a non-text channel")
        if world.is_thread(channel_id):
            if not granted & perms.SEND_MESSAGES_IN_THREADS:
                return forbidden()
            if channel["thread_metadata"]["locked"] and not granted & perms.MANAGE_THREADS:
                return forbidden(THREAD_LOCKED)
            return None
        if channel.get("guild_id") is not None and not granted & perms.SEND_MESSAGES:
            return forbidden()
        return None

    def _edit_refused(self, channel_id: int) -> web.Response | None:
        world = self._world
        if not world.is_thread(channel_id):
            return None
        metadata = world.channels[channel_id]["thread_metadata"]
        granted = world.permissions(channel_id, world.bot_id)
        if metadata["locked"] and not granted & perms.MANAGE_THREADS:
            return forbidden(THREAD_LOCKED)
        if metadata["archived"]:
            return error(400, ARCHIVED_THREAD, "Thread is archived")
        return None

    # ---- routes --------------------------------------------------------------------------

    async def get_channel(self, request: web.Request) -> web.Response:
        channel_id = self._channel(request)
        if isinstance(channel_id, web.Response):
            return channel_id
        world = self._world
        if world.is_thread(channel_id):
            return json_response(world.thread_payload(channel_id, for_user=world.bot_id))
        return json_response(world.channels[channel_id])

    async def get_messages(self, request: web.Request) -> web.Response:
        channel_id = self._channel(request)
        if isinstance(channel_id, web.Response):
            return channel_id
        if not self._may_read_history(channel_id):
            return json_response([])
        world = self._world
        limit = int(request.query.get("limit", "50"))
        ids = sorted(world.messages[channel_id], reverse=True)
        if "before" in request.query:
            ids = [i for i in ids if i < int(request.query["before"])]
        if "after" in request.query:
            ids = sorted(i for i in ids if i > int(request.query["after"]))[:limit]
            ids.reverse()
        return json_response([world.served(world.messages[channel_id][i])
                              for i in ids[:limit]])

    async def get_message(self, request: web.Request) -> web.Response:
        channel_id = self._channel(request)
        if isinstance(channel_id, web.Response):
            return channel_id
        if not self._may_read_history(channel_id):
            return forbidden(MISSING_ACCESS)
        message = self._world.messages[channel_id].get(int(request.match_info["message_id"]))
        if message is None:
            return error(404, UNKNOWN_MESSAGE, "Unknown Message")
        return json_response(self._world.served(message))

    async def post_message(self, request: web.Request) -> web.Response:
        channel_id = self._channel(request, rule=self._send_refused)
        if isinstance(channel_id, web.Response):
            return channel_id
        body: JsonDict = body_of(request) or {}
        existing = self._repeated_nonce(channel_id, body)
        if existing is not None:
            return json_response(existing)
        built = self._bot_message(channel_id, body, request[FILES])
        if isinstance(built, web.Response):
            return built
        world = self._world
        world.store_message(channel_id, built)
        await self._on_message("MESSAGE_CREATE", channel_id, built)
        nonce = body.get("nonce")
        if nonce is not None:
            self._nonces[(channel_id, str(nonce))] = _Nonce(int(built["id"]), world.now())
        if world.is_thread(channel_id) and world.channels[channel_id]["thread_metadata"][
                "archived"]:
            world.channels[channel_id]["thread_metadata"]["archived"] = False
            await self._on_unarchived(channel_id)
        return json_response(built)

    async def patch_message(self, request: web.Request) -> web.Response:
        channel_id = self._channel(request, rule=self._edit_refused)
        if isinstance(channel_id, web.Response):
            return channel_id
        world = self._world
        message = world.messages[channel_id].get(int(request.match_info["message_id"]))
        if message is None:
            return error(404, UNKNOWN_MESSAGE, "Unknown Message")
        body = body_of(request) or {}
        for key in ("content", "embeds", "flags"):
            if key in body:
                message[key] = body[key]
        message["edited_timestamp"] = world.timestamp_of(world.next_id())
        await self._on_message("MESSAGE_UPDATE", channel_id, world.served(message))
        return json_response(world.served(message))

    async def delete_message(self, request: web.Request) -> web.Response:
        channel_id = self._channel(request)
        if isinstance(channel_id, web.Response):
            return channel_id
        message_id = int(request.match_info["message_id"])
        if self._world.messages[channel_id].pop(message_id, None) is None:
            return error(404, UNKNOWN_MESSAGE, "Unknown Message")
        self.deleted.append((channel_id, message_id))
        await self._on_message("MESSAGE_DELETE", channel_id, {"id": str(message_id)})
        return web.Response(status=204)

    async def typing(self, request: web.Request) -> web.Response:
        channel_id = self._channel(request, rule=self._send_refused)
        if isinstance(channel_id, web.Response):
            return channel_id
        return web.Response(status=204)

    async def get_reactions(self, request: web.Request) -> web.Response:
        channel_id = self._channel(request, needs=perms.READ_MESSAGE_HISTORY)
        if isinstance(channel_id, web.Response):
            return channel_id
        world = self._world
        users = world.reactors(int(request.match_info["message_id"]),
                               request.match_info["emoji"])
        after = int(request.query.get("after", "0"))
        limit = min(100, int(request.query.get("limit", "25")))
        chosen = [u for u in sorted(users) if u > after][:limit]
        return json_response([world.users[u] for u in chosen])

    async def put_reaction(self, request: web.Request) -> web.Response:
        channel_id = self._channel(request, needs=perms.READ_MESSAGE_HISTORY,
                                   rule=self._edit_refused)
        if isinstance(channel_id, web.Response):
            return channel_id
        world = self._world
        message_id, emoji = int(request.match_info["message_id"]), request.match_info["emoji"]
        if not world.reactors(message_id, emoji) and not world.permissions(
                channel_id, world.bot_id) & perms.ADD_REACTIONS:
            return forbidden()
        user = request.match_info["user"]
        world.add_reaction(message_id, emoji, world.bot_id if user == "@me" else int(user))
        return web.Response(status=204)

    # ---- building a send -----------------------------------------------------------------

    def _repeated_nonce(self, channel_id: int, body: JsonDict) -> JsonDict | None:
        """With `enforce_nonce`, the bot's message that already carries this nonce."""
        nonce = body.get("nonce")
        if nonce is None or not body.get("enforce_nonce"):
            return None
        seen = self._nonces.get((channel_id, str(nonce)))
        world = self._world
        if seen is None or world.now() - seen.at > NONCE_WINDOW_S:
            return None
        message = world.messages[channel_id].get(seen.message_id)
        if message is not None:
            self.deduplicated.append(seen.message_id)
        return message

    def _bot_message(self, channel_id: int, body: JsonDict,
                     files: list[RecordedFile]) -> JsonDict | web.Response:
        """Validate a send like Discord does and build the stored message."""
        world = self._world
        content = body.get("content") or ""
        embeds = body.get("embeds") or []
        problems = _body_errors(content, embeds, body.get("nonce"))
        if problems:
            return field_errors(problems)
        if not content.strip() and not embeds and not files:
            return error(400, EMPTY_MESSAGE, "Cannot send an empty message")
        message = world.message_payload(channel_id, world.bot, content, embeds=embeds,
                                        flags=int(body.get("flags") or 0))
        if body.get("nonce") is not None:
            message["nonce"] = body["nonce"]
        message["attachments"] = [
            {"id": str(world.next_id()), "filename": f.filename, "size": f.size,
             "url": f"https://cdn.example.invalid/{f.filename}",
             "proxy_url": f"https://media.example.invalid/{f.filename}"}
            for f in files
        ]
        reference = body.get("message_reference")
        if reference:
            if not self._may_read_history(channel_id):
                return forbidden(REPLY_WITHOUT_HISTORY)
            referenced = world.messages[channel_id].get(int(reference["message_id"]))
            if referenced is None:
                if reference.get("fail_if_not_exists", True):
                    return field_errors({"message_reference": (
                        "MESSAGE_REFERENCE_UNKNOWN_MESSAGE", "Unknown message")})
            else:
                message["type"] = 19
                message["message_reference"] = {"type": 0, "message_id": referenced["id"],
                                                "channel_id": str(channel_id)}
                message["referenced_message"] = as_referenced(referenced)
        return message


def _body_errors(content: Any, embeds: Any, nonce: Any) -> dict[str, tuple[str, str]]:
    """Each field Discord would refuse, by its path in the body."""
    problems: dict[str, tuple[str, str]] = {}
    if not isinstance(content, str):
        problems["content"] = ("BASE_TYPE_STRING", "Must be a string.")
    elif len(content) > MAX_CONTENT:
        problems["content"] = ("BASE_TYPE_MAX_LENGTH",
                               f"Must be {MAX_CONTENT} or fewer in length.")
    if isinstance(nonce, str) and len(nonce) > MAX_NONCE:
        problems["nonce"] = ("BASE_TYPE_MAX_LENGTH", f"Must be {MAX_NONCE} or fewer in length.")
    if not isinstance(embeds, list) or not all(isinstance(e, dict) for e in embeds):
        problems["embeds"] = ("BASE_TYPE_ARRAY", "Must be an array of objects.")
        return problems
    if len(embeds) > MAX_EMBEDS:
        problems["embeds"] = ("BASE_TYPE_MAX_LENGTH", f"Must be {MAX_EMBEDS} or fewer in length.")
    for index, embed in enumerate(embeds):
        for key, limit in (("title", MAX_EMBED_TITLE), ("description", MAX_EMBED_DESCRIPTION)):
            if len(embed.get(key) or "") > limit:
                problems[f"embeds.{index}.{key}"] = (
                    "BASE_TYPE_MAX_LENGTH", f"Must be {limit} or fewer in length.")
    return problems
