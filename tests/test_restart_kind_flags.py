"""Which enrichment a restart is, and the flag it sets (SPEC R1, R8): a tool that declares no
guard restarts as the kind its result's type names, a tool that declares a guard restarts as
that kind, and either way exactly that kind's disable flag is set in the turn's result. Every
one of the four kinds, each played as a whole turn in virtual time."""

from __future__ import annotations

from typing import Any

import pytest

from fsm.scenarios.format import parse_scenario
from fsm.scenarios.runner import Played, play

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]

FLAG = {"message_metadata": "disable_message_metadata_context",
        "youtube": "disable_youtube_processing",
        "image": "disable_profile_picture_processing",
        "gif": "disable_gif_processing"}
ITEM = {"role": "user", "content": "what the enrichment found"}


async def _restart(type_value: str, guard: str | None) -> Played:
    spec: dict[str, Any] = {"outcomes": [{"after": 0, "success": True, "data": {
        "type": type_value, "enhanced_context_item": ITEM}}]}
    if guard is not None:
        spec["guard"] = guard
    return await play(parse_scenario({
        "passes": [[{"at": 1, "tool_call": {"name": "enrich"}}],
                   [{"at": 1, "text": "Seen."}, {"at": 2, "end": "completed"}]],
        "tools": {"enrich": spec}}))


def _set_flags(played: Played) -> list[str]:
    return [name for name, value in played.result.flags.items() if value]


@pytest.mark.parametrize("kind", list(FLAG))
@pytest.mark.parametrize("family", ["context_restart_", "context_restart_with_"])
async def test_an_unguarded_restart_is_the_kind_its_type_names(kind: str, family: str) -> None:
    # covers R1, R8: no guard declared: the type's kind restarts the turn and only its flag
    # is set for the rest of the turn
    played = await _restart(family + kind, guard=None)
    assert "ContextRestart" in [line["to"] for line in played.transitions]
    assert played.result.status == "completed"
    assert _set_flags(played) == [FLAG[kind]]


@pytest.mark.parametrize("kind", list(FLAG))
async def test_a_declared_guard_is_the_kind_whatever_the_type_names(kind: str) -> None:
    # covers R1, R8: a scenario's tool may declare any of the four kinds as its guard; its
    # restart sets that kind's flag, not the one of the kind its type names
    other = "gif" if kind != "gif" else "youtube"
    played = await _restart("context_restart_" + other, guard=kind)
    assert "ContextRestart" in [line["to"] for line in played.transitions]
    assert _set_flags(played) == [FLAG[kind]]
