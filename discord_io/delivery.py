"""Delivery of one turn's reply into a Discord channel (D1, D2, S2).

`DiscordChannel` implements `fsm.engine.channel.TurnChannel`. Streamed text is buffered and cut into
messages at natural boundaries (see `splitting`); finished messages go to an outbox that a
separate pump task sends in order. So `deliver` never blocks the stream on Discord, a
cancelled caller cannot lose track of a send already on the wire, and every delivered
message is recorded for `cleanup`. Rate limits are discord.py's job (it honours 429
`retry_after` and the bucket headers); what still fails is raised as `DeliveryError`.
Model text goes out with link previews suppressed and its masked links unmasked (A6).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import aiohttp
import discord

from fsm import DeliveryCapReached, DestinationUnavailable, Notice, NoticeKind, TurnChannel

from .exclusion import Readable
from .links import unmask_links
from .rate_limits import guard_rate_limits
from .splitting import MESSAGE_LIMIT, Chunk, StreamSplitter
from .typing_indicator import TypingIndicator

log = logging.getLogger(__name__)

DEFAULT_IDLE_FLUSH_S = 5.0
DEFAULT_TYPING_RESUME_S = 2.0
DEFAULT_CLOSE_GRACE_S = 5.0
MAX_REACTORS = 100
EMBED_TITLE_LIMIT = 256
EMBED_DESCRIPTION_LIMIT = 4096
FEED_SLICE = 4096
"""Characters of one text delta fed to the splitter between two yields to the event loop."""

WARNING, PROGRESS, FAILURE, NOTE = 0xE67E22, 0x3498DB, 0xE74C3C, 0x95A5A6
NOTICE_COLOURS: dict[NoticeKind, int] = {
    "timeout_first_token": WARNING,
    "timeout_idle": WARNING,
    "delivery_cap": WARNING,
    "still_working": PROGRESS,
    "tool_error_loop": FAILURE,
    "max_iterations": FAILURE,
    "failed_context_too_long": FAILURE,
    "failed_unreachable": FAILURE,
    "failed_rejected_key": FAILURE,
    "failed_rate_limited": FAILURE,
    "failed_blocked": FAILURE,
    "failed_empty_reply": FAILURE,
    "failed_other": FAILURE,
    "answered_by_fallback": NOTE,
}
"""A notice's colour says what it is at a glance: a cut reply orange, progress blue, a reply
that failed red (whatever the provider's reason, G2), a note grey. Every kind has one
(tests/test_delivery_notices.py)."""
DEAD_DESTINATION_CODES = frozenset({50001, 50013, 10003})
"""Discord's codes for a send refused because of the channel itself: Missing Access,
Missing Permissions, Unknown Channel (G3). Another model cannot deliver there either."""
REPLY_WITHOUT_HISTORY = 160002
"""Discord's code for a reply refused (no READ_MESSAGE_HISTORY) where a plain send is not."""


class DeliveryError(RuntimeError):
    """A message could not be sent, so the reply in the channel is incomplete."""

    def __init__(self, message: str, *, status: int | None = None, code: int | None = None):
        super().__init__(message)
        self.status = status
        self.code = code


class DestinationRefused(DeliveryError, DestinationUnavailable):
    """Discord refuses sends to this channel at all (G3): the chain stops."""


@dataclass(frozen=True, slots=True)
class DeliveredMessage:
    """A message that reached Discord: its id, what was sent and the text it accounts for."""

    message_id: int
    content: str
    source: str
    kind: Literal["text", "notice"] = "text"


@dataclass(slots=True)
class _Outgoing:
    chunk: Chunk | None
    notice: Notice | None
    done: asyncio.Future[DeliveryError | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


def _describe(exc: BaseException) -> str:
    """An error's description for logs and `DeliveryError`: never headers, never the token."""
    if isinstance(exc, discord.HTTPException):
        return f"HTTP {exc.status} (Discord code {exc.code}): {exc.text or 'no details'}"
    if isinstance(exc, discord.RateLimited):
        return f"rate limited for {exc.retry_after:.1f} s beyond the allowed wait"
    return type(exc).__name__


def reaction_route_emoji(emoji: str) -> str:
    """The emoji as the reactions route wants it: unicode as is, custom as `name:id`."""
    partial = discord.PartialEmoji.from_str(emoji)
    if partial.id is not None:
        return f"{partial.name}:{partial.id}"
    return partial.name


class DiscordChannel(TurnChannel):
    """The Discord side of one turn; create one per turn (or per attempt to be cleaned up)."""

    def __init__(
        self,
        client: discord.Client,
        channel_id: int,
        *,
        reply_to: int | None = None,
        typing: TypingIndicator | None = None,
        limit: int = MESSAGE_LIMIT,
        flush_paragraphs: bool = False,
        idle_flush_s: float | None = DEFAULT_IDLE_FLUSH_S,
        typing_resume_s: float | None = DEFAULT_TYPING_RESUME_S,
        close_grace_s: float = DEFAULT_CLOSE_GRACE_S,
        max_messages: int | None = None,
        readable: Readable | None = None,
        link_previews: bool = False,
    ) -> None:
        self.channel_id = channel_id
        self.readable = readable
        """Which reactors the model may read (the access lists); None: everyone."""
        self.link_previews = link_previews
        """Let Discord unfurl the links the model writes (off: SUPPRESS_EMBEDS on every
        text message, A6; the bot's own notice embeds are not affected)."""
        self.max_messages = max_messages
        """The reply's bound in messages (D5): text past it is dropped and the next
        `deliver` or `finish_pass` raises `DeliveryCapReached`."""
        self.capped = False
        self._text_messages = 0
        self.reply_to = reply_to
        self.typing = typing
        self.flush_paragraphs = flush_paragraphs
        self.idle_flush_s = idle_flush_s
        self.typing_resume_s = typing_resume_s
        self.close_grace_s = close_grace_s
        self.delivered: list[DeliveredMessage] = []
        self.notices: list[DeliveredMessage] = []
        self.failure: DeliveryError | None = None
        self._client = client
        guard_rate_limits(client)  # `aclose` and a cancelled turn cancel sends in flight
        self._messageable = client.get_partial_messageable(channel_id)
        self._splitter = StreamSplitter(limit)
        self._outbox: deque[_Outgoing] = deque()
        self._unsettled: list[asyncio.Future[DeliveryError | None]] = []
        self._pump: asyncio.Task[None] | None = None
        self._idle: asyncio.Task[None] | None = None
        self._last_text_at = 0.0
        self._replied = False

    @property
    def delivered_text(self) -> str:
        """The streamed text that reached Discord, in order (what a fallback continues)."""
        return "".join(message.source for message in self.delivered)

    @property
    def pending_text(self) -> str:
        """Streamed text still buffered, not yet cut into a message."""
        return self._splitter.pending

    # ---- TurnChannel ---------------------------------------------------------------------

    async def deliver(self, text: str) -> None:
        if self.failure is not None:
            raise self.failure
        if not text:
            return
        if self.typing is not None:
            self.typing.start()
        for start in range(0, len(text), FEED_SLICE):
            if start:
                await asyncio.sleep(0)  # a huge delta must not hold every other channel
            chunks = self._splitter.feed(text[start : start + FEED_SLICE])
            if self.flush_paragraphs:
                chunks += self._splitter.flush_boundary()
            for chunk in chunks:
                self._enqueue(_Outgoing(chunk=chunk, notice=None))
        self._raise_if_capped()
        self._arm_idle_flush()

    async def finish_pass(self) -> None:
        self._cancel_idle_flush()
        unsent = any(not done.done() for done in self._unsettled)
        chunks = self._splitter.flush()
        sends = unsent or any(not chunk.is_trailer for chunk in chunks)
        if sends and self.typing is not None:
            # The pass's last messages are known: whatever they wait for, nothing is typed
            # before them (D50).
            await self.typing.stop()
        for chunk in chunks:
            self._enqueue(_Outgoing(chunk=chunk, notice=None))
        await self._settle()
        if sends and self.typing is not None and self.typing_resume_s is not None:
            # The engine may go on (tool call, next pass); the turn's owner stops it otherwise.
            self.typing.start(delay_s=self.typing_resume_s)
        if self.failure is not None:
            raise self.failure
        self._raise_if_capped()

    def discard_unsent(self) -> None:
        """Drop the buffered text and the messages queued behind a send in flight; the send
        in flight itself is on the wire and may still land (S10)."""
        self._cancel_idle_flush()
        self._splitter.flush()
        self._drop_queued()

    async def post_notice(self, notice: Notice) -> None:
        item = _Outgoing(chunk=None, notice=notice)
        self._enqueue(item)
        error = await item.done
        if error is not None:
            raise error

    async def fetch_reactors(self, message_id: str, emoji: str, limit: int) -> list[str]:
        """One REST call. A missing message or a failed call logs and yields no names."""
        if not message_id.isdigit():
            return []
        try:
            users = await self._client.http.get_reaction_users(
                self.channel_id,
                int(message_id),
                reaction_route_emoji(emoji),
                max(1, min(MAX_REACTORS, limit)),
            )
        except discord.NotFound:
            return []
        except (discord.HTTPException, discord.RateLimited, aiohttp.ClientError, OSError) as exc:
            log.warning("reactor look-up failed in channel %s: %s", self.channel_id, _describe(exc))
            return []
        if self.readable is not None:
            shown = await self.readable([int(user["id"]) for user in users])
            users = [user for user in users if int(user["id"]) in shown]
        return [user.get("global_name") or user["username"] for user in users]

    async def post_thoughts(self, channel_id: str, owner: str, text: str) -> None:
        """The reply's thought log, with its owner, in the operator's thought-log channel
        (T8), cut at natural boundaries like a reply; never a mention."""
        target = self._client.get_partial_messageable(int(channel_id))
        splitter = StreamSplitter(MESSAGE_LIMIT)
        chunks = splitter.feed(f"**Thoughts of {owner}:** {text}") + splitter.flush()
        for chunk in chunks:
            if not chunk.is_trailer:
                await target.send(content=unmask_links(chunk.content),
                                  suppress_embeds=not self.link_previews,
                                  allowed_mentions=discord.AllowedMentions.none())

    # ---- lifecycle -----------------------------------------------------------------------

    async def cleanup(self) -> int:
        """Delete every text message this channel delivered (a superseded attempt's output).

        Unsent text is dropped first. Returns how many messages were deleted; raises
        `DeliveryError` if some could not be (they stay listed in `delivered`).
        """
        self.discard_unsent()
        await self._settle()
        kept: list[DeliveredMessage] = []
        deleted = 0
        for message in self.delivered:
            try:
                await self._messageable.get_partial_message(message.message_id).delete()
                deleted += 1
            except discord.NotFound:
                deleted += 1
            except (discord.HTTPException, aiohttp.ClientError, OSError) as exc:
                log.warning("could not delete message %s: %s", message.message_id, _describe(exc))
                kept.append(message)
        self.delivered = kept
        self._text_messages = len(kept)  # what was deleted no longer counts (D5)
        if not kept and not self.notices:
            self._replied = False
        if kept:
            raise DeliveryError(f"{len(kept)} delivered message(s) could not be deleted")
        return deleted

    async def aclose(self) -> None:
        """Stop delivering: unsent text is dropped, an in-flight send gets a short grace."""
        self.discard_unsent()
        pump = self._pump
        if pump is not None and not pump.done():
            await asyncio.wait({pump}, timeout=self.close_grace_s)
            if not pump.done():
                pump.cancel()
                await asyncio.wait({pump})

    # ---- internals -----------------------------------------------------------------------

    def _enqueue(self, item: _Outgoing) -> None:
        if item.chunk is not None and not item.chunk.is_trailer and self._over_cap():
            item.done.set_result(None)
            return
        self._outbox.append(item)
        self._unsettled.append(item.done)
        if self._pump is None or self._pump.done():
            self._pump = asyncio.create_task(self._run_pump(), name=f"deliver:{self.channel_id}")

    def _over_cap(self) -> bool:
        """Count a text message against the bound; True (and capped) once past it (D5)."""
        if self.max_messages is None:
            return False
        if self._text_messages >= self.max_messages:
            if not self.capped:
                log.warning("channel %s: the reply reached its bound of %d messages",
                            self.channel_id, self.max_messages)
            self.capped = True
            return True
        self._text_messages += 1
        return False

    def _raise_if_capped(self) -> None:
        if self.capped:
            raise DeliveryCapReached(f"the reply reached its bound of {self.max_messages} "
                                     "messages")

    async def _settle(self) -> None:
        """Wait until everything enqueued so far was sent or failed."""
        waiting, self._unsettled = self._unsettled, []
        if waiting:
            await asyncio.wait(waiting)

    def _drop_queued(self) -> None:
        while self._outbox:
            item = self._outbox.popleft()
            if not item.done.done():
                item.done.set_result(None)

    async def _run_pump(self) -> None:
        while self._outbox:
            item = self._outbox.popleft()
            try:
                error = await self._send(item)
            except asyncio.CancelledError:
                if not item.done.done():
                    item.done.set_result(DeliveryError("delivery cancelled"))
                raise
            if not item.done.done():
                item.done.set_result(error)

    async def _send(self, item: _Outgoing) -> DeliveryError | None:
        if item.chunk is not None and self.failure is not None:
            return self.failure  # the reply already has a hole: send nothing after it
        if item.chunk is not None and item.chunk.is_trailer:
            self._account_trailer(item.chunk)
            return None
        kwargs: dict[str, Any] = {"allowed_mentions": discord.AllowedMentions.none()}
        if self.reply_to is not None and not self._replied:
            kwargs["reference"] = discord.MessageReference(
                message_id=self.reply_to, channel_id=self.channel_id, fail_if_not_exists=False
            )
        if item.chunk is not None:
            kwargs["content"] = unmask_links(item.chunk.content)
            kwargs["suppress_embeds"] = not self.link_previews
        else:
            assert item.notice is not None
            kwargs["embed"] = notice_embed(item.notice)
        try:
            sent = await self._send_or_unreference(kwargs)
        except (discord.HTTPException, discord.RateLimited, aiohttp.ClientError, OSError) as exc:
            error = self._failed(item, exc)
            if item.chunk is not None:
                self.failure = error
            return error
        self._replied = True
        if item.chunk is not None:
            self.delivered.append(DeliveredMessage(sent.id, kwargs["content"], item.chunk.source))
            if self.typing is not None:
                self.typing.poke()  # no-op once finish_pass stopped it for the last message
        else:
            assert item.notice is not None
            self.notices.append(DeliveredMessage(sent.id, "", "", kind="notice"))
        return None

    async def _send_or_unreference(self, kwargs: dict[str, Any]) -> discord.Message:
        """Send; when Discord refuses only the reply (403 160002: no READ_MESSAGE_HISTORY),
        send the same without the reference, and reply no more in this turn."""
        try:
            return await self._messageable.send(**kwargs)
        except discord.Forbidden as exc:
            if exc.code != REPLY_WITHOUT_HISTORY or "reference" not in kwargs:
                raise
        log.warning("channel %s: the reply was refused (no READ_MESSAGE_HISTORY); "
                    "answering without the reference", self.channel_id)
        self.reply_to = None
        del kwargs["reference"]
        return await self._messageable.send(**kwargs)

    def _account_trailer(self, trailer: Chunk) -> None:
        """Whitespace streamed after the pass's last message belongs to that message's
        account (nothing is sent: Discord would strip it). The pass's messages were queued
        before it, so the last one delivered is that message — unless a send failed, and
        then nothing after the hole is delivered (`_send`)."""
        if self.delivered:
            last = self.delivered[-1]
            self.delivered[-1] = replace(last, source=last.source + trailer.source)

    def _failed(self, item: _Outgoing, exc: BaseException) -> DeliveryError:
        what = (
            "message"
            if item.chunk is not None
            else f"{item.notice.kind if item.notice else ''} notice"
        )
        detail = _describe(exc)
        log.error("sending a %s to channel %s failed: %s", what, self.channel_id, detail)
        status = exc.status if isinstance(exc, discord.HTTPException) else None
        code = exc.code if isinstance(exc, discord.HTTPException) else None
        kind = DestinationRefused if code in DEAD_DESTINATION_CODES else DeliveryError
        return kind(
            f"could not send a {what} to channel {self.channel_id}: {detail}",
            status=status,
            code=code,
        )

    def _arm_idle_flush(self) -> None:
        if self.idle_flush_s is None:
            return
        self._last_text_at = asyncio.get_running_loop().time()
        if self._idle is None or self._idle.done():
            self._idle = asyncio.create_task(self._idle_flush(self.idle_flush_s))

    def _cancel_idle_flush(self) -> None:
        if self._idle is not None and not self._idle.done():
            self._idle.cancel()
        self._idle = None

    async def _idle_flush(self, idle_s: float) -> None:
        """When the stream pauses, send what is complete up to the last paragraph break.

        Compared with the deadline waited for, not with the clock: a deadline a rounding error
        past the loop's clock (text at 5.660298 s + 5 s) is due for the loop but would stay
        ahead of `loop.time()`, and re-sleeping for it spins forever on a virtual clock."""
        loop = asyncio.get_running_loop()
        waited: float | None = None
        while self._splitter.pending:
            deadline = self._last_text_at + idle_s
            if deadline != waited:  # the first wait, or text came in since: wait again
                waited = deadline
                await asyncio.sleep(deadline - loop.time())
                continue
            for chunk in self._splitter.flush_boundary():
                self._enqueue(_Outgoing(chunk=chunk, notice=None))
            return


def notice_embed(notice: Notice) -> discord.Embed:
    """A notice as an embed within Discord's title and description limits."""
    return discord.Embed(
        title=notice.title[:EMBED_TITLE_LIMIT],
        description=notice.description[:EMBED_DESCRIPTION_LIMIT],
        colour=NOTICE_COLOURS.get(notice.kind, NOTE),
    )
