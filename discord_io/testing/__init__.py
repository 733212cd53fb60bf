"""Test support for Discord I/O: a loopback REST emulator real discord.py can log in to."""

from .emulator import CdnFile, DiscordEmulator, Fault, RecordedRequest, emulated_discord

__all__ = ["CdnFile", "DiscordEmulator", "Fault", "RecordedRequest", "emulated_discord"]
