"""The runnable bot: configuration and the three ways the main job runs (Discord bot,
terminal chat, built-in demo turns)."""
