"""What an operator reads when the configuration is wrong (SPEC O11, O12): each mistake names
where it was written — the variable, or the file, its section and key — every mistake of one
configuration is reported in the same run, JSON that does not parse says so, an API key
written into a provider object is refused, and every URL setting is checked when settings
load, without any part of the URL shown (it may carry a password)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from turn_engine.settings import load_settings
from turn_engine.url_settings import http_url_problem, redis_url_problem

from engine_support import ROOT
from settings_support import environment, problems

PROVIDER = json.dumps({"kind": "openai", "model": "m"})


def test_a_file_mistake_names_the_file_section_and_key(tmp_path: Path) -> None:
    # covers O11: a value from turn.toml is named by file, section and key, never by a
    # variable nobody set; a variable that overrides the file is named as the variable
    (tmp_path / "turn.toml").write_text(
        'queue_limit = "many"\n'
        '[engine]\nidle_timeout_s = "soon"\nmax_iterations = 0\n'
        '[history]\nmode = "everything"\n'
        '[[fallbacks]]\nkind = "openai"\nmodel = "a"\n'
        '[[fallbacks]]\nkind = "openai"\n')
    assert problems(tmp_path, TURN_PROVIDER=PROVIDER, TURN_ENGINE__MAX_ITERATIONS="-1") == [
        "turn.toml: [[fallbacks]] #2 model: Field required",
        "turn.toml: [engine] idle_timeout_s: Input should be a valid number, unable to parse "
        "string as a number",
        "engine.max_iterations (TURN_ENGINE__MAX_ITERATIONS): Input should be greater than or "
        "equal to 1",
        "turn.toml: queue_limit: Input should be a valid integer, unable to parse string as an "
        "integer",
        "turn.toml: [history] mode: Input should be 'recent' or 'reply_chain'",
    ]
    (tmp_path / "turn.toml").write_text('[provider]\nkind = "openai"\n[engine]\nstash = 1\n')
    assert problems(tmp_path) == [
        "turn.toml: [engine] stash: not a setting (did you mean stash_ttl_s?)",
        "turn.toml: [provider] model: Field required"]


def test_every_mistake_is_reported_in_one_run(tmp_path: Path) -> None:
    # covers O11: misspelt names, unknown keys, JSON that does not parse and wrong values are
    # all reported at once, so fixing one never reveals the next on a second run
    (tmp_path / "turn.toml").write_text('[history]\nmax_mesages = 3\nmax_chars = 1\n')
    (tmp_path / ".env").write_text("TURN_ACCESS__ALLOWED_USERS=[1, 2\n")
    lines = problems(tmp_path, TURN_PROVIDER=PROVIDER, TURN_HISTROY__MODE="recent",
                     TURN_FALLBACKS="[{oops", TURN_QUEUE_LIMIT="0")
    assert [line.split(":")[0] for line in lines] == [
        "TURN_HISTROY__MODE", "turn.toml", "access.allowed_users (TURN_ACCESS__ALLOWED_USERS)",
        "fallbacks (TURN_FALLBACKS)", "queue_limit (TURN_QUEUE_LIMIT)", "turn.toml"]
    assert lines[2] == (
        "access.allowed_users (TURN_ACCESS__ALLOWED_USERS): not valid JSON at character 6; "
        'expected a JSON list such as ["…", "…"] (see .env.example)')
    assert lines[5] == ("turn.toml: [history] max_chars: Input should be greater than or "
                        "equal to 100")


def test_provider_json_that_does_not_parse_says_so(tmp_path: Path) -> None:
    # covers O11: TURN_PROVIDER is JSON; a typo in it says "not valid JSON", as the list
    # settings do, and JSON of the wrong shape says what it is
    assert problems(tmp_path, TURN_PROVIDER="{kind: openai}") == [
        "provider (TURN_PROVIDER): not valid JSON at character 2; expected a JSON object such "
        'as {"kind": "openai", "model": "…", "base_url": "…"} (see .env.example)']
    assert problems(tmp_path, TURN_PROVIDER='["openai"]') == [
        "provider (TURN_PROVIDER): expected a JSON object, got a list"]
    (tmp_path / "turn.toml").write_text('provider = "openai"\n')
    assert problems(tmp_path) == ["turn.toml: provider: expected a table, got a string"]


def test_a_mistake_inside_the_provider_json_names_its_field_once(tmp_path: Path) -> None:
    # covers O11: a misspelt field gets a "did you mean", and a field of several types
    # (`tools`: true, false or a list of names) is one line naming the field, not one per
    # type pydantic tried, and never a variable that does not exist
    provider = json.dumps({"kind": "openai", "model": "m", "modle": "x", "tools": "maybe"})
    assert problems(tmp_path, TURN_PROVIDER=provider) == [
        "provider.tools (TURN_PROVIDER): Input should be a valid boolean, unable to interpret "
        "input, or expected a JSON list, got a string",
        "provider.modle (TURN_PROVIDER): not a setting (did you mean model?)"]


SECRET_KEY = "sk-live-0123456789abcdef0123456789abcdef"


def test_an_api_key_written_into_a_provider_is_refused(tmp_path: Path) -> None:
    # covers O11: keys live in variables of their own (api_key_env), never in the provider
    # object; the refusal names where the key was written and never shows it
    inline = json.dumps({"kind": "openai", "model": "m", "api_key": SECRET_KEY})
    assert problems(tmp_path, TURN_PROVIDER=inline) == [
        "provider.api_key (TURN_PROVIDER): an API key written into the provider is refused; "
        "put the key in .env as a variable of its own and name that variable in api_key_env"]
    (tmp_path / "turn.toml").write_text(
        f'[[fallbacks]]\nkind = "openai"\nmodel = "m"\napi_keys = ["{SECRET_KEY}"]\n')
    [line] = problems(tmp_path, TURN_PROVIDER=PROVIDER)
    assert line.startswith("turn.toml: [[fallbacks]] #1 api_keys: an API key written into "
                           "the provider is refused") and line.endswith("api_key_envs")
    (tmp_path / "turn.toml").unlink()
    (tmp_path / ".env").write_text(f"MY_KEY={SECRET_KEY}\n")
    named = json.dumps({"kind": "openai", "model": "m", "api_key_env": "MY_KEY"})
    with environment(tmp_path, TURN_PROVIDER=named):
        settings = load_settings()
    assert settings.provider is not None and settings.provider.keys() == (SECRET_KEY,)


# Each bad URL, the setting it goes in, and the part the line must blame. The pieces of each
# value (password, host, port, path) must never appear in the line.
BAD_URLS = [
    ("TURN_REDIS_URL", "redis://:hunter2@127.0.0.1:notaport/0", "its port is not a number"),
    ("TURN_REDIS_URL", "redis://:hunter2@127.0.0.1:99999/0", "its port is not a number"),
    ("TURN_REDIS_URL", "redis://:hun/ter2@cache.internal/0", "its port is not a number"),
    ("TURN_REDIS_URL", "redis://:hunter2@/0", "it names no host"),
    ("TURN_REDIS_URL", "redis://:hunter2@cache.internal/zero", "the database"),
    ("TURN_REDIS_URL", "cache.internal:6379", "it does not start with redis://"),
    ("TURN_REDIS_URL", "unix://", "it names no socket path"),
    ("TURN_REDIS_URL", "redis://:hunter2@cache.internal/0?socket_timeout=soon",
     "redis-py refuses one of its options"),
    ("TURN_REDIS_URL", "redis://:hunter 2@cache.internal/0", "a space"),
    ("TURN_TELEMETRY__OTLP_ENDPOINT", "localhost:4318/v1/traces",
     "it does not start with http:// or https://"),
    ("TURN_TELEMETRY__OTLP_ENDPOINT", "http://collector.internal:43l8/v1/traces",
     "its port is not a number"),
    ("TURN_PROVIDER__BASE_URL", "http://[::1/v1", "unclosed [ ]"),
    ("TURN_PROVIDER__BASE_URL", "https://user:hunter2@:8080/v1", "it names no host"),
    ("TURN_PROVIDER__BASE_URL", "http://models.internal:0/v1", "its port is not a number"),
]


@pytest.mark.parametrize(("name", "url", "blamed"), BAD_URLS)
def test_a_url_setting_that_cannot_be_used_is_one_line_without_the_url(
        tmp_path: Path, name: str, url: str, blamed: str) -> None:
    # covers O12: every URL setting is checked when settings load; the line names the
    # setting and the part at fault, and shows no piece of the value
    values = {name: url, "TURN_PROVIDER": PROVIDER} if name != "TURN_PROVIDER__BASE_URL" \
        else {"TURN_PROVIDER": PROVIDER, name: url}
    [line] = problems(tmp_path, **values)
    assert line.startswith(f"{name.removeprefix('TURN_').lower().replace('__', '.')} ({name}): "
                           "not a usable"), line
    assert blamed in line
    pieces = {p for p in url.replace("@", "/").replace(":", "/").split("/") if len(p) > 1}
    shown = {piece for piece in pieces - {"redis", "http", "https", "unix", "v1", "0"}
             if piece in line}
    assert not shown, f"{line!r} shows {shown}"


def test_a_fallbacks_base_url_is_checked_in_every_entry(tmp_path: Path) -> None:
    # covers O12: every attempt's URL, each named by its place in the list
    fallbacks = json.dumps([{"kind": "openai", "model": "a", "base_url": "http://ok:8080/v1"},
                            {"kind": "openai", "model": "b", "base_url": "http://x:y/v1"},
                            {"kind": "openai", "model": "c", "base_url": "http://z:-1/v1"}])
    lines = problems(tmp_path, TURN_PROVIDER=PROVIDER, TURN_FALLBACKS=fallbacks)
    assert [line.split(":")[0] for line in lines] == [
        "fallbacks.1.base_url (TURN_FALLBACKS)", "fallbacks.2.base_url (TURN_FALLBACKS)"]


@pytest.mark.parametrize("url", [
    "redis://127.0.0.1:6379/0", "redis://:pw@cache.internal", "rediss://u:p@cache:6380/2",
    "unix:///run/redis/redis.sock", "redis://[::1]:6379", "redis://h/0?socket_timeout=5"])
def test_usable_redis_urls_are_accepted(url: str) -> None:
    # covers O12: the check refuses only what redis-py could not connect with
    assert redis_url_problem(url) is None


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:8080/v1", "https://api.openai.com/v1", "http://[::1]:11434/v1",
    "https://generativelanguage.googleapis.com/v1beta", "http://localhost:4318/v1/traces"])
def test_usable_http_urls_are_accepted(url: str) -> None:
    # covers O12: the check refuses only what aiohttp could not connect to
    assert http_url_problem(url) is None


@pytest.mark.asyncio
async def test_the_main_job_with_a_bad_redis_url_exits_2_with_one_line(tmp_path: Path) -> None:
    # covers O12 through the process, as issue 22 item 11 found it: no traceback, exit 2
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "turn_engine", cwd=tmp_path,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("TURN_")},
             "PYTHONPATH": str(ROOT), "TURN_PROVIDER": PROVIDER, "TURN_DISCORD_TOKEN": "t0ken",
             "TURN_REDIS_URL": "redis://:hunter2@127.0.0.1:notaport/0"},
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    lines = err.decode().splitlines()
    assert proc.returncode == 2, err.decode()
    assert lines == ["error: redis_url (TURN_REDIS_URL): not a usable Redis URL: its port is "
                     "not a number from 1 to 65535 (expected redis://[:password@]host[:port]"
                     "[/db], rediss://… or unix:///path/to/socket)"]
    assert b"hunter2" not in out + err and b"notaport" not in err
