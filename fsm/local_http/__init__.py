"""The guard every local HTTP endpoint of the project stands behind (V4), in a package of its
own below the review page and the telemetry endpoint that serve through it, so neither reaches
up into `fsm`'s top-level modules (the command line, the public surface)."""

from __future__ import annotations

from .guard import HostPolicy, cross_site, is_loopback_address, local_guard

__all__ = ["HostPolicy", "cross_site", "is_loopback_address", "local_guard"]
