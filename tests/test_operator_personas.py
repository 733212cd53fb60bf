"""Named persona files and Python tool hooks as an operator writes them (docs/spec.md M4, M1):
a TOML persona with a name and an avatar beside it, a plain-text one, and every mistake as
one line naming the file — also when the real bot process starts with it; a hook found as an
entry point of an installed distribution."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from turn_engine.persona_library import load_persona, load_personas
from turn_engine.settings import ConfigurationError
from turn_engine.tool_hooks import load_hook_tools

from engine_support import ROOT


def _png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (4, 4), "blue").save(out, format="PNG")
    return out.getvalue()


def test_a_toml_persona_with_a_name_and_an_avatar(tmp_path: Path) -> None:
    # covers M4: system_prompt, name, avatar (an image beside the file)
    (tmp_path / "pirate.png").write_bytes(_png())
    (tmp_path / "pirate.toml").write_text(
        'system_prompt = "You are {name}."\nname = "Captain"\navatar = "pirate.png"\n')
    persona = load_persona("pirate", tmp_path / "pirate.toml")
    assert (persona.system_prompt, persona.display_name) == ("You are {name}.", "Captain")
    assert persona.avatar == _png()
    (tmp_path / "tutor.md").write_text("You explain things slowly.\n")
    assert load_persona("tutor", tmp_path / "tutor.md").system_prompt == (
        "You explain things slowly.\n")


def test_every_mistake_in_a_persona_file_is_one_line_naming_it(tmp_path: Path) -> None:
    # covers M4: missing, not TOML, unknown key, no prompt, an avatar that is no image
    (tmp_path / "broken.toml").write_text("system_prompt = \n")
    (tmp_path / "extra.toml").write_text('system_prompt = "x"\ncolour = "red"\n')
    (tmp_path / "empty.toml").write_text('name = "Nobody"\n')
    (tmp_path / "fake.png").write_text("not an image")
    (tmp_path / "fake.toml").write_text('system_prompt = "x"\navatar = "fake.png"\n')
    files = {name: tmp_path / f"{name}.toml"
             for name in ("ghost", "broken", "extra", "empty", "fake")}
    with pytest.raises(ConfigurationError) as refused:
        load_personas(files)
    lines = refused.value.problems
    assert len(lines) == 5
    assert lines[0] == (f"personas.ghost (TURN_PERSONAS): cannot read the persona file "
                        f"{tmp_path / 'ghost.toml'} (FileNotFoundError)")
    assert lines[1].startswith(f"personas.broken (TURN_PERSONAS): the persona file "
                               f"{tmp_path / 'broken.toml'} is not valid TOML (")
    assert lines[2].endswith("unknown key colour (it may have avatar, name, system_prompt)")
    assert lines[3].endswith("needs a system_prompt (text)")
    assert lines[4].endswith("avatar fake.png is not a PNG, JPEG, GIF or WebP image")


def test_the_bot_does_not_start_with_a_missing_persona_file(tmp_path: Path) -> None:
    # covers M4, O2: one line, exit status 2, before Discord is contacted
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("TURN_")}
    env.update(PYTHONPATH=str(ROOT), TURN_DISCORD_TOKEN="not-a-real-token",
               TURN_PROVIDER='{"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1"}',
               TURN_PERSONAS='{"pirate": "personas/pirate.toml"}', TURN_JOURNALS__ENABLED="false")
    done = subprocess.run([sys.executable, "-m", "turn_engine"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert [line for line in done.stderr.splitlines() if line.startswith("error:")] == [
        "error: personas.pirate (TURN_PERSONAS): cannot read the persona file "
        "personas/pirate.toml (FileNotFoundError)"]
    assert "Traceback" not in done.stderr


@pytest.fixture
def installed_hook(tmp_path: Path) -> Iterator[None]:
    """A distribution on sys.path declaring the entry point `dice` in `turn_engine.tools`
    (what `pip install` of an operator's package leaves behind)."""
    dist = tmp_path / "operator_dice-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: operator-dice\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[turn_engine.tools]\ndice = hook_tools:TOOLS\n")
    sys.path.insert(0, str(tmp_path))
    try:
        yield
    finally:
        sys.path.remove(str(tmp_path))


def test_a_hook_named_by_an_entry_point(installed_hook: None) -> None:
    # covers M1: the name of an entry point in the group turn_engine.tools
    [tool] = load_hook_tools(["dice"])
    assert tool.name == "roll_die"
