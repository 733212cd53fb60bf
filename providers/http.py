"""The HTTP half every adapter shares: request, abort wiring, SSE reading, error mapping.

An adapter subclass only says where to POST, how to authenticate, how to write the body and
how to decode its events (a `StreamDecoder`, which does no I/O). This class owns everything
that must behave the same for all providers:

- abort (S3): until the response arrives the abort cancels the request task; afterwards it
  closes the response, which makes the pending read fail at once. Either way the stream
  ends quietly, without raising and without a trailing error event;
- failures are events, not exceptions: HTTP errors, in-band errors, dropped connections and
  malformed events all become one final `ProviderError`, with the API key scrubbed out;
- capabilities the config declares: tools it may not receive are left out
  (`allowed_tools`), and the exact echo of a native prefill is dropped (`prefill.EchoStrip`);
- a reply of whitespace only reaches the engine as no text at all (`LeadingBlank`): Discord
  would show nothing, so it is an empty response;
- a leading `<think>…</think>` block is reasoning, not text (`ThinkTags`, P4), where the
  config reads think tags (kind `openai` by default);
- key rotation (G4, `keys.py`): an auth or rate-limit answer tries the provider's next key;
- redirects are never followed: a 3xx is an error naming its status and target host;
- a request dropped unanswered by a closing keep-alive connection is sent once more (P8);
- a response read to the end returns its connection to the pool; any other ending closes
  the connection, so nothing outlives the pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp

from fsm import (
    AbortSignal,
    KeepAlive,
    PassRequest,
    ProviderError,
    ProviderEvent,
    ReasoningDelta,
    TextDelta,
    ToolCallRequest,
)

from .errors import (
    MESSAGE_LIMIT,
    cut_message,
    error_details,
    http_error,
    redirect_error,
    stream_error,
)
from .keys import KeyRing, rotates
from .prefill import PREFILL_NATIVE, EchoStrip, PrefillMode
from .sse import SSEComment, SSEEvent, SSEItem, SSEParser
from .stream_filters import LeadingBlank, StreamFilter, finish_filters, run_filters
from .surrogates import SurrogatePairs
from .think_tags import ThinkTags

if TYPE_CHECKING:
    from .context import ToolSpec

if TYPE_CHECKING:
    from .config import ProviderConfig

logger = logging.getLogger(__name__)

_ERROR_BODY_LIMIT = 64 * 1024
_TYPE_LIMIT = 100


class StreamDecoder(Protocol):
    """One stream's decoding state: SSE events in, provider events out, no I/O."""

    @property
    def done(self) -> bool:
        """True once the provider said the stream is over ([DONE], message_stop)."""
        ...

    def feed(self, event: SSEEvent) -> list[ProviderEvent]: ...

    def finish(self) -> list[ProviderEvent]:
        """Events owed at the end of a stream that ended cleanly (or an incomplete-stream
        error when it ended without the provider's finish marker)."""
        ...


def _ignore() -> None:
    return None


class SSEProvider(ABC):
    """Base of the three adapters; satisfies `fsm.engine.provider.Provider`."""

    def __init__(
        self,
        config: ProviderConfig,
        session: aiohttp.ClientSession,
        *,
        on_bytes: Callable[[], None] | None = None,
    ) -> None:
        self.config = config
        self.name = f"{config.kind}:{config.model}"
        self._session = session
        self._on_bytes = on_bytes or _ignore
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=config.connect_timeout_s, sock_read=config.read_timeout_s
        )
        self._keys = KeyRing(len(config.keys()), config.key_bench_s)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, base_url={self.config.endpoint_base!r})"

    @abstractmethod
    def endpoint(self) -> str:
        """The streaming URL, without query parameters."""

    @abstractmethod
    def auth_headers(self, api_key: str) -> dict[str, str]: ...

    @abstractmethod
    def build_body(self, request: PassRequest) -> dict[str, Any]: ...

    @abstractmethod
    def new_decoder(self) -> StreamDecoder: ...

    def query(self) -> dict[str, str]:
        return dict(self.config.query_params)

    def request_body(self, request: PassRequest) -> dict[str, Any]:
        """The adapter's body with `extra_body` merged over it (null values remove keys)."""
        body = self.build_body(request)
        for key, value in self.config.extra_body.items():
            if value is None:
                body.pop(key, None)
            else:
                body[key] = value
        return body

    @property
    def prefill_mode(self) -> PrefillMode:
        return self.config.prefill_mode

    def allowed_tools(self, tools: list[ToolSpec]) -> list[ToolSpec]:
        """The request's tools less those the config turns off (Ollama models that answer
        any tool with HTTP 400)."""
        return [tool for tool in tools if self.config.tool_allowed(tool.name)]

    def headers(self, api_key: str | None = None) -> dict[str, str]:
        """Request headers with `api_key` (by default the first configured key)."""
        headers = {"Accept": "text/event-stream", **self.config.extra_headers}
        keys = self.config.keys()
        key = api_key if api_key is not None else (keys[0] if keys else "")
        if key and self.config.api_key_header:
            headers[self.config.api_key_header] = key
        elif key:
            headers.update(self.auth_headers(key))
        return headers

    async def stream(
        self, request: PassRequest, abort: AbortSignal
    ) -> AsyncIterator[ProviderEvent]:
        if abort.fired:
            return
        body = self.request_body(request)
        keys = self.config.keys()
        clock = asyncio.get_running_loop().time
        order: list[int | None] = list(self._keys.order(clock())) or [None]
        filters: list[StreamFilter] = [SurrogatePairs(), LeadingBlank()]
        if self.config.reads_think_tags:
            filters.insert(1, ThinkTags())
        if request.prefill and self.prefill_mode == PREFILL_NATIVE:
            filters.insert(0, EchoStrip(request.prefill))
        for attempt, index in enumerate(order):
            key = keys[index] if index is not None else None
            next_key = order[attempt + 1] if attempt + 1 < len(order) else None
            output = False
            rotate = False
            refused: ProviderError | None = None
            async with contextlib.aclosing(self._exchange(body, abort, key)) as events:
                async for event in events:
                    if abort.fired:
                        return
                    if isinstance(event, ProviderError):
                        event = self._scrubbed(event)
                        if index is not None and next_key is not None and not output \
                                and rotates(event):
                            self._keys.failed(index, event, clock())
                            logger.warning("%s: key #%d refused (%s %s); trying key #%d",
                                           self.name, index, event.status, event.type,
                                           next_key)
                            rotate = True
                            break
                        if rotates(event):
                            refused = event
                        if len(keys) > 1 and index is not None:
                            event = dataclasses.replace(
                                event, message=f"{event.message} (key #{index})"
                            )
                        logger.warning(
                            "%s: %s (%s): %s", self.name, event.kind, event.type, event.message
                        )
                    elif isinstance(event, TextDelta | ToolCallRequest | ReasoningDelta):
                        output = True
                    for out in run_filters(filters, event):
                        yield out
            if not rotate:
                if index is not None and refused is not None:
                    self._keys.failed(index, refused, clock())
                elif index is not None:
                    self._keys.worked(index)
                break
        if not abort.fired:
            for out in finish_filters(filters):
                yield out

    async def _exchange(
        self, body: dict[str, Any], abort: AbortSignal, api_key: str | None = None
    ) -> AsyncGenerator[ProviderEvent, None]:
        opening = asyncio.ensure_future(self._open(body, api_key))

        def cancel_opening() -> None:
            opening.cancel()

        abort.add_callback(cancel_opening)
        try:
            response = await opening
        except asyncio.CancelledError:
            if abort.fired and not _current_task_cancelled():
                return
            raise
        except (aiohttp.ClientError, TimeoutError) as exc:
            yield _connection_error(exc, self.config.endpoint_base)
            return
        finally:
            abort.remove_callback(cancel_opening)

        abort.add_callback(response.close)
        try:
            if abort.fired:
                return
            self._on_bytes()
            if 300 <= response.status < 400:
                yield redirect_error(response.status, response.headers.get("Location"),
                                     response.url)
                return
            if response.status >= 300 or response.content_type == "application/json":
                error = await self._non_stream_response(response)
                if not abort.fired:
                    yield error
                return
            async with contextlib.aclosing(self._read(response, abort)) as events:
                async for event in events:
                    yield event
        finally:
            abort.remove_callback(response.close)
            if response.content.at_eof():
                response.release()
            else:
                response.close()

    async def _open(
        self, body: dict[str, Any], api_key: str | None = None
    ) -> aiohttp.ClientResponse:
        """POST the body; tool results may hold values JSON lacks (dates), sent as strings.

        Redirects are never followed: aiohttp would forward key headers other than
        `Authorization` to the new host, and on 307/308 the whole prompt too.

        A server may close an idle keep-alive connection just as the next request is written
        into it (RFC 9112 §9.6; llama.cpp's server does, P8): a request the server dropped
        before answering anything is sent once more, on a fresh connection."""
        data = json.dumps(body, ensure_ascii=False, default=str).encode()
        headers = {"Content-Type": "application/json", **self.headers(api_key)}
        try:
            return await self._post(data, headers)
        except _DROPPED_UNANSWERED as exc:
            if isinstance(exc, aiohttp.ClientConnectorError):
                raise  # no connection at all: nothing stale to replace
            return await self._post(data, headers)

    async def _post(self, data: bytes, headers: dict[str, str]) -> aiohttp.ClientResponse:
        return await self._session.post(
            self.endpoint(),
            data=data,
            headers=headers,
            params=self.query() or None,
            timeout=self._timeout,
            allow_redirects=False,
            raise_for_status=False,
        )

    async def _non_stream_response(self, response: aiohttp.ClientResponse) -> ProviderError:
        """An error status, or a JSON body where a stream was expected (proxies do this)."""
        raw = bytearray()
        try:
            async for chunk in response.content.iter_any():
                raw.extend(chunk)
                if len(raw) >= _ERROR_BODY_LIMIT:
                    break
        except (aiohttp.ClientError, TimeoutError):
            pass  # whatever arrived is still the best description of the failure
        text = raw[:_ERROR_BODY_LIMIT].decode("utf-8", errors="replace")
        try:
            details = error_details(json.loads(text))
        except json.JSONDecodeError:
            details = None
        if response.status >= 300:
            return http_error(
                response.status, details, response.headers, text or response.reason or ""
            )
        if details is not None:
            return stream_error(details)
        return ProviderError(
            kind="provider_stream_error",
            type="not_a_stream",
            message="expected text/event-stream, got an application/json body",
        )

    async def _read(
        self, response: aiohttp.ClientResponse, abort: AbortSignal
    ) -> AsyncGenerator[ProviderEvent, None]:
        parser = SSEParser()
        decoder = self.new_decoder()
        try:
            async for chunk in response.content.iter_any():
                self._on_bytes()
                for event in _decode(parser.feed(chunk), decoder):
                    yield event
                    if isinstance(event, ProviderError):
                        return
                if decoder.done or abort.fired:
                    break
            else:
                for event in _decode(parser.close(), decoder):
                    yield event
                    if isinstance(event, ProviderError):
                        return
        except (aiohttp.ClientError, TimeoutError) as exc:
            if not abort.fired:
                yield _midstream_error(exc)
            return
        if abort.fired:
            return
        for event in decoder.finish():
            yield event

    def _scrubbed(self, error: ProviderError) -> ProviderError:
        secrets = self.config.secrets()
        return dataclasses.replace(
            error,
            message=cut_message(error.message, MESSAGE_LIMIT, secrets),
            type=None if error.type is None else cut_message(error.type, _TYPE_LIMIT, secrets),
        )


def _decode(items: Iterable[SSEItem], decoder: StreamDecoder) -> Iterator[ProviderEvent]:
    """Comments and events with empty data are heartbeats (gateways send `data:` lines with
    nothing after them); only events with data reach the decoder."""
    for item in items:
        if isinstance(item, SSEComment):
            yield KeepAlive(item.text)
        elif not item.data.strip() and item.event != "error":
            yield KeepAlive("empty event")
        elif not decoder.done:
            yield from decoder.feed(item)


_DROPPED_UNANSWERED = (
    aiohttp.ServerDisconnectedError,  # closed as the request arrived
    aiohttp.ClientConnectionResetError,  # closed before the headers were written
    aiohttp.ClientOSError,  # "Can not write request body": closed under the body
)
"""How a closing keep-alive connection fails a request before any answer (P8)."""


def _current_task_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _connection_error(exc: BaseException, where: str) -> ProviderError:
    if isinstance(exc, aiohttp.SocketTimeoutError):
        return _read_timeout()
    type_ = "connect_timeout" if isinstance(exc, TimeoutError) else "connection_error"
    return ProviderError(
        kind="http",
        type=type_,
        message=f"request to {where} failed: {_describe(exc)}",
        retryable=True,
    )


def _midstream_error(exc: BaseException) -> ProviderError:
    if isinstance(exc, aiohttp.SocketTimeoutError):
        return _read_timeout()
    return ProviderError(
        kind="provider_stream_error",
        type="connection_error",
        message=f"connection lost mid-stream: {_describe(exc)}",
        retryable=True,
    )


def _read_timeout() -> ProviderError:
    return ProviderError(
        kind="stall_timeout",
        type="read_timeout",
        message="no bytes received within the read timeout",
        retryable=True,
    )
