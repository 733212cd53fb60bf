"""Whether a benchmark's samples meet its goal — or cannot say (D54).

A goal is judged on the median of its samples (one per repeat, each a side-by-side ratio or
difference), and only where the samples can carry the verdict:

- a median past what is physically possible (an engine cheaper than the bare client it
  wraps: negative overhead, a ratio under 1) is *impossible*: the samples were too short or
  too noisy to resolve the figure, and it is flagged, never met;
- a spread (lowest to highest sample) that reaches across the goal is *unresolved*: some
  repeats meet it and some do not, so neither "met" nor "missed" is true;
- otherwise the median is compared with the goal.

Every judged figure carries its spread and sample count, so the report shows them.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Verdict:
    value: float
    """The median of the samples."""
    low: float
    high: float
    samples: int
    met: bool | None
    """None when the samples cannot carry a verdict (see `flag`)."""
    flag: str = ""
    """Why there is no verdict: "impossible: …" or "unresolved: …"; empty when judged."""


def judge(samples: Sequence[float], *, at_most: float | None = None,
          at_least: float | None = None, floor: float | None = None) -> Verdict:
    """The verdict on `samples` against `at_most` or `at_least` (exactly one), where a value
    under `floor` cannot happen (0 for an overhead, 1 for a ratio to the work it wraps)."""
    if (at_most is None) == (at_least is None):
        raise ValueError("give exactly one of at_most and at_least")
    if not samples:
        raise ValueError("no samples to judge")
    value = float(statistics.median(samples))
    low, high = float(min(samples)), float(max(samples))
    n = len(samples)
    if floor is not None and value < floor:
        return Verdict(value, low, high, n, None,
                       f"impossible: below {floor:g}, which the measured work cannot be; "
                       "the samples are too short or too noisy to resolve it")
    goal = at_most if at_most is not None else at_least
    assert goal is not None
    if low <= goal <= high and low != high:
        return Verdict(value, low, high, n, None,
                       f"unresolved: the samples range {low:.3g}–{high:.3g}, across the goal "
                       f"{goal:g}")
    met = value <= goal if at_most is not None else value >= goal
    return Verdict(value, low, high, n, met)
