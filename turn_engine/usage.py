"""Token usage: what each reply cost, from the providers' reported usage, counted per user,
channel, server and model per UTC day; what /usage shows; the daily quota's notice.

Every attempt of a reply counts (a failed primary's tokens were spent too), under the model
label of that attempt. A pass without reported usage adds nothing: the counts are what the
providers said, never an estimate.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from fsm import GenerationResult

from .operator_settings import ModelPrice
from .settings_store import UsageRow

TOP = 10


@dataclass(frozen=True, slots=True)
class Tokens:
    input: int = 0
    output: int = 0

    def __add__(self, other: Tokens) -> Tokens:
        return Tokens(self.input + other.input, self.output + other.output)

    @property
    def total(self) -> int:
        return self.input + self.output


def tokens_by_model(result: GenerationResult) -> dict[str, Tokens]:
    """The reported tokens of a reply, per attempt label; labels with none reported left out."""
    found: dict[str, Tokens] = {}
    for label, attempt in zip(result.labels, result.attempts, strict=False):
        spent = Tokens()
        reported = False
        for one_pass in attempt.passes:
            usage = one_pass.usage or {}
            inp, out = usage.get("input_tokens"), usage.get("output_tokens")
            if isinstance(inp, int) or isinstance(out, int):
                reported = True
                spent = spent + Tokens(inp if isinstance(inp, int) else 0,
                                       out if isinstance(out, int) else 0)
        if reported:
            found[label] = found.get(label, Tokens()) + spent
    return found


def price_of(model: str, prices: Mapping[str, ModelPrice]) -> ModelPrice | None:
    """A model's price by its label (`openai:gpt-4o-mini`) or its bare model name."""
    return prices.get(model) or prices.get(model.partition(":")[2])


def cost(model: str, tokens: Tokens, prices: Mapping[str, ModelPrice]) -> float | None:
    price = price_of(model, prices)
    if price is None:
        return None
    return (tokens.input * price.input + tokens.output * price.output) / 1_000_000


def usage_report(rows: Iterable[UsageRow], prices: Mapping[str, ModelPrice], currency: str,
                 *, day: str, where: str) -> str:
    """The text of /usage: totals, then the top users, channels and models."""
    rows = list(rows)
    if not rows:
        return f"No usage recorded {where} on {day} (UTC)."
    by_user: dict[str, Tokens] = defaultdict(Tokens)
    by_channel: dict[str, Tokens] = defaultdict(Tokens)
    by_model: dict[str, Tokens] = defaultdict(Tokens)
    replies = 0
    for row in rows:
        spent = Tokens(row.input_tokens, row.output_tokens)
        by_user[row.user_id] += spent
        by_channel[row.channel_id] += spent
        by_model[row.model] += spent
        replies += row.replies
    total = sum(by_model.values(), Tokens())
    costs = {model: cost(model, t, prices) for model, t in by_model.items()}
    priced = [c for c in costs.values() if c is not None]
    head = (f"**Usage {where} on {day} (UTC)**: {replies} repl{'y' if replies == 1 else 'ies'}, "
            f"{total.input:,} tokens in, {total.output:,} out")
    if priced:
        unpriced = " (some models have no price)" if len(priced) < len(costs) else ""
        head += f", {sum(priced):.4f} {currency}{unpriced}"
    lines = [head + "."]
    lines.append("Users: " + _top(by_user, lambda key: f"<@{key}>"))
    lines.append("Channels: " + _top(by_channel, lambda key: f"<#{key}>"))
    lines.append("Models: " + ", ".join(
        f"{model} {t.input:,}/{t.output:,}" + (f" ({costs[model]:.4f} {currency})"
                                               if costs[model] is not None else "")
        for model, t in sorted(by_model.items(), key=lambda kv: -kv[1].total)))
    return "\n".join(lines)


def _top(counts: Mapping[str, Tokens], show: Callable[[str], str]) -> str:
    ranked = sorted(counts.items(), key=lambda kv: -kv[1].total)
    text = ", ".join(f"{show(key)} {t.total:,}" for key, t in ranked[:TOP])
    if len(ranked) > TOP:
        text += f", and {len(ranked) - TOP} more"
    return text


def quota_notice(limit: int) -> str:
    """The one polite notice a user gets the first time in a day they are over the quota."""
    return (f"You have used today's {limit:,} tokens with me — thank you for all the "
            "conversation! I can answer you again after midnight UTC.")
