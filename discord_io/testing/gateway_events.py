"""What the gateway says, as Discord's gateway documentation shapes it: opcodes and close
codes (Topics › Opcodes and Status Codes), which intent each event needs (Topics › Gateway ›
List of Intents), GUILD_CREATE as the bot sees its guild (only the channels and active
threads it may view, Topics › Threads › Gateway Events), and the spec schemas the objects
inside events are held to (those REST returns them with)."""

from __future__ import annotations

from typing import Any

from .spec_validation import SpecViolation, shared_validator
from .world import World

JsonDict = dict[str, Any]

# Gateway opcodes.
DISPATCH, HEARTBEAT, IDENTIFY, PRESENCE_UPDATE, VOICE_STATE_UPDATE = 0, 1, 2, 3, 4
RESUME, RECONNECT, REQUEST_GUILD_MEMBERS, INVALID_SESSION, HELLO, HEARTBEAT_ACK = (
    6, 7, 8, 9, 10, 11)
REQUEST_SOUNDBOARD_SOUNDS, REQUEST_CHANNEL_INFO = 31, 43
CLIENT_OPCODES = frozenset({HEARTBEAT, IDENTIFY, PRESENCE_UPDATE, VOICE_STATE_UPDATE, RESUME,
                            REQUEST_GUILD_MEMBERS, REQUEST_SOUNDBOARD_SOUNDS,
                            REQUEST_CHANNEL_INFO})

# Close codes.
NORMAL_CLOSURE = 1000
UNKNOWN_ERROR = 4000
UNKNOWN_OPCODE = 4001
DECODE_ERROR = 4002
NOT_AUTHENTICATED = 4003
AUTHENTICATION_FAILED = 4004
ALREADY_AUTHENTICATED = 4005
INVALID_SEQ = 4007
RATE_LIMITED = 4008
SESSION_TIMED_OUT = 4009
INVALID_SHARD = 4010
SHARDING_REQUIRED = 4011
INVALID_API_VERSION = 4012
INVALID_INTENTS = 4013
DISALLOWED_INTENTS = 4014
SESSION_ENDING_CLOSES = frozenset({INVALID_SEQ, SESSION_TIMED_OUT})
"""After these a RESUME is refused: the session is over ("start a new one")."""

CLOSE_REASONS = {
    UNKNOWN_OPCODE: "Unknown opcode.", DECODE_ERROR: "Error while decoding payload.",
    NOT_AUTHENTICATED: "Not authenticated.", AUTHENTICATION_FAILED: "Authentication failed.",
    ALREADY_AUTHENTICATED: "Already authenticated.", INVALID_SEQ: "Invalid seq.",
    SESSION_TIMED_OUT: "Session timed out.", INVALID_SHARD: "Invalid shard.",
    SHARDING_REQUIRED: "Sharding required.", INVALID_API_VERSION: "Invalid API version.",
    INVALID_INTENTS: "Invalid intent(s).", DISALLOWED_INTENTS: "Disallowed intent(s).",
}

# Intents.
GUILDS = 1 << 0
GUILD_MEMBERS = 1 << 1
GUILD_MODERATION = 1 << 2
GUILD_EXPRESSIONS = 1 << 3
GUILD_INTEGRATIONS = 1 << 4
GUILD_WEBHOOKS = 1 << 5
GUILD_INVITES = 1 << 6
GUILD_VOICE_STATES = 1 << 7
GUILD_PRESENCES = 1 << 8
GUILD_MESSAGES = 1 << 9
GUILD_MESSAGE_REACTIONS = 1 << 10
GUILD_MESSAGE_TYPING = 1 << 11
DIRECT_MESSAGES = 1 << 12
DIRECT_MESSAGE_REACTIONS = 1 << 13
DIRECT_MESSAGE_TYPING = 1 << 14
MESSAGE_CONTENT = 1 << 15
GUILD_SCHEDULED_EVENTS = 1 << 16
AUTO_MODERATION_CONFIGURATION = 1 << 20
AUTO_MODERATION_EXECUTION = 1 << 21
GUILD_MESSAGE_POLLS = 1 << 24
DIRECT_MESSAGE_POLLS = 1 << 25
PRIVILEGED_INTENTS = GUILD_MEMBERS | GUILD_PRESENCES | MESSAGE_CONTENT
VALID_INTENTS = (sum(1 << bit for bit in range(17)) | AUTO_MODERATION_CONFIGURATION
                 | AUTO_MODERATION_EXECUTION | GUILD_MESSAGE_POLLS | DIRECT_MESSAGE_POLLS)

NEEDS: dict[str, tuple[int, int]] = {  # event: (intent in a guild, intent in a DM); 0: always
    "MESSAGE_CREATE": (GUILD_MESSAGES, DIRECT_MESSAGES),
    "MESSAGE_UPDATE": (GUILD_MESSAGES, DIRECT_MESSAGES),
    "MESSAGE_DELETE": (GUILD_MESSAGES, DIRECT_MESSAGES),
    "MESSAGE_REACTION_ADD": (GUILD_MESSAGE_REACTIONS, DIRECT_MESSAGE_REACTIONS),
    "MESSAGE_REACTION_REMOVE": (GUILD_MESSAGE_REACTIONS, DIRECT_MESSAGE_REACTIONS),
    "TYPING_START": (GUILD_MESSAGE_TYPING, DIRECT_MESSAGE_TYPING),
    "MESSAGE_POLL_VOTE_ADD": (GUILD_MESSAGE_POLLS, DIRECT_MESSAGE_POLLS),
    "VOICE_STATE_UPDATE": (GUILD_VOICE_STATES, GUILD_VOICE_STATES),
    "GUILD_MEMBER_UPDATE": (GUILD_MEMBERS, GUILD_MEMBERS),
    "THREAD_MEMBERS_UPDATE": (GUILDS, GUILDS),
    "INTERACTION_CREATE": (0, 0),
    **{name: (GUILDS, GUILDS) for name in (
        "GUILD_CREATE", "GUILD_ROLE_CREATE", "GUILD_ROLE_UPDATE", "CHANNEL_CREATE",
        "CHANNEL_UPDATE", "THREAD_CREATE", "THREAD_UPDATE", "THREAD_DELETE",
        "THREAD_LIST_SYNC", "THREAD_MEMBER_UPDATE")},
}


def visible_channels(world: World, guild_id: int) -> list[JsonDict]:
    """The guild's channels (not threads) the bot may view."""
    return [c for i, c in world.channels.items()
            if c.get("guild_id") == str(guild_id) and not world.is_thread(i)
            and world.can_view(i, world.bot_id)]


def active_threads(world: World, guild_id: int) -> list[JsonDict]:
    """The guild's active threads the bot may view, each with its `member` if it joined."""
    return [world.thread_payload(i, for_user=world.bot_id) for i, c in world.channels.items()
            if c.get("guild_id") == str(guild_id) and world.is_thread(i)
            and not c["thread_metadata"]["archived"] and world.can_view(i, world.bot_id)]


def guild_create(world: World, guild_id: int) -> JsonDict:
    guild = world.guilds[guild_id]
    members = [world.member_payload(u, guild_id, with_user=True) for u in guild["members"]]
    return {
        "id": str(guild_id), "name": guild["name"], "icon": None,
        "owner_id": str(guild["owner_id"] or world.alice_id), "unavailable": False,
        "member_count": len(members), "large": False,
        "joined_at": world.timestamp_of(guild_id), "roles": world.guild_roles(guild_id),
        "emojis": [], "stickers": [], "features": [],
        "channels": visible_channels(world, guild_id),
        "threads": active_threads(world, guild_id), "members": members,
        "voice_states": [], "presences": [], "stage_instances": [],
        "guild_scheduled_events": [], "soundboard_sounds": [], "verification_level": 0,
        "default_message_notifications": 0, "explicit_content_filter": 0, "mfa_level": 0,
        "nsfw_level": 0, "premium_tier": 0, "preferred_locale": "en-US",
        "system_channel_flags": 0, "afk_timeout": 300, "application_id": None,
        "system_channel_id": None, "rules_channel_id": None, "vanity_url_code": None,
        "description": None, "banner": None, "splash": None, "discovery_splash": None,
    }


def visible_to_bot(world: World, name: str, data: JsonDict) -> bool:
    """Discord sends the bot nothing of a channel it may not view (threads included)."""
    channel = data.get("channel_id") if name != "THREAD_CREATE" and name != "THREAD_UPDATE" \
        else data.get("id")
    if name in ("MESSAGE_CREATE", "MESSAGE_UPDATE", "MESSAGE_DELETE", "MESSAGE_REACTION_ADD",
                "MESSAGE_REACTION_REMOVE", "TYPING_START", "THREAD_CREATE", "THREAD_UPDATE",
                "MESSAGE_POLL_VOTE_ADD") and channel is not None:
        channel_id = int(channel)
        return channel_id not in world.channels or world.can_view(channel_id, world.bot_id)
    return True


_EVENT_SCHEMAS = {"MESSAGE_CREATE": "MessageResponse", "MESSAGE_UPDATE": "MessageResponse",
                  "CHANNEL_CREATE": "GuildChannelResponse",
                  "CHANNEL_UPDATE": "GuildChannelResponse", "THREAD_CREATE": "ThreadResponse",
                  "THREAD_UPDATE": "ThreadResponse"}


def event_violations(name: str, data: JsonDict) -> list[SpecViolation]:
    """The objects inside an event, held to the schemas REST returns them with."""
    validator = shared_validator()
    where = f"gateway {name}"
    schema = _EVENT_SCHEMAS.get(name)
    if schema is not None:
        return validator.check_object(schema, data, where=where)
    if name == "READY":
        return validator.check_object("UserResponse", data["user"], where=where)
    if name in ("GUILD_ROLE_CREATE", "GUILD_ROLE_UPDATE"):
        return validator.check_object("GuildRoleResponse", data["role"], where=where)
    if name == "GUILD_MEMBER_UPDATE":
        return validator.check_object("UserResponse", data["user"], where=where)
    if name == "THREAD_LIST_SYNC":
        return [v for thread in data["threads"]
                for v in validator.check_object("ThreadResponse", thread, where=where)]
    if name == "GUILD_CREATE":
        found = [v for channel in data["channels"]
                 for v in validator.check_object("GuildChannelResponse", channel, where=where)]
        found += [v for thread in data["threads"]
                  for v in validator.check_object("ThreadResponse", thread, where=where)]
        found += [v for role in data["roles"]
                  for v in validator.check_object("GuildRoleResponse", role, where=where)]
        return found + [v for member in data["members"]
                        for v in validator.check_object("UserResponse", member["user"],
                                                        where=where)]
    return []


def shard_in(data: Any) -> int | None:
    if isinstance(data, dict) and isinstance(data.get("shard"), list):
        return int(data["shard"][0])
    return None

