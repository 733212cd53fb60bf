"""The emulator holds every Discord test to Discord's own OpenAPI spec: a request discord.py
sends or an answer the emulator gives that breaks it fails the test, naming the operation and
the JSON path; the documented overrides are each needed and each narrow. Every test here
covers D2 (the emulated Discord the Discord tests stand on)."""

from __future__ import annotations

import json

import discord
import pytest
from discord.http import Route

from discord_io.testing import SpecViolationError, connected_discord, emulated_discord
from discord_io.testing.spec_validation import (
    DOCUMENTED_OVERRIDES,
    SpecValidator,
    shared_validator,
)

BOT_AUTH = {"Authorization": "Bot x"}


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_a_request_that_breaks_the_spec_fails_the_test_naming_operation_and_path(
) -> None:
    # covers D2
    with pytest.raises(SpecViolationError) as caught:
        async with emulated_discord() as (emu, client):
            route = Route("POST", "/channels/{channel_id}/messages", channel_id=emu.channel_id)
            await client.http.request(route, json={"content": "ok", "tts": "yes"})
    [violation] = caught.value.violations
    assert (violation.operation, violation.direction, violation.json_path) == (
        "create_message", "request", "$.tts")
    assert "create_message request at $.tts" in str(caught.value)


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_an_answer_that_breaks_the_spec_fails_the_test() -> None:
    # covers D2
    with pytest.raises(SpecViolationError) as caught:
        async with emulated_discord() as (emu, client):
            del emu.users[emu.alice_id]["public_flags"]
            await client.fetch_user(emu.alice_id)
    [violation] = caught.value.violations
    assert (violation.operation, violation.direction, violation.status) == (
        "get_user", "response", 200)
    assert "'public_flags' is a required property" in violation.message


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_a_route_the_spec_does_not_know_is_a_violation() -> None:
    # covers D2
    with pytest.raises(SpecViolationError, match=r"no operation in the spec"):
        async with emulated_discord() as (_emu, client):
            with pytest.raises(discord.NotFound):
                await client.http.request(Route("GET", "/no/such/route"))


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_a_test_that_means_to_break_the_spec_takes_the_violations() -> None:
    # covers D2
    async with emulated_discord() as (emu, client):
        route = Route("POST", "/channels/{channel_id}/messages", channel_id=emu.channel_id)
        with (emu.expect_spec_violations() as violations,
              pytest.raises(discord.HTTPException, match="Must be an array")):
            await client.http.request(route, json={"content": "x", "embeds": "none"})
        assert [(v.operation, v.json_path) for v in violations] == [
            ("create_message", "$.embeds")]
        with (pytest.raises(AssertionError, match="expected traffic that breaks"),
              emu.expect_spec_violations()):
            await client.get_partial_messageable(emu.channel_id).send("fine")


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_a_failure_inside_the_test_is_not_masked_by_the_spec_check() -> None:
    # covers D2
    with pytest.raises(ZeroDivisionError):
        async with emulated_discord() as (emu, client):
            route = Route("POST", "/channels/{channel_id}/messages", channel_id=emu.channel_id)
            await client.http.request(route, json={"content": "ok", "tts": "yes"})
            _ = 1 / 0


def test_every_documented_override_is_needed_and_keeps_responses_strict() -> None:
    # covers D2: without the overrides, the published spec refuses what Discord's documentation
    # allows; with them, what Discord returns is still held to strings
    strict = SpecValidator(_published_spec())
    patched = shared_validator()
    rate_limited = json.dumps({"message": "You are being rate limited.", "retry_after": 1.5,
                               "global": False}).encode()
    reference = {"content": "hi", "message_reference": {"message_id": 1323802873036800006}}
    attachment = {"content": "f", "attachments": [{"id": 0, "filename": "a.txt"}]}
    for validator, broken in ((strict, True), (patched, False)):
        answer = validator.check_response(
            "POST", "/channels/1/messages", query={}, headers=BOT_AUTH, status=429,
            body=rate_limited, content_type="application/json")
        sends = [validator.check_request("POST", "/channels/1/messages", query={},
                                         headers=BOT_AUTH, body=body)
                 for body in (reference, attachment)]
        assert bool(answer) is broken
        assert [bool(s) for s in sends] == [broken, broken]
    integer_id_answer = json.dumps([{"id": 5, "username": "u", "discriminator": "0",
                                     "avatar": None, "global_name": None, "public_flags": 0,
                                     "flags": 0, "primary_guild": None}]).encode()
    [violation] = patched.check_response(
        "GET", "/channels/1/messages/2/reactions/x", query={}, headers=BOT_AUTH, status=200,
        body=integer_id_answer, content_type="application/json")
    assert violation.json_path == "$[0].id"
    field_error = json.dumps({"code": 50035, "message": "Invalid Form Body", "errors": {
        "content": {"_errors": [{"code": "BASE_TYPE_MAX_LENGTH", "message": "Too long."}]}}})
    assert strict.check_response("POST", "/channels/1/messages", query={}, headers=BOT_AUTH,
                                 status=400, body=field_error.encode(),
                                 content_type="application/json")
    assert not patched.check_response("POST", "/channels/1/messages", query={},
                                      headers=BOT_AUTH, status=400, body=field_error.encode(),
                                      content_type="application/json")
    assert len(DOCUMENTED_OVERRIDES) == 3


def _published_spec() -> dict[str, object]:
    from importlib import resources

    text = resources.files("discord_io.testing.discord_api_spec").joinpath(
        "openapi.json").read_text("utf-8")
    spec: dict[str, object] = json.loads(text)
    return spec


def test_server_errors_are_not_held_to_the_spec_which_describes_none() -> None:
    # covers D2: the spec has no 5xx answers; Discord's docs only say the server failed
    assert shared_validator().check_response(
        "POST", "/channels/1/messages", query={}, headers=BOT_AUTH, status=502,
        body=b"<html>bad gateway</html>", content_type="text/html") == []


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_objects_inside_gateway_events_are_held_to_the_rest_schemas() -> None:
    # covers D2: the spec describes HTTP only, but a MESSAGE_CREATE carries a message as
    # REST returns it
    with pytest.raises(SpecViolationError) as caught:
        async with connected_discord() as (emu, _client):
            message = emu.add_message(emu.channel_id, emu.alice_id, "hi")
            del message["flags"]
            await emu.gateway.dispatch("MESSAGE_CREATE", message, guild_id=emu.guild_id)
    [violation] = caught.value.violations
    assert str(violation) == ("gateway MESSAGE_CREATE event at $: "
                              "'flags' is a required property")


def test_rate_limit_headers_are_held_to_the_spec_when_an_answer_has_them() -> None:
    # covers D2: X-RateLimit-Limit is an integer
    body = json.dumps({"code": 10003, "message": "Unknown Channel"}).encode()
    [violation] = shared_validator().check_response(
        "GET", "/channels/1", query={}, headers=BOT_AUTH, status=404, body=body,
        content_type="application/json", response_headers={"X-RateLimit-Limit": "many"})
    assert (violation.operation, violation.direction) == ("get_channel", "response")
    assert "Failed to cast value to integer type: many" in violation.message
    assert not shared_validator().check_response(
        "GET", "/channels/1", query={}, headers=BOT_AUTH, status=404, body=body,
        content_type="application/json", response_headers={"X-RateLimit-Limit": "5"})
