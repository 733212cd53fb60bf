"""The turn engine: the declared machine, the driver, and the contracts it is built on.

Everything a caller embeds is re-exported from `fsm` itself (see docs/embedding.md); the
modules here are the engine's rooms, one job each.
"""
