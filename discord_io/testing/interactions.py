"""Interactions on Discord's clock (Interactions › Receiving and Responding): the initial
response must come within 3 seconds of the event, else the interaction is unknown (10062); a
second initial response is refused (40060); the token serves follow-ups and edits of the
original response for 15 minutes, then it is invalid (50027). An interaction carries the
member's computed permissions in the channel and the app's own (`app_permissions`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from .rest import (
    ALREADY_ACKNOWLEDGED,
    INVALID_WEBHOOK_TOKEN,
    UNKNOWN_INTERACTION,
    body_of,
    error,
    json_response,
)
from .world import World

JsonDict = dict[str, Any]

INITIAL_RESPONSE_S = 3.0
TOKEN_LIFETIME_S = 15 * 60.0


@dataclass(slots=True)
class PendingInteraction:
    interaction_id: str
    token: str
    channel_id: int
    created_at: float
    responded_at: float | None = None
    refusals: list[int] = field(default_factory=list)
    """The error codes of the callbacks refused (10062, 40060) and follow-ups (50027)."""


class Interactions:
    """Slash commands' payloads and the routes that answer them."""

    def __init__(self, world: World) -> None:
        self._world = world
        self.pending: dict[str, PendingInteraction] = {}
        """Every interaction dispatched, by id."""
        self.responses: list[JsonDict] = []
        """The bodies of the initial responses Discord accepted."""

    def by_token(self, token: str) -> PendingInteraction | None:
        return next((p for p in self.pending.values() if p.token == token), None)

    def slash_command_payload(self, name: str, *, channel_id: int | None = None,
                              user_id: int | None = None, guild: bool = True,
                              permissions: int | None = None) -> JsonDict:
        """An INTERACTION_CREATE payload for a synced slash command, as the gateway sends it.
        In a guild the member's `permissions` in the channel are computed from roles and
        overwrites unless given; `app_permissions` are the bot's there."""
        world = self._world
        channel_id = channel_id if channel_id is not None else world.channel_id
        channel = world.channels[channel_id]
        guild_id = int(channel.get("guild_id") or world.guild_id)
        scope = guild_id if guild and guild_id in world.commands else None
        command = next(c for c in world.commands.get(scope, []) if c["name"] == name)
        user = world.users[user_id if user_id is not None else world.alice_id]
        interaction_id = world.next_id()
        token = f"interaction-token-{world.next_id()}"
        self.pending[str(interaction_id)] = PendingInteraction(
            str(interaction_id), token, channel_id, world.now())
        app_permissions = world.permissions(channel_id, world.bot_id) if guild else 0
        payload: JsonDict = {
            "id": str(interaction_id), "application_id": str(world.application_id), "type": 2,
            "token": token, "version": 1, "channel_id": str(channel_id), "channel": channel,
            "data": {"id": command["id"], "name": name, "type": 1}, "locale": "en-US",
            "app_permissions": str(app_permissions), "entitlements": [],
            # a guild install: the guild's id in a guild, "0" in the bot's DMs (Discord's docs)
            "authorizing_integration_owners": {"0": str(guild_id) if guild else "0"},
            "attachment_size_limit": 10 * 1024 * 1024, "context": 0 if guild else 1,
        }
        if guild:
            member = world.member_payload(int(user["id"]), guild_id, with_user=True)
            computed = world.permissions(channel_id, int(user["id"]))
            member["permissions"] = str(computed if permissions is None else permissions)
            payload.update(guild_id=str(guild_id), guild_locale="en-US", member=member)
        else:
            payload["user"] = user
        return payload

    # ---- routes --------------------------------------------------------------------------

    async def callback(self, request: web.Request) -> web.Response:
        """POST /interactions/{id}/{token}/callback: once, within 3 s."""
        world = self._world
        pending = self.pending.get(request.match_info["interaction_id"])
        if pending is None or pending.token != request.match_info["token"] or (
                pending.responded_at is None
                and world.now() - pending.created_at > INITIAL_RESPONSE_S):
            if pending is not None:
                pending.refusals.append(UNKNOWN_INTERACTION)
            return error(404, UNKNOWN_INTERACTION, "Unknown interaction")
        if pending.responded_at is not None:
            pending.refusals.append(ALREADY_ACKNOWLEDGED)
            return error(400, ALREADY_ACKNOWLEDGED, "Interaction has already been acknowledged.")
        pending.responded_at = world.now()
        body: JsonDict = body_of(request) or {}
        self.responses.append(body)
        data = body.get("data") or {}
        flags = int(data.get("flags") or 0)
        interaction: JsonDict = {
            "id": pending.interaction_id, "type": 2,
            "response_message_loading": body.get("type") == 5,
            "response_message_ephemeral": bool(flags & 64),
        }
        payload: JsonDict = {"interaction": interaction}
        if body.get("type") in (4, 7):
            message = world.message_payload(pending.channel_id, world.bot,
                                            data.get("content") or "", message_type=20,
                                            flags=flags, embeds=data.get("embeds") or [])
            interaction["response_message_id"] = message["id"]
            payload["resource"] = {"type": body["type"], "message": message}
        return json_response(payload)

    def _token_refused(self, request: web.Request) -> web.Response | None:
        """A follow-up's token: valid for 15 minutes after the interaction."""
        pending = self.by_token(request.match_info["token"])
        if pending is not None and self._world.now() - pending.created_at <= TOKEN_LIFETIME_S:
            return None
        if pending is not None:
            pending.refusals.append(INVALID_WEBHOOK_TOKEN)
        return error(401, INVALID_WEBHOOK_TOKEN, "Invalid Webhook Token")

    def _webhook_message(self, request: web.Request, body: JsonDict) -> JsonDict:
        world = self._world
        pending = self.by_token(request.match_info["token"])
        channel_id = pending.channel_id if pending is not None else world.channel_id
        message = world.message_payload(channel_id, world.bot, body.get("content") or "",
                                        flags=int(body.get("flags") or 0),
                                        embeds=body.get("embeds") or [])
        message["webhook_id"] = str(world.application_id)
        return message

    async def followup(self, request: web.Request) -> web.Response:
        refused = self._token_refused(request)
        if refused is not None:
            return refused
        return json_response(self._webhook_message(request, body_of(request) or {}))

    async def webhook_get(self, request: web.Request) -> web.Response:
        refused = self._token_refused(request)
        return refused or json_response(self._webhook_message(request, {}))

    async def webhook_edit(self, request: web.Request) -> web.Response:
        refused = self._token_refused(request)
        return refused or json_response(self._webhook_message(request, body_of(request) or {}))

    async def webhook_delete(self, request: web.Request) -> web.Response:
        refused = self._token_refused(request)
        return refused or web.Response(status=204)

    async def get_commands(self, request: web.Request) -> web.Response:
        guild = request.match_info.get("guild_id")
        return json_response(self._world.commands.get(int(guild) if guild else None, []))

    async def put_commands(self, request: web.Request) -> web.Response:
        world = self._world
        guild = request.match_info.get("guild_id")
        stored: list[JsonDict] = []
        for command in body_of(request) or []:
            # Discord answers with its defaults where the request left a field null.
            entry = {key: value for key, value in command.items() if value is not None}
            entry.setdefault("default_member_permissions", None)
            if isinstance(entry["default_member_permissions"], int):
                entry["default_member_permissions"] = str(entry["default_member_permissions"])
            entry.setdefault("integration_types", [0])
            entry["id"] = str(world.next_id())
            entry["application_id"] = str(world.application_id)
            entry["version"] = str(world.next_id())
            entry.setdefault("type", 1)
            entry.setdefault("description", "")
            if guild:
                entry["guild_id"] = guild
            stored.append(entry)
        world.commands[int(guild) if guild else None] = stored
        return json_response(stored)
