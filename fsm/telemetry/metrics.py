"""Prometheus metrics of turns, and the HTTP endpoint a Prometheus server scrapes.

Everything is counted from the engine's observer hook (`fsm.telemetry.follow`), in a registry
of its own (not prometheus-client's global one, so two bots in one process, or two tests,
count apart). Names, all prefixed `turn_engine_`:

- `turns_total{terminal_state,status}` — turns ended;
- `turn_duration_seconds{terminal_state}` — how long they ran (engine clock);
- `timeouts_total{phase}` — timers that fired: `first_token`, `idle`, `settle`, `tool` (a
  stall that never settles counts its stream phase and then `settle`);
- `kill_latency_seconds` — from the stop request (`/kill`) to the turn in Stopped;
- `tool_calls_total{tool,outcome}` and `tool_errors_total{tool,outcome}` — every call, and
  those that failed, timed out, were killed or crashed;
- `provider_calls_total{model,ended_by}`, `tokens_total{model,type}` — passes and the tokens
  the provider reported (`type` input or output);
- `active_turns` — turns between their first transition and their terminal state;
- `queue_depth` — messages waiting in channel queues, read from a callable the bot hands
  over (`TurnMetrics.track_queue_depth`), or set directly.

Every label value comes from a closed set (V1): states, statuses, timer phases, tool
outcomes and table triggers are the engine's own names, a tool is one registered with the
turn's registry, and anything else is `unknown`; the model label (the operator's providers)
is kept to the first `MAX_MODELS` seen. Each value is cut to `MAX_LABEL_CHARS`. A model that
invents tool names, or a name of 100,000 characters, adds no series. The endpoint answers
behind the same guard as the review page (`fsm.local_http`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING, get_args

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

from ..engine.result import TurnStatus
from ..engine.table import STATES, TABLE
from ..local_http import HostPolicy, local_guard
from .follow import (
    TIMEOUT_PHASE_BY_EVENT,
    PassFacts,
    StateVisit,
    ToolOutcome,
    TurnEnd,
    provider_and_model,
)

if TYPE_CHECKING:
    from ..engine.turn import Turn

NAMESPACE = "turn_engine"
KILL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
DURATION_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
UNKNOWN = "unknown"
MAX_LABEL_CHARS = 64
MAX_MODELS = 32
STATE_NAMES = frozenset(s.value for s in STATES)
STATUSES = frozenset(get_args(TurnStatus))
PHASES = frozenset(TIMEOUT_PHASE_BY_EVENT.values())
TOOL_OUTCOMES = frozenset(get_args(ToolOutcome))
TRIGGERS = frozenset(edge.trigger for edge in TABLE)
TOKEN_TYPES = frozenset({"input", "output"})


def closed(value: object, allowed: Collection[str]) -> str:
    """`value` when it is one of `allowed`, else `unknown`; never longer than
    `MAX_LABEL_CHARS` (V1)."""
    return value[:MAX_LABEL_CHARS] if isinstance(value, str) and value in allowed else UNKNOWN


class _FirstSeen:
    """A label fed by configuration rather than by the engine (the model names): the first
    `limit` values seen stay themselves, later ones are `unknown`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.seen: set[str] = set()

    def __call__(self, value: str) -> str:
        value = value[:MAX_LABEL_CHARS]
        if value not in self.seen and len(self.seen) < self.limit:
            self.seen.add(value)
        return value if value in self.seen else UNKNOWN


def _tool_names(turn: Turn) -> frozenset[str]:
    tools = getattr(turn, "tools", None)
    names: Iterable[str] = tools.names() if tools is not None else ()
    return frozenset(names)


class TurnMetrics:
    """A TurnListener that counts turns into its own Prometheus registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.turns = Counter("turns", "Turns ended, by terminal state and status",
                             ["terminal_state", "status"], namespace=NAMESPACE, registry=r)
        self.turn_duration = Histogram("turn_duration_seconds", "How long turns ran",
                                       ["terminal_state"], namespace=NAMESPACE, registry=r,
                                       buckets=DURATION_BUCKETS)
        self.timeouts = Counter("timeouts", "Timers that fired, by phase", ["phase"],
                                namespace=NAMESPACE, registry=r)
        self.kill_latency = Histogram("kill_latency_seconds",
                                      "From the stop request to the turn in Stopped",
                                      namespace=NAMESPACE, registry=r, buckets=KILL_BUCKETS)
        self.tool_calls = Counter("tool_calls", "Tool calls, by tool and outcome",
                                  ["tool", "outcome"], namespace=NAMESPACE, registry=r)
        self.tool_errors = Counter("tool_errors", "Tool calls that did not succeed",
                                   ["tool", "outcome"], namespace=NAMESPACE, registry=r)
        self.provider_calls = Counter("provider_calls", "Provider passes, by how they ended",
                                      ["model", "ended_by"], namespace=NAMESPACE, registry=r)
        self.tokens = Counter("tokens", "Tokens the provider reported", ["model", "type"],
                              namespace=NAMESPACE, registry=r)
        self.active_turns = Gauge("active_turns", "Turns running now", namespace=NAMESPACE,
                                  registry=r)
        self.queue_depth = Gauge("queue_depth", "Messages waiting in channel queues",
                                 namespace=NAMESPACE, registry=r)
        self._model = _FirstSeen(MAX_MODELS)

    def track_queue_depth(self, depth: Callable[[], float]) -> None:
        """Read the queue depth from `depth` at every scrape (the bot's channel queue)."""
        self.queue_depth.set_function(depth)

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format, as the endpoint serves it."""
        return bytes(generate_latest(self.registry))

    # ------------------------------------------------------------- TurnListener

    def turn_started(self, turn: Turn) -> None:
        self.active_turns.inc()

    def state_left(self, turn: Turn, visit: StateVisit) -> None:
        if not visit.tool_calls:
            return
        registered = _tool_names(turn)
        for call in visit.tool_calls:
            tool, outcome = closed(call.name, registered), closed(call.outcome, TOOL_OUTCOMES)
            self.tool_calls.labels(tool, outcome).inc()
            if call.outcome not in ("ok", "restart"):
                self.tool_errors.labels(tool, outcome).inc()

    def pass_started(self, turn: Turn, index: int, at: float) -> None:
        return None

    def pass_ended(self, turn: Turn, facts: PassFacts) -> None:
        provider, model = provider_and_model(turn.provider.name)
        label = self._model(model or provider)
        self.provider_calls.labels(label, closed(facts.ended_by, TRIGGERS)).inc()
        usage = facts.result.usage if facts.result is not None else None
        for key, kind in (("input_tokens", "input"), ("output_tokens", "output")):
            count = usage.get(key) if usage else None
            if isinstance(count, int) and count > 0:
                self.tokens.labels(label, closed(kind, TOKEN_TYPES)).inc(count)

    def timed_out(self, turn: Turn, phase: str, at: float) -> None:
        self.timeouts.labels(closed(phase, PHASES)).inc()

    def turn_ended(self, turn: Turn, end: TurnEnd) -> None:
        self.active_turns.dec()
        state = closed(end.state, STATE_NAMES)
        self.turns.labels(state, closed(end.status, STATUSES)).inc()
        self.turn_duration.labels(state).observe(end.at)
        if end.kill_latency is not None:
            self.kill_latency.observe(end.kill_latency)


METRICS = web.AppKey("metrics", TurnMetrics)


async def _scrape(request: web.Request) -> web.Response:
    body = request.app[METRICS].exposition()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


class MetricsServer:
    """`GET /metrics` over HTTP on the event loop the bot already runs (aiohttp), answering
    only to a Host this machine is called by (`allowed_hosts`: names besides `localhost` and
    IP addresses, e.g. the service name a Prometheus in the same network scrapes)."""

    def __init__(self, metrics: TurnMetrics, host: str = "127.0.0.1", port: int = 9464,
                 allowed_hosts: Iterable[str] = ()) -> None:
        self.metrics = metrics
        self.host = host
        self.port = port
        self.policy = HostPolicy.for_bind(host, allowed_hosts)
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        """Listen; returns the scrape URL (with the real port when `port` was 0)."""
        app = web.Application(middlewares=[local_guard(self.policy,
                                                       what="metrics endpoint")])
        app[METRICS] = self.metrics
        app.router.add_get("/metrics", _scrape)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        await site.start()
        self._runner = runner
        if runner.addresses:
            self.port = int(runner.addresses[0][1])
        shown = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{shown}:{self.port}/metrics"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
