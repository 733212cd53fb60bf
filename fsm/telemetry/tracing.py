"""OpenTelemetry traces of turns: one span per turn, a child span per state visited, per
provider call and per tool call, with OpenTelemetry's GenAI semantic-convention attributes
where they apply (`gen_ai.request.model`, `gen_ai.usage.input_tokens`, …).

Span times follow the engine's clock, not the wall clock read when a span is written: a turn's
start is anchored to the wall clock once, and every later time is that anchor plus the
engine's seconds-from-start, so durations are what the engine measured (virtual time in the
tests). The tree of a turn (the attempts of a fallback chain, G1, are children of one
`generation` span with `turn.attempts` and the chain's `turn.status`; a turn no fallback can
follow is a root of its own):

    turn <turn id>                         (gen_ai.operation.name invoke_agent)
    ├── state Preparing
    ├── chat <model>                       (gen_ai.operation.name chat; usage, finish reason)
    │   ├── state AwaitingFirstToken
    │   └── state Streaming
    ├── state ToolCall
    │   └── execute_tool <tool>            (gen_ai.operation.name execute_tool)
    └── state ContextRestart
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from .follow import PASS_STATES, PassFacts, StateVisit, TurnEnd, provider_and_model

if TYPE_CHECKING:
    from ..engine.turn import Turn

INSTRUMENTATION = "turn-engine"
_NS = 1_000_000_000


@dataclass(slots=True)
class _Traced:
    anchor_ns: int
    span: Span
    pass_span: Span | None = None

    def at(self, t: float) -> int:
        return self.anchor_ns + round(t * _NS)


@dataclass(slots=True)
class _Generation:
    """The attempts of one fallback chain: they share the channel's lock."""

    span: Span
    end_ns: int
    attempts: int = 0


class TurnTracer:
    """A TurnListener that writes each turn's spans through an OpenTelemetry tracer."""

    def __init__(self, tracer: Tracer | None = None) -> None:
        self.tracer = tracer if tracer is not None else trace.get_tracer(INSTRUMENTATION)
        self._turns: dict[int, _Traced] = {}
        self._generations: dict[int, _Generation] = {}

    def _generation_of(self, turn: Turn, anchor: int) -> _Generation | None:
        """The chain `turn` is an attempt of: begun by an attempt a fallback may follow
        (`fallback_pending`), joined by the later attempts under the same lock, ended by the
        last attempt or when the lock is released (an attempt that needed no fallback)."""
        lock = turn.lock
        key = id(lock)
        generation = self._generations.get(key)
        if generation is None and turn.config.fallback_pending and not lock.released:
            span = self.tracer.start_span("generation", kind=SpanKind.INTERNAL,
                                          start_time=anchor,
                                          attributes={"turn.channel_id": lock.channel_id})
            generation = self._generations[key] = _Generation(span, anchor)
            lock.listeners.append(lambda _lock: self._end_generation(key))
        if generation is not None:
            generation.attempts += 1
        return generation

    def _end_generation(self, key: int) -> None:
        generation = self._generations.pop(key, None)
        if generation is not None:
            generation.span.set_attribute("turn.attempts", generation.attempts)
            generation.span.end(end_time=generation.end_ns)

    def turn_started(self, turn: Turn) -> None:
        anchor = time.time_ns() - round(turn.elapsed * _NS)
        provider, model = provider_and_model(turn.provider.name)
        attributes: dict[str, str] = {"gen_ai.operation.name": "invoke_agent",
                                      "gen_ai.provider.name": provider,
                                      "turn.id": turn.turn_id,
                                      "turn.channel_id": turn.lock.channel_id}
        if model is not None:
            attributes["gen_ai.request.model"] = model
        generation = self._generation_of(turn, anchor)
        context = trace.set_span_in_context(generation.span) if generation else None
        span = self.tracer.start_span(f"turn {turn.turn_id}", kind=SpanKind.INTERNAL,
                                      context=context, start_time=anchor, attributes=attributes)
        if span.is_recording():  # a turn not sampled writes nothing more (its spans are no-ops)
            self._turns[id(turn)] = _Traced(anchor, span)

    def state_left(self, turn: Turn, visit: StateVisit) -> None:
        traced = self._turns.get(id(turn))
        if traced is None:
            return
        parent = traced.pass_span if visit.state in PASS_STATES and traced.pass_span \
            else traced.span
        span = self.tracer.start_span(
            f"state {visit.state}", context=trace.set_span_in_context(parent),
            start_time=traced.at(visit.entered),
            attributes={"turn.state": visit.state, "turn.left_by": visit.left_by})
        for call in visit.tool_calls:
            attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": call.name,
                          "turn.tool.outcome": call.outcome}
            if call.call_id:
                attributes["gen_ai.tool.call.id"] = call.call_id
            child = self.tracer.start_span(f"execute_tool {call.name}",
                                           context=trace.set_span_in_context(span),
                                           start_time=traced.at(call.start),
                                           attributes=attributes)
            if call.outcome not in ("ok", "restart"):
                child.set_attribute("error.type", call.outcome)
                child.set_status(Status(StatusCode.ERROR, call.error or call.outcome))
            child.end(end_time=traced.at(call.end))
        span.end(end_time=traced.at(visit.left))

    def pass_started(self, turn: Turn, index: int, at: float) -> None:
        traced = self._turns.get(id(turn))
        if traced is None:
            return
        provider, model = provider_and_model(turn.provider.name)
        attributes: dict[str, str | int] = {"gen_ai.operation.name": "chat",
                                            "gen_ai.provider.name": provider,
                                            "turn.pass": index}
        if model is not None:
            attributes["gen_ai.request.model"] = model
        traced.pass_span = self.tracer.start_span(
            f"chat {model or provider}", kind=SpanKind.CLIENT,
            context=trace.set_span_in_context(traced.span), start_time=traced.at(at),
            attributes=attributes)

    def pass_ended(self, turn: Turn, facts: PassFacts) -> None:
        traced = self._turns.get(id(turn))
        if traced is None or traced.pass_span is None:
            return
        span, traced.pass_span = traced.pass_span, None
        span.set_attribute("turn.pass.ended_by", facts.ended_by)
        result = facts.result
        if result is not None:
            span.set_attribute("turn.pass.status", result.status)
            if result.finish_reason:
                span.set_attribute("gen_ai.response.finish_reasons", [result.finish_reason])
            usage = result.usage or {}
            for key in ("input_tokens", "output_tokens"):
                if key in usage:
                    span.set_attribute(f"gen_ai.usage.{key}", usage[key])
            if result.error:
                kind = str(result.error.get("kind") or "provider_error")
                span.set_attribute("error.type", kind)
                span.set_status(Status(StatusCode.ERROR, str(result.error.get("message") or kind)))
        span.end(end_time=traced.at(facts.end))

    def timed_out(self, turn: Turn, phase: str, at: float) -> None:
        traced = self._turns.get(id(turn))
        if traced is not None:
            target = traced.pass_span if phase in ("first_token", "idle", "settle") \
                and traced.pass_span is not None else traced.span
            target.add_event("timeout", {"turn.timeout.phase": phase}, timestamp=traced.at(at))

    def turn_ended(self, turn: Turn, end: TurnEnd) -> None:
        traced = self._turns.pop(id(turn), None)
        if traced is None:
            return
        span = traced.span
        span.set_attribute("turn.terminal_state", end.state)
        span.set_attribute("turn.status", end.status)
        span.set_attribute("turn.passes", end.passes)
        if end.kill_latency is not None:
            span.set_attribute("turn.kill_latency_s", end.kill_latency)
        if end.status == "error":
            span.set_attribute("error.type", end.ended_by)
            span.set_status(Status(StatusCode.ERROR, end.error or "turn ended in error"))
        span.end(end_time=traced.at(end.at))
        generation = self._generations.get(id(turn.lock))
        if generation is not None:
            generation.end_ns = traced.at(end.at)
            generation.span.set_attribute("turn.status", end.status)
            if not turn.config.fallback_pending:
                self._end_generation(id(turn.lock))
