"""Users, guild members and the application, as REST serves them. `GET
/guilds/{guild.id}/members/{user.id}` is how a bot resolves the roles of a message's author
when history gave only the user (Resources › Guild › Get Guild Member): it needs no
privileged intent; an unknown guild is 404 10004, a user not in the guild 404 10007. `PATCH
/guilds/{guild.id}/members/@me` (Modify Current Member) sets the bot's own nickname and
server avatar there."""

from __future__ import annotations

import hashlib

from aiohttp import web

from . import permissions as perms
from .rest import (
    UNKNOWN_MEMBER,
    UNKNOWN_USER,
    JsonDict,
    body_of,
    error,
    forbidden,
    json_response,
)
from .world import World

UNKNOWN_GUILD = 10004


class UserRoutes:
    def __init__(self, world: World) -> None:
        self._world = world
        self.own_member: dict[int, JsonDict] = {}
        """The bot's own member per guild as it changed it (Modify Current Member): `nick`,
        `avatar` (the image hash Discord answers with) and `avatar_data` (the data URI)."""

    async def get_me(self, request: web.Request) -> web.Response:
        return json_response({**self._world.bot, "mfa_enabled": False, "locale": "en-US"})

    async def get_user(self, request: web.Request) -> web.Response:
        user = self._world.users.get(int(request.match_info["user_id"]))
        if user is None:
            return error(404, UNKNOWN_USER, "Unknown User")
        return json_response(user)

    async def get_member(self, request: web.Request) -> web.Response:
        world = self._world
        guild_id = int(request.match_info["guild_id"])
        user_id = int(request.match_info["user_id"])
        if not world.is_member(guild_id, world.bot_id):
            return error(404, UNKNOWN_GUILD, "Unknown Guild")
        if not world.is_member(guild_id, user_id):
            return error(404, UNKNOWN_MEMBER, "Unknown Member")
        return json_response(world.member_payload(user_id, guild_id, with_user=True))

    async def patch_own_member(self, request: web.Request) -> web.Response:
        """PATCH /guilds/{guild.id}/members/@me (Resources › Guild › Modify Current Member):
        the bot's nickname (an empty one removes it) and server avatar (a data URI in, an
        image hash out). Changing the nickname needs CHANGE_NICKNAME (403 50013)."""
        world = self._world
        guild_id = int(request.match_info["guild_id"])
        if not world.is_member(guild_id, world.bot_id):
            return error(404, UNKNOWN_GUILD, "Unknown Guild")
        body: JsonDict = body_of(request) or {}
        guild = world.guilds[guild_id]
        granted = perms.base_permissions(
            guild["everyone"], (int(world.roles[r]["permissions"])
                                for r in world.roles_in(guild_id, world.bot_id)),
            is_owner=guild.get("owner_id") == world.bot_id)
        if "nick" in body and not granted & perms.CHANGE_NICKNAME:
            return forbidden()
        mine = self.own_member.setdefault(guild_id, {"nick": None, "avatar": None})
        if "nick" in body:
            mine["nick"] = body["nick"] or None
            nicks = world.guilds[guild_id]["nicks"]
            if mine["nick"] is None:
                nicks.pop(world.bot_id, None)
            else:
                nicks[world.bot_id] = mine["nick"]
        if "avatar" in body:
            data = body["avatar"]
            mine["avatar"] = None if data is None else hashlib.md5(str(data).encode()).hexdigest()
            mine["avatar_data"] = data
        member = world.member_payload(world.bot_id, guild_id, with_user=True)
        return json_response({**member, "avatar": mine["avatar"]})

    async def get_application(self, request: web.Request) -> web.Response:
        world = self._world
        return json_response({
            "id": str(world.application_id), "name": "turnbot", "description": "",
            "icon": None, "type": None, "bot_public": True, "bot_require_code_grant": False,
            "owner": world.alice, "verify_key": "0" * 64, "flags": 0, "flags_new": "0",
            "redirect_uris": [], "interactions_endpoint_url": None,
            "role_connections_verification_url": None,
            "approximate_guild_count": len(world.guilds),
            "approximate_user_install_count": 0, "approximate_user_authorization_count": 0,
            "explicit_content_filter": 0, "team": None, "eligible_oauth2_scopes": [],
        })
