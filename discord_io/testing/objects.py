"""Discord objects as Discord's spec shapes them, shared by the REST emulator and the
gateway so both send the same thing (every field the spec requires)."""

from __future__ import annotations

from typing import Any


def role_object(role_id: int, name: str, permissions: int, *, position: int) -> dict[str, Any]:
    """A guild role (`GuildRoleResponse`): plain, no colours, icon or emoji of its own."""
    return {
        "id": str(role_id), "name": name, "color": 0,
        "colors": {"primary_color": 0, "secondary_color": None, "tertiary_color": None},
        "hoist": False, "icon": None, "unicode_emoji": None, "position": position,
        "permissions": str(permissions), "managed": False, "mentionable": False, "flags": 0,
    }
