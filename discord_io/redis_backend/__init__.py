"""The Redis backend of the channel lock, queue, /kill and follow-ups: many bot processes,
one turn per channel across all of them (docs/redis.md).

Importing this package imports nothing from redis; its modules do. The engine (`fsm`) never
imports it: a turn still holds a local `ChannelLock`, which a Redis lease backs.
"""
