"""The emulator held to Discord's documentation, one rule per test, each citing the page it
follows (https://discord.com/developers/docs/...): permissions, members, threads and forums,
message sends, nonce dedupe and field errors, interactions on the clock, rate limits and the
invalid-request counter. Real discord.py where it makes the request; a raw request where
it does not (enforce_nonce). Every test covers D2: the emulated Discord the Discord tests
stand on is no kinder than Discord."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import discord
import pytest

from discord_io.testing import DiscordEmulator, Fault, emulated_discord
from discord_io.testing import permissions as perms
from discord_io.testing.interactions import INITIAL_RESPONSE_S, TOKEN_LIFETIME_S
from discord_io.testing.rate_limits import GLOBAL_LIMIT

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]

SEND = "POST /channels/{channel_id}/messages"
HISTORY = "GET /channels/{channel_id}/messages"
EVERYTHING_BUT = perms.DEFAULT_EVERYONE


async def call(emu: DiscordEmulator, method: str, path: str,
               body: Any = None) -> tuple[int, Any]:
    """A raw REST call with the bot's token."""
    headers = {"Authorization": f"Bot {emu.token}"}
    async with aiohttp.ClientSession() as http, http.request(
            method, emu.base_url + path, json=body, headers=headers) as answer:
        return answer.status, await answer.json(content_type=None)


# ---- permissions: https://discord.com/developers/docs/topics/permissions -------------------

async def test_overwrites_apply_in_the_documented_order() -> None:
    # covers D2 (Topics › Permissions › Permission Overwrites: @everyone, then roles' denies
    # and allows together, then the member's own)
    async with emulated_discord() as (emu, _client):
        role = emu.add_role("helpers")
        emu.member_roles[emu.bot_id].append(role)
        channel = emu.channel_id
        emu.set_overwrite(channel, emu.guild_id, deny=perms.SEND_MESSAGES)
        assert not emu.permissions(channel, emu.bot_id) & perms.SEND_MESSAGES
        emu.set_overwrite(channel, role, allow=perms.SEND_MESSAGES)
        assert emu.permissions(channel, emu.bot_id) & perms.SEND_MESSAGES
        emu.set_overwrite(channel, emu.bot_id, deny=perms.SEND_MESSAGES, member=True)
        assert not emu.permissions(channel, emu.bot_id) & perms.SEND_MESSAGES
        other = emu.add_role("other")
        emu.member_roles[emu.bot_id].append(other)
        emu.set_overwrite(channel, other, deny=perms.SEND_MESSAGES)
        emu.set_overwrite(channel, emu.bot_id, member=True)  # the member's own: neutral
        # one role allows, another denies: the allow wins (they apply together)
        assert emu.permissions(channel, emu.bot_id) & perms.SEND_MESSAGES


async def test_owner_and_administrator_bypass_overwrites_and_view_gates_the_rest() -> None:
    # covers D2 (Topics › Permissions: compute_base_permissions; Implicit Permissions)
    async with emulated_discord() as (emu, _client):
        channel = emu.channel_id
        emu.set_overwrite(channel, emu.guild_id, deny=perms.VIEW_CHANNEL)
        assert emu.permissions(channel, emu.bot_id) == 0  # nothing without VIEW_CHANNEL
        assert emu.permissions(channel, emu.alice_id) == perms.ALL  # the owner
        admin = emu.add_role("admin", permissions=perms.ADMINISTRATOR)
        emu.member_roles[emu.bot_id].append(admin)
        assert emu.permissions(channel, emu.bot_id) == perms.ALL


async def test_a_send_without_send_messages_is_403_50013_and_without_view_50001() -> None:
    # covers D2 (Resources › Message › Create Message › Limitations; JSON error codes)
    async with emulated_discord() as (emu, client):
        channel = client.get_partial_messageable(emu.channel_id)
        emu.set_overwrite(emu.channel_id, emu.guild_id, deny=perms.SEND_MESSAGES)
        with pytest.raises(discord.Forbidden) as refused:
            await channel.send("hello")
        assert refused.value.code == 50013
        emu.set_overwrite(emu.channel_id, emu.guild_id, deny=perms.VIEW_CHANNEL)
        with pytest.raises(discord.Forbidden) as hidden:
            await channel.send("hello")
        assert hidden.value.code == 50001
        assert emu.channel_messages() == []


async def test_a_reply_needs_read_message_history_and_a_history_read_gets_nothing() -> None:
    # covers D2 (Resources › Message › Create Message: a reply needs READ_MESSAGE_HISTORY;
    # Get Channel Messages: without it "no messages will be returned")
    async with emulated_discord() as (emu, client):
        asked = emu.add_message(emu.channel_id, emu.alice_id, "question")
        emu.set_overwrite(emu.channel_id, emu.guild_id, deny=perms.READ_MESSAGE_HISTORY)
        channel = client.get_partial_messageable(emu.channel_id)
        with pytest.raises(discord.Forbidden) as refused:
            await channel.send("answer", reference=channel.get_partial_message(int(asked["id"])))
        assert refused.value.code == 160002
        plain = await channel.send("answer")  # a plain send is still allowed
        assert plain.reference is None
        assert [m async for m in channel.history(limit=10)] == []
        assert emu.requests_to(HISTORY)[-1].status == 200


async def test_an_interaction_carries_computed_member_and_app_permissions() -> None:
    # covers D2 (Interactions › Receiving and Responding › Interaction Object: member's
    # `permissions` and `app_permissions` are computed in the channel)
    async with emulated_discord() as (emu, _client):
        emu.commands[None] = [{"id": "1", "name": "kill"}]
        bob = int(emu.add_user("bob")["id"])
        emu.set_overwrite(emu.channel_id, emu.guild_id, deny=perms.SEND_MESSAGES)
        payload = emu.slash_command_payload("kill", user_id=bob)
        assert int(payload["member"]["permissions"]) == perms.implicit(
            EVERYTHING_BUT & ~perms.SEND_MESSAGES)
        assert not int(payload["app_permissions"]) & perms.SEND_MESSAGES


async def test_get_member_serves_roles_and_history_serves_plain_users() -> None:
    # covers D2 (Resources › Guild › Get Guild Member; Resources › Message: a message's
    # author is a user object, the member object only comes with gateway events)
    async with emulated_discord() as (emu, client):
        role = emu.add_role("regulars")
        emu.member_roles[emu.alice_id].append(role)
        emu.add_message(emu.channel_id, emu.alice_id, "hi")
        status, member = await call(emu, "GET", f"/guilds/{emu.guild_id}/members/{emu.alice_id}")
        assert status == 200 and member["roles"] == [str(role)]
        assert member["user"]["id"] == str(emu.alice_id)
        stranger = int(emu.add_user("stranger")["id"])
        emu.guilds[emu.guild_id]["members"].remove(stranger)
        status, body = await call(emu, "GET", f"/guilds/{emu.guild_id}/members/{stranger}")
        assert (status, body["code"]) == (404, 10007)
        [message] = [m async for m in client.get_partial_messageable(
            emu.channel_id).history(limit=5)]
        assert isinstance(message.author, discord.User)  # no member in history


# ---- threads: https://discord.com/developers/docs/topics/threads ---------------------------

async def test_threads_need_send_messages_in_threads_not_send_messages() -> None:
    # covers D2 (Topics › Threads › Permissions: "SEND_MESSAGES has no effect in threads")
    async with emulated_discord() as (emu, client):
        announcements = emu.add_announcement_channel("news")
        thread = emu.add_thread(announcements, "discussion")
        with pytest.raises(discord.Forbidden):
            await client.get_partial_messageable(announcements).send("in the channel")
        await client.get_partial_messageable(thread).send("in the thread")
        emu.set_role_permissions(emu.guild_id, EVERYTHING_BUT & ~perms.SEND_MESSAGES_IN_THREADS)
        with pytest.raises(discord.Forbidden) as refused:
            await client.get_partial_messageable(thread).send("again")
        assert refused.value.code == 50013


async def test_a_send_unarchives_an_archived_thread_and_a_locked_one_refuses() -> None:
    # covers D2 (Resources › Channel: "The API will helpfully automatically unarchive a
    # thread when sending a message"; Topics › Threads › Locked Threads; code 160005)
    async with emulated_discord() as (emu, client):
        archived = emu.add_thread(emu.channel_id, "old", archived=True)
        await client.get_partial_messageable(archived).send("back to life")
        assert emu.channels[archived]["thread_metadata"]["archived"] is False
        locked = emu.add_thread(emu.channel_id, "closed", archived=True, locked=True)
        with pytest.raises(discord.Forbidden) as refused:
            await client.get_partial_messageable(locked).send("let me in")
        assert refused.value.code == 160005
        assert emu.channels[locked]["thread_metadata"]["archived"] is True
        moderator = emu.add_role("mods", permissions=perms.MANAGE_THREADS)
        emu.member_roles[emu.bot_id].append(moderator)
        await client.get_partial_messageable(locked).send("moderating")


async def test_a_private_thread_is_invisible_to_non_members() -> None:
    # covers D2 (Topics › Threads › Public & Private Threads: "You must be invited ... or
    # be a moderator (MANAGE_THREADS)")
    async with emulated_discord() as (emu, client):
        private = emu.add_thread(emu.channel_id, "secret", private=True)
        with pytest.raises(discord.Forbidden) as refused:
            await client.get_partial_messageable(private).send("hi")
        assert refused.value.code == 50001
        emu.join_thread(private, emu.bot_id)
        await client.get_partial_messageable(private).send("hi")


async def test_forum_posts_are_threads_whose_first_message_shares_their_id() -> None:
    # covers D2 (Topics › Threads › Forums: "only threads can be created", the message and
    # the thread share an id; "Messages cannot be sent directly in forum channels")
    async with emulated_discord() as (emu, client):
        forum = emu.add_forum_channel("help")
        post = emu.add_forum_post(forum, emu.alice_id, "How do I?", "the question")
        assert emu.messages[post][post]["content"] == "the question"
        status, body = await call(emu, "POST", f"/channels/{forum}/messages", {"content": "x"})
        assert (status, body["code"]) == (400, 50008)
        fetched = await client.fetch_channel(post)
        assert isinstance(fetched, discord.Thread) and fetched.parent_id == forum
        status, thread = await call(emu, "GET", f"/channels/{post}")
        assert thread["message_count"] == 1


async def test_a_thread_from_a_message_opens_with_a_starter_message_reference() -> None:
    # covers D2 (Topics › Threads › New Message Types: THREAD_STARTER_MESSAGE "only contains
    # a message reference" to the message the thread was started from, which shares its id)
    async with emulated_discord() as (emu, client):
        asked = emu.add_message(emu.channel_id, emu.alice_id, "start here")
        thread = emu.add_thread(emu.channel_id, "topic", from_message=int(asked["id"]))
        assert thread == int(asked["id"])
        [starter] = [m async for m in client.get_partial_messageable(thread).history(limit=5)]
        assert starter.type is discord.MessageType.thread_starter_message
        assert starter.reference is not None and starter.reference.message_id == thread


# ---- messages: https://discord.com/developers/docs/resources/message -----------------------

async def test_enforce_nonce_returns_the_message_a_lost_answer_created() -> None:
    # covers D2 (Resources › Message › Create Message: enforce_nonce "that message will be
    # returned and no new message will be created")
    async with emulated_discord() as (emu, _client):
        emu.inject(SEND, Fault.answer_lost())
        body = {"content": "once", "nonce": "n-1", "enforce_nonce": True}
        status, _ = await call(emu, "POST", f"/channels/{emu.channel_id}/messages", body)
        assert status == 502 and len(emu.channel_messages()) == 1  # created, answer lost
        status, again = await call(emu, "POST", f"/channels/{emu.channel_id}/messages", body)
        assert status == 200 and again["id"] == emu.channel_messages()[0]["id"]
        assert again["nonce"] == "n-1" and len(emu.channel_messages()) == 1
        status, _ = await call(emu, "POST", f"/channels/{emu.channel_id}/messages",
                               {"content": "twice", "nonce": "n-1"})  # not enforced: new
        assert status == 200 and len(emu.channel_messages()) == 2


async def test_an_invalid_form_body_names_each_field_in_its_errors_object() -> None:
    # covers D2 (Reference › Error Messages: 50035 with a nested `errors` object)
    async with emulated_discord() as (emu, _client):
        body = {"content": "x" * 2001, "embeds": [{"title": "ok"}, {"title": "t" * 257}]}
        with emu.expect_spec_violations():
            status, answer = await call(emu, "POST", f"/channels/{emu.channel_id}/messages",
                                        body)
        assert (status, answer["code"]) == (400, 50035)
        assert answer["errors"]["content"]["_errors"][0]["code"] == "BASE_TYPE_MAX_LENGTH"
        assert answer["errors"]["embeds"]["1"]["title"]["_errors"][0]["code"] == (
            "BASE_TYPE_MAX_LENGTH")
        assert "0" not in answer["errors"]["embeds"]


async def test_a_reply_carries_its_parent_one_level_deep_as_it_is_now() -> None:
    # covers D2, D59 (Resources › Message › Message Object: `referenced_message` is "the
    # message associated with the message_reference" — the parent, not the parent's parent;
    # "If the field exists but is null, the referenced message was deleted")
    async with emulated_discord() as (emu, _client):
        channel = emu.channel_id
        root = emu.add_message(channel, emu.alice_id, "root")
        middle = emu.add_message(channel, emu.alice_id, "middle", reply_to=int(root["id"]))
        last = emu.add_message(channel, emu.alice_id, "last", reply_to=int(middle["id"]))
        status, fetched = await call(emu, "GET", f"/channels/{channel}/messages/{last['id']}")
        assert status == 200
        parent = fetched["referenced_message"]
        assert parent["id"] == middle["id"]
        assert parent["message_reference"]["message_id"] == root["id"]
        assert "referenced_message" not in parent  # the chain's next step is the client's
        await emu.gateway.message_update(channel, int(middle["id"]), "middle, edited")
        _, fetched = await call(emu, "GET", f"/channels/{channel}/messages/{last['id']}")
        assert fetched["referenced_message"]["content"] == "middle, edited"
        await emu.gateway.message_delete(channel, int(middle["id"]))
        _, history = await call(emu, "GET", f"/channels/{channel}/messages?limit=5")
        [reply] = [m for m in history if m["id"] == last["id"]]
        assert "referenced_message" in reply and reply["referenced_message"] is None


# ---- interactions: https://discord.com/developers/docs/interactions/receiving-and-responding

async def _interaction(emu: DiscordEmulator) -> dict[str, Any]:
    emu.commands[None] = [{"id": "1", "name": "kill"}]
    return emu.slash_command_payload("kill")


async def test_an_initial_response_after_3_seconds_is_10062_and_a_second_40060() -> None:
    # covers D2 ("you must send an initial response within 3 seconds"; codes 10062, 40060)
    async with emulated_discord() as (emu, _client):
        late = await _interaction(emu)
        answer = {"type": 4, "data": {"content": "ok"}}
        await asyncio.sleep(INITIAL_RESPONSE_S + 0.1)
        status, body = await call(emu, "POST", f"/interactions/{late['id']}/{late['token']}"
                                  "/callback", answer)
        assert (status, body["code"]) == (404, 10062)
        fresh = await _interaction(emu)
        path = f"/interactions/{fresh['id']}/{fresh['token']}/callback"
        assert (await call(emu, "POST", path, answer))[0] == 200
        status, body = await call(emu, "POST", path, answer)
        assert (status, body["code"]) == (400, 40060)


async def test_a_follow_up_token_expires_after_15_minutes() -> None:
    # covers D2 ("Interaction tokens are valid for 15 minutes"; 50027 Invalid Webhook Token)
    async with emulated_discord() as (emu, _client):
        payload = await _interaction(emu)
        path = f"/webhooks/{emu.application_id}/{payload['token']}"
        assert (await call(emu, "POST", path, {"content": "soon"}))[0] == 200
        await asyncio.sleep(TOKEN_LIFETIME_S + 1)
        status, body = await call(emu, "POST", path, {"content": "too late"})
        assert (status, body["code"]) == (401, 50027)


# ---- rate limits: https://discord.com/developers/docs/topics/rate-limits -------------------

async def test_every_answer_carries_its_bucket_headers() -> None:
    # covers D2 (Topics › Rate Limits › Header Format)
    async with emulated_discord() as (emu, client):
        channel = client.get_partial_messageable(emu.channel_id)
        await channel.send("one")
        [_ async for _ in channel.history(limit=1)]
        await client.fetch_user(emu.alice_id)
        rest = [r for r in emu.requests if not r.route.startswith("GET /gateway")]
        assert rest and all(r.response_headers and "X-RateLimit-Bucket" in r.response_headers
                            for r in rest)
        send = emu.requests_to(SEND)[0].response_headers or {}
        assert (send["X-RateLimit-Limit"], send["X-RateLimit-Remaining"]) == ("5", "4")


async def test_the_global_limit_answers_the_51st_request_in_a_second() -> None:
    # covers D2 (Topics › Rate Limits › Global Rate Limit: 50 requests per second;
    # Example Exceeded Global Rate Limit Response)
    async with emulated_discord() as (emu, _client):
        await asyncio.sleep(1.0)  # the log-in's requests are a second old
        statuses = [(await call(emu, "GET", f"/users/{emu.alice_id}"))[0]
                    for _ in range(GLOBAL_LIMIT + 1)]
        assert statuses[:GLOBAL_LIMIT] == [200] * GLOBAL_LIMIT
        limited = emu.requests[-1]
        assert limited.status == 429 and limited.response_headers is not None
        assert limited.response_headers["X-RateLimit-Global"] == "true"
        assert limited.response_headers["X-RateLimit-Scope"] == "global"
        status, body = await call(emu, "GET", f"/users/{emu.alice_id}")
        assert status == 429 and body["global"] is True and "code" not in body


async def test_invalid_requests_are_counted_but_shared_429s_are_not() -> None:
    # covers D2 (Topics › Rate Limits › Invalid Request Limit: 401, 403, 429 count; "429
    # errors returned with X-RateLimit-Scope: shared are not counted")
    async with emulated_discord() as (emu, client):
        emu.set_overwrite(emu.channel_id, emu.guild_id, deny=perms.SEND_MESSAGES)
        with pytest.raises(discord.Forbidden):
            await client.get_partial_messageable(emu.channel_id).send("no")
        before = emu.limits.invalid_in_window()
        assert before >= 1
        emu.inject(SEND, Fault.rate_limited(1.0, scope="shared"))
        status, body = await call(emu, "POST", f"/channels/{emu.channel_id}/messages",
                                  {"content": "x"})
        assert status == 429 and body["message"] == "The resource is being rate limited."
        assert emu.limits.invalid_in_window() == before


async def test_past_10000_invalid_requests_the_address_is_banned() -> None:
    # covers D2 (Topics › Rate Limits › Invalid Request Limit aka Cloudflare bans)
    async with emulated_discord() as (emu, _client):
        emu.limits.invalid_limit = 3  # 10,000 in production; the rule is the same
        emu.set_overwrite(emu.channel_id, emu.guild_id, deny=perms.SEND_MESSAGES)
        for _ in range(3):
            status, _ = await call(emu, "POST", f"/channels/{emu.channel_id}/messages",
                                   {"content": "x"})
            assert status == 403
        async with aiohttp.ClientSession() as http, http.get(
                emu.base_url + f"/users/{emu.alice_id}",
                headers={"Authorization": f"Bot {emu.token}"}) as banned:
            assert banned.status == 429 and "Via" not in banned.headers
