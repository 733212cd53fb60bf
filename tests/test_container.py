"""The bot in a container (SPEC O15), as far as it can be checked without a Docker engine:
compose.yaml mounts nothing a fresh clone lacks (no turn.toml), the image looks for turn.toml
in its working directory instead of naming a file that must exist, and the settings the bot
loads there work with no turn.toml, read one that is mounted, and refuse in one line the
directory Docker makes when a mounted file is missing (Docker's bind-mount documentation:
"If you use --volume to bind-mount a file or directory that does not yet exist on the Docker
host, Docker automatically creates the directory on the host for you")."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

from turn_engine.settings import load_settings

from engine_support import ROOT
from settings_support import environment, problems


def _fresh_clone_files() -> set[str]:
    listing = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True)
    return set(listing.stdout.split())


def _dockerfile() -> tuple[str, dict[str, str]]:
    """The image's last WORKDIR and its ENV settings."""
    workdir, env = "/", {}
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    for line in text.splitlines():
        keyword, _, rest = line.strip().partition(" ")
        if keyword == "WORKDIR":
            workdir = rest.strip()
        elif keyword == "ENV":
            env.update(pair.split("=", 1) for pair in rest.split())
    return workdir, env


def test_compose_mounts_nothing_a_fresh_clone_lacks() -> None:
    # covers O15: `docker compose up` needs no turn.toml (a missing bind-mounted file
    # would be created as a directory and stop the bot)
    compose: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())
    [service] = compose["services"].values()
    named = set(compose.get("volumes") or {})
    files = _fresh_clone_files()
    for volume in service.get("volumes", []):
        source = volume.split(":", 1)[0] if isinstance(volume, str) else volume["source"]
        assert source in named or source.removeprefix("./") in files, volume
    assert "TURN_CONFIG_FILE" not in json.dumps(service.get("environment", {}))
    assert service["env_file"] == ".env" and ".env.example" in files
    assert "turn.toml:/config/turn.toml" in (ROOT / "compose.yaml").read_text()  # documented


def test_the_image_finds_turn_toml_in_its_working_directory_or_goes_without(
        tmp_path: Path) -> None:
    # covers O15: the image names no settings file that must exist; in its working
    # directory the settings load without one, read a mounted one, and refuse the
    # directory Docker makes for a missing one in one line
    workdir, env = _dockerfile()
    assert workdir == "/config" and "TURN_CONFIG_FILE" not in env
    assert env["TURN_JOURNALS__DIR"] == "/data/journals"
    config = tmp_path / "config"
    config.mkdir()
    with environment(config, TURN_JOURNALS__DIR=env["TURN_JOURNALS__DIR"]):
        assert load_settings().journals.dir == "/data/journals"
    (config / "turn.toml").write_text("[history]\nmax_messages = 7\n")
    with environment(config):
        assert load_settings().history.max_messages == 7
    (config / "turn.toml").unlink()
    (config / "turn.toml").mkdir()
    assert problems(config) == [
        "turn.toml: a directory, not a settings file (Docker makes one when it mounts a file "
        "that does not exist: create turn.toml first, or drop the mount)"]
