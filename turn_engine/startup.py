"""What the bot needs from Discord, and the one line it prints when Discord says no.

`PERMISSIONS` is exactly the list docs/discord.md gives an operator (a test holds the two
together); the invite URL printed at start-up asks for those and the two scopes the bot uses.
`describe_failure` turns discord.py's start-up exceptions into one line that says what to do,
instead of the traceback an operator would otherwise get; `ready_line` is the one line that
says a start-up went well.
"""

from __future__ import annotations

import discord

SCOPES = ("bot", "applications.commands")
PERMISSIONS = discord.Permissions(
    view_channel=True,
    send_messages=True,
    send_messages_in_threads=True,
    read_message_history=True,
    embed_links=True,
)
"""Use Application Commands is not among them: it is the permission of the members who type
`/kill`, and the `applications.commands` scope is what lets the bot register it."""
PORTAL = "https://discord.com/developers/applications"


class StartupError(RuntimeError):
    """Start-up failed for a reason the operator can fix; the message is the one line."""


def invite_url(application_id: int) -> str:
    return discord.utils.oauth_url(application_id, permissions=PERMISSIONS, scopes=SCOPES)


def ready_line(client: discord.Client, kill_registered: bool) -> str:
    """`connected as NAME (id) in N servers; /kill registered`: who the bot is, where, and
    whether its command reached Discord (a refusal was logged as a warning before)."""
    user = client.user
    who = f"{user.name} ({user.id})" if user is not None else "an unknown user"
    count = len(client.guilds)
    servers = f"{count} server" + ("" if count == 1 else "s")
    kill = "/kill registered" if kill_registered else \
        "/kill NOT registered (see the warning above)"
    return f"connected as {who} in {servers}; {kill}"


def describe_failure(exc: BaseException) -> str | None:
    """The line for a start-up failure, or None when it is not one we can explain."""
    if isinstance(exc, discord.LoginFailure) or (
            isinstance(exc, discord.ConnectionClosed) and exc.code == 4004):
        return ("Discord rejected the token (401 Unauthorized): reset it in the Developer "
                f"Portal ({PORTAL} → your application → Bot → Reset Token) and put the new "
                "one in TURN_DISCORD_TOKEN")
    if isinstance(exc, discord.PrivilegedIntentsRequired):
        return ("Discord refused the gateway connection (4014, privileged intent not enabled): "
                f"turn on Message Content Intent in the Developer Portal ({PORTAL} → your "
                "application → Bot → Privileged Gateway Intents), then start again")
    if isinstance(exc, discord.ConnectionClosed):
        return (f"Discord closed the gateway connection (code {exc.code}): see "
                "docs/discord.md, 'When it does not start'")
    if isinstance(exc, discord.HTTPException):
        return (f"Discord answered HTTP {exc.status} while logging in: try again in a few "
                "minutes (https://discordstatus.com)")
    if isinstance(exc, OSError | TimeoutError):
        reason = " ".join(str(exc).split()) or type(exc).__name__
        return (f"Discord is unreachable ({reason}): check this machine's network, DNS, "
                "proxy or firewall for discord.com")
    return None
