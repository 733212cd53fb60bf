"""Test support for Discord I/O: a loopback Discord (REST, CDN and gateway) that real
discord.py logs in and connects to, held to Discord's OpenAPI spec (docs/emulator.md)."""

from .clock import block_event_loop, loop_clock_heartbeats
from .emulator import (
    CdnFile,
    DiscordEmulator,
    Fault,
    RecordedRequest,
    connected_discord,
    emulated_discord,
    pointed_at,
    running_client,
)
from .gateway import Gateway, ReceivedPayload, Session
from .spec_validation import SpecViolation, SpecViolationError

__all__ = [
    "CdnFile",
    "DiscordEmulator",
    "Fault",
    "Gateway",
    "ReceivedPayload",
    "RecordedRequest",
    "Session",
    "SpecViolation",
    "SpecViolationError",
    "block_event_loop",
    "connected_discord",
    "emulated_discord",
    "loop_clock_heartbeats",
    "pointed_at",
    "running_client",
]
