"""The configuration an operator writes (O3): a TOML file beside the environment
and `.env`, the environment winning; misspelt names refused with a "did you mean"; every
problem one line naming the setting, never a secret; `api_key_env` found in `.env`; every
setting documented in `.env.example`; `.env` git-ignored. Bad values are generated
(Hypothesis). Covers the configuration rule of docs/spec.md (refused at start-up, field
named, secret never shown)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turn_engine.setting_names import field_paths
from turn_engine.settings import AppSettings, ConfigurationError, load_settings

from engine_support import ROOT
from settings_support import environment, problems

SECRET = "discord-token-that-must-never-show"


def test_file_then_dotenv_then_environment(tmp_path: Path) -> None:
    # covers O3: a TOML file beside env vars, env overriding the file
    (tmp_path / "turn.toml").write_text(
        '[engine]\nidle_timeout_s = 77\nmax_iterations = 9\n'
        '[history]\nmode = "reply_chain"\n[access]\nblocked_users = [1, 2]\n')
    (tmp_path / ".env").write_text("TURN_ENGINE__MAX_ITERATIONS=8\n")
    with environment(tmp_path, TURN_ENGINE__IDLE_TIMEOUT_S="30"):
        loaded = load_settings()
    assert loaded.engine.idle_timeout_s == 30  # environment over file
    assert loaded.engine.max_iterations == 8  # .env over file
    assert loaded.history.mode == "reply_chain" and loaded.access.blocked_users == [1, 2]


def test_config_file_named_by_variable_and_missing(tmp_path: Path) -> None:
    # covers O3: TURN_CONFIG_FILE, and one line when it is not there
    (tmp_path / "bot.toml").write_text('queue_limit = 3\n')
    with environment(tmp_path, TURN_CONFIG_FILE="bot.toml"):
        assert load_settings().queue_limit == 3
    assert problems(tmp_path, TURN_CONFIG_FILE="nope.toml") == [
        "TURN_CONFIG_FILE: no file at nope.toml"]
    (tmp_path / "turn.toml").write_text("[engine\n")
    [line] = problems(tmp_path)
    assert line.startswith("turn.toml: not valid TOML")


def test_misspelt_names_get_a_suggestion(tmp_path: Path) -> None:
    # covers O3: an unknown TURN_* name is an error with "did you mean"
    assert problems(tmp_path, TURN_ENGIN__IDLE_TIMEOUT_S="90", TURN_HISTROY__MODE="recent") == [
        "TURN_ENGIN__IDLE_TIMEOUT_S: not a setting (did you mean TURN_ENGINE__IDLE_TIMEOUT_S?)",
        "TURN_HISTROY__MODE: not a setting (did you mean TURN_HISTORY__MODE?)",
    ]
    (tmp_path / ".env").write_text("TURN_DISCORD_TOKN=x\n")
    assert problems(tmp_path) == [
        "TURN_DISCORD_TOKN: not a setting (did you mean TURN_DISCORD_TOKEN?)"]
    (tmp_path / ".env").unlink()
    (tmp_path / "turn.toml").write_text("[history]\nmax_mesages = 3\n")
    assert problems(tmp_path) == [
        "turn.toml: [history] max_mesages: not a setting (did you mean max_messages?)"]


def test_free_form_maps_accept_any_key(tmp_path: Path) -> None:
    # covers O3: a provider's extra headers are not "unknown settings"
    provider = json.dumps({"kind": "openai", "model": "m"})
    with environment(tmp_path, TURN_PROVIDER=provider,
                     TURN_PROVIDER__EXTRA_HEADERS__X_TITLE="my bot"):
        loaded = load_settings()
    assert loaded.provider is not None
    assert loaded.provider.extra_headers == {"x_title": "my bot"}


def test_api_key_env_is_found_in_dotenv(tmp_path: Path) -> None:
    # covers O3: a key in .env is not reported missing
    (tmp_path / ".env").write_text(
        "MY_KEY=sk-from-dotenv\nOTHER_KEY=sk-second\n"
        'TURN_PROVIDER={"kind": "openai", "model": "m", "api_key_env": "MY_KEY", '
        '"api_key_envs": ["OTHER_KEY"]}\n')
    with environment(tmp_path):
        loaded = load_settings()
    assert loaded.provider is not None
    assert loaded.provider.keys() == ("sk-from-dotenv", "sk-second")
    assert "sk-from-dotenv" in loaded.secrets()
    [line] = problems(tmp_path, TURN_PROVIDER=json.dumps(
        {"kind": "openai", "model": "m", "api_key_env": "NOWHERE_SET"}))
    assert "NOWHERE_SET" in line and line.startswith("provider (TURN_PROVIDER)")


def test_token_without_provider_is_one_line(tmp_path: Path) -> None:
    # covers O2: no provider configured when a token is
    [line] = problems(tmp_path, TURN_DISCORD_TOKEN=SECRET)
    assert line.startswith("TURN_PROVIDER: not set") and SECRET not in line


def test_a_missing_persona_file_is_one_line(tmp_path: Path) -> None:
    # covers O4: the persona file is checked at start-up, not at the first reply
    [line] = problems(tmp_path, TURN_SYSTEM_PROMPT_FILE="persona.txt")
    assert line.startswith("system_prompt_file (TURN_SYSTEM_PROMPT_FILE): Value error, "
                           "cannot read the persona file persona.txt"), line


def test_json_that_does_not_parse_names_the_field(tmp_path: Path) -> None:
    # covers O3: pydantic-settings' SettingsError becomes one line too
    assert problems(tmp_path, TURN_FALLBACKS="[{oops") == [
        "fallbacks (TURN_FALLBACKS): not valid JSON at character 3; expected a JSON list such "
        'as [{"kind": "openai", "model": "…", "base_url": "…"}] (see .env.example)']


LEAVES = [path for path in field_paths(AppSettings)[0]
          if not any(path[:len(p)] == p and len(path) > len(p)
                     for p in [("provider",), ("fallbacks",)])]
NUMERIC = ["TURN_QUEUE_LIMIT", "TURN_HISTORY__MAX_MESSAGES", "TURN_ENGINE__IDLE_TIMEOUT_S",
           "TURN_JOURNALS__MAX_FILES", "TURN_SHUTDOWN_GRACE_S", "TURN_ATTACHMENTS__MAX_IMAGES"]
LISTS = ["TURN_ACCESS__ALLOWED_USERS", "TURN_TRIGGER_WORDS", "TURN_FALLBACKS",
         "TURN_GC__THRESHOLDS", "TURN_TOOLS__ALLOWED", "TURN_ACCESS__KILL_ROLES"]
CHOICES = ["TURN_HISTORY__MODE", "TURN_LOG__LEVEL", "TURN_ENGINE__THOUGHT_LOG"]

bad_numbers = st.one_of(st.text(alphabet="abcxyz!@ ", min_size=1, max_size=8),
                        st.sampled_from(["-1", "0", "1e999", "nan", "[]", "{}"]))
bad_lists = st.one_of(st.text(alphabet='[{"ab,:1 ', min_size=1, max_size=10),
                      st.sampled_from(['{"a": 1}', '[[1]]', '["x", {}]', '[-5]']))
bad_choices = st.text(alphabet="qwerty_", min_size=1, max_size=8)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_generated_bad_values_are_one_line_each_naming_the_field(
        tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    # covers O3 with generated bad values: refused, one line per problem, the
    # setting named, the token never shown
    directory = tmp_path_factory.mktemp("cfg", numbered=True)
    name = data.draw(st.sampled_from(NUMERIC + LISTS + CHOICES))
    if name in NUMERIC:
        value = data.draw(bad_numbers)
    elif name in LISTS:
        value = data.draw(bad_lists)
    else:
        value = data.draw(bad_choices)
    provider = json.dumps({"kind": "openai", "model": "m"})
    with environment(directory, **{name: value, "TURN_DISCORD_TOKEN": SECRET,
                                   "TURN_PROVIDER": provider}):
        try:
            load_settings()
        except ConfigurationError as exc:
            lines = exc.problems
        else:
            lines = []
    if not lines:
        # Some generated values are valid after all (e.g. "0" where zero is allowed).
        return
    field = name.removeprefix("TURN_").lower().replace("__", ".")
    assert all("\n" not in line and SECRET not in line for line in lines)
    assert any(field in line or name in line for line in lines), lines


def test_generated_misspellings_always_get_refused(tmp_path: Path) -> None:
    # covers O3: every one-letter slip of every setting name is caught
    names = ["TURN_" + "__".join(p).upper() for p in LEAVES]
    for name in names:
        slip = name[:-1] + ("X" if name[-1] != "X" else "Y")
        if slip in names:
            continue
        lines = problems(tmp_path, **{slip: "1"})
        assert len(lines) == 1 and lines[0].startswith(f"{slip}: not a setting"), lines


def test_every_setting_is_documented_in_env_example() -> None:
    # covers O3: .env.example documents every setting
    text = (ROOT / ".env.example").read_text()
    documented = set(re.findall(r"\bTURN_[A-Z0-9_]+", text))
    leaves = {"TURN_" + "__".join(p).upper() for p in LEAVES
              if AppSettings.model_fields.get(p[0]) is None
              or len(p) > 1 or not _is_group(p[0])}
    assert sorted(leaves - documented) == []


def _is_group(name: str) -> bool:
    return any(path[0] == name and len(path) > 1 for path in LEAVES)


def test_dotenv_is_git_ignored(tmp_path: Path) -> None:
    # covers O3: .env never gets committed by accident
    result = subprocess.run(["git", "check-ignore", "-q", ".env"], cwd=ROOT, check=False)
    assert result.returncode == 0
