"""What CONTRIBUTING.md and the README promise a contributor stays true (SPEC O14, T1): every
provider kind is wired in each place the guide lists, the guide's tool example runs through a
real turn, the README keeps its two set-up commands and CI runs the test one."""

from __future__ import annotations

import re
from typing import Any, get_args

from fsm.engine.config import TurnConfig
from fsm.engine.locks import ChannelLockRegistry
from fsm.engine.prefill import TurnRequest
from fsm.engine.stash import ContextStash
from fsm.engine.tools import FunctionTool, ToolRegistry
from fsm.engine.turn import Turn
from fsm.scenarios.format import parse_scenario
from fsm.scenarios.runner import run_virtual
from fsm.scenarios.scripted import InMemoryChannel, ScriptedProvider
from fsm.telemetry.follow import GEN_AI_PROVIDER_NAMES
from providers.__main__ import _parser as providers_cli
from providers.capabilities import default_prefill
from providers.config import DEFAULT_BASE_URLS, ProviderKind
from providers.factory import ADAPTERS
from providers.http import SSEProvider

from engine_support import ROOT

GUIDE = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")


def test_every_provider_kind_is_wired_everywhere() -> None:
    # covers the provider-kind checklist of CONTRIBUTING.md: a kind missing from one of
    # its places is named here, before a user meets a KeyError
    kinds = get_args(ProviderKind)
    for name in ("ProviderKind", "DEFAULT_BASE_URLS", "ADAPTERS", "default_prefill",
                 "GEN_AI_PROVIDER_NAMES", "stream-file --format"):
        assert name in GUIDE, f"CONTRIBUTING.md no longer lists {name}"
    configuration = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    cli = providers_cli()
    for kind in kinds:
        assert DEFAULT_BASE_URLS[kind].startswith("https://"), kind
        assert issubclass(ADAPTERS[kind], SSEProvider), kind
        assert GEN_AI_PROVIDER_NAMES[kind], kind
        assert default_prefill(kind, "any-model", None) in ("native", "prefix-flag",
                                                             "instruction", "off"), kind
        assert cli.parse_args(["stream-file", "--format", kind, "f.sse"]).format == kind
        assert f"`{kind}`" in configuration, f"docs/configuration.md: no kind {kind}"
    assert set(DEFAULT_BASE_URLS) == set(ADAPTERS) == set(GEN_AI_PROVIDER_NAMES) == set(kinds)


def _tool_example() -> dict[str, Any]:
    [code] = re.findall(r"```python\n(.*?)```", GUIDE, re.DOTALL)
    namespace: dict[str, Any] = {}
    exec(compile(code, "CONTRIBUTING.md", "exec"), namespace)
    return namespace


def test_the_guides_tool_runs_through_a_turn_and_the_model_sees_its_result() -> None:
    # covers T1 with the guide's own example: the model calls it, the next pass is sent
    # its result, the turn completes
    dice = _tool_example()["dice"]
    assert isinstance(dice, FunctionTool)
    passes = parse_scenario({"passes": [
        [{"at": 0.1, "tool_call": {"name": "roll_dice", "args": {"sides": 20}}}],
        [{"at": 0.2, "text": "You rolled it."}, {"at": 0.3, "end": "completed"}]]},
        "the guide's tool").passes
    provider = ScriptedProvider(passes)

    async def play() -> Any:
        locks = ChannelLockRegistry(stale_age_s=180)
        lock = locks.try_acquire("guide", owner="contributor")
        assert lock is not None
        return await Turn(
            provider=provider, channel=InMemoryChannel(), locks=locks, lock=lock,
            request=TurnRequest(context_items=[]), tools=ToolRegistry([dice]),
            stash=ContextStash(ttl_s=60, max_items=4, max_bytes=10_000),
            config=TurnConfig()).run()

    result = run_virtual(play)
    assert result.status == "completed" and result.delivered_text == "You rolled it."
    [entry] = provider.requests[1].function_history
    assert entry.tool_name == "roll_dice" and entry.success
    assert 1 <= entry.result["data"]["rolled"] <= 20
    schema = provider.requests[0].tools[0]["parameters"]["properties"]["sides"]
    assert (schema["minimum"], schema["maximum"]) == (2, 1000)


def test_the_readme_keeps_two_set_up_commands_and_ci_runs_the_test_one() -> None:
    # covers O14: the set-up section a newcomer reads is two commands; CI runs the second
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Set up and run", 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"```sh\n(.*?)```", section, re.DOTALL)
    commands = [line.split("#", 1)[0].strip() for line in block.splitlines()]
    assert commands == ["bash scripts/run.sh", "bash scripts/test.sh"]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert ci[-1].strip() == "bash scripts/test.sh"
    assert len(section.split()) < 300, "the set-up section grew: knobs go in configuration.md"
