"""Discord I/O for the turn engine.

- `delivery`: `DiscordChannel`, the engine's `TurnChannel` on Discord (D1, D2, S2)
- `splitting`: the pure reply splitter behind it (D1)
- `typing_indicator`: the turn's typing indicator, one owner (refresh every ~8 s)
- `admission`: whether a message addresses the bot
- `history`: the history policy (recent messages or reply chains, within a budget, never
  the messages queued behind the turn) and its dialogue context items
- `attachments`: uploads for the model (images for vision models, text files inlined)
- `channel_queue`: one turn per channel, bounded FIFO queue (D4)
- `stale_sweeper`: periodic release of abandoned channel locks (S6)
- `kill_command`: the /kill slash command (D3)
- `enrichment_tools`, `media_fetch`, `media_frames`: the context-restart tools (R2, R3, R8)
- `testing`: a loopback Discord REST emulator for tests and demos

`DiscordChannel` is the public surface an embedding bot uses (docs/embedding.md).
"""

from .delivery import DiscordChannel

__all__ = ["DiscordChannel"]
