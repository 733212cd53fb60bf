"""The profile's areas (D54): self time is counted against where the code that spent it
lives. The areas once named `fsm/journal.py` and `fsm/turn.py` after those modules had
moved into packages, so the journal's and the driver's time was reported as "other"."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from bench.common import ROOT
from bench.profiling import AREAS, _area

PROJECT = ("/fsm", "/providers", "/discord_io", "/turn_engine", "/bench")
LIBRARIES = {"/transitions/": "transitions", "/pydantic/": "pydantic",
             "/pydantic_core/": "pydantic_core", "/asyncio/": "asyncio",
             "/aiohttp/": "aiohttp", "/discord/": "discord", "/yarl/": "yarl",
             "/multidict/": "multidict", "/concurrent/futures/": "concurrent.futures"}


@pytest.mark.parametrize("marker", sorted({m for _, m in AREAS}))
def test_every_area_marker_names_code_that_exists(marker: str) -> None:
    # covers D54
    if marker.startswith(PROJECT):
        assert (ROOT / marker.strip("/")).exists(), f"{marker} names no file of the project"
    else:
        module = importlib.import_module(LIBRARIES[marker])
        assert marker in str(Path(module.__file__ or "").parent) + "/"


@pytest.mark.parametrize(("module", "area"), [
    ("fsm.journal.recorder", "journal"),
    ("fsm.engine.turn", "turn driver"),
    ("fsm.engine.stream_pass", "stream worker"),
    ("fsm.engine.tool_runner", "engine, other"),
    ("providers.sse", "providers"),
    ("discord_io.delivery", "discord_io"),
    ("turn_engine.bot", "the bot (turn_engine)"),
    ("discord.http", "discord.py"),
    ("aiohttp.client", "aiohttp"),
])
def test_the_project_s_modules_fall_in_their_own_area(module: str, area: str) -> None:
    # covers D54
    assert _area(importlib.import_module(module).__file__ or "") == area
