"""The run's figures as Markdown: a summary table, then each section's details."""

from __future__ import annotations

from typing import Any

from .common import Figure, Section, fmt
from .full_bot import floor_areas
from .full_bot import table as full_bot_table
from .growth import table as growth_table
from .profiling import format_profile
from .splitter import table as splitter_table


def _met(fig: Figure) -> str:
    if fig.flag:
        return f"**not judged: {fig.flag.split(':', 1)[0]}**"
    if fig.met is None:
        return ""
    return "met" if fig.met else "**missed**"


def _number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}"


def _note(fig: Figure) -> str:
    """The note, with a judged figure's spread and a flag's reason."""
    parts = [fig.note] if fig.note else []
    if fig.spread is not None:
        low, high = fig.spread
        parts.append(f"spread {_number(low)}–{_number(high)} {fig.unit} over {fig.samples}")
    if fig.flag:
        parts.append(fig.flag)
    return "; ".join(parts)


def figures_table(section: Section) -> list[str]:
    lines = ["| figure | value | goal | met? | note |", "| --- | ---: | --- | --- | --- |"]
    for fig in section.figures:
        lines.append(f"| {fig.name} | {fmt(fig.value, fig.unit)} | {fig.goal or ''} | "
                     f"{_met(fig)} | {_note(fig)} |")
    return lines


def goals(sections: list[Section]) -> list[str]:
    lines = ["| item | goal | value | met? |", "| --- | --- | ---: | --- |"]
    for section in sections:
        item = section.title.split(".", 1)[0]
        for fig in section.figures:
            if fig.goal:
                lines.append(f"| {item} | {fig.name}: {fig.goal} | {fmt(fig.value, fig.unit)} "
                             f"| {_met(fig)} |")
    return lines


def details(section: Section) -> list[str]:
    d: dict[str, Any] = section.details
    lines: list[str] = []
    if section.key == "per_turn" and "variants" in d:
        lines += ["| variant (same rounds, side by side) | turns/s | µs/turn | GC share |",
                  "| --- | ---: | ---: | ---: |"]
        for name, v in d["variants"].items():
            lines.append(f"| {name} | {v['turns_per_s']:,.0f} | {v['us_per_turn']:,.0f} | "
                         f"{v['gc_pct']:.1f} % |")
        lines.append("")
    if "profile" in d:
        unit = "turn" if section.key in ("per_turn", "full_bot") else "chunk"
        lines += [*format_profile(d["profile"], unit), ""]
    if section.key == "concurrency" and "traced" in d:
        lines += ["Where a parked turn's memory is (tracemalloc, by file of allocation):", "",
                  "| file | bytes per turn |", "| --- | ---: |"]
        for row in d["traced"].get("traced_top", []):
            lines.append(f"| `{row['file']}` | {row['b_per_turn']:,.0f} |")
        lines.append("")
        kinds = d["traced"].get("gc_types_per_turn", {})
        if kinds:
            lines += ["GC-tracked objects per parked turn, by type: "
                      + ", ".join(f"{k} {v:.0f}" for k, v in kinds.items()), ""]
    if section.key == "growth":
        lines += [*growth_table(section), ""]
    if section.key == "full_bot":
        lines += [*full_bot_table(section), ""]
        if floor_areas(section):
            lines += [*floor_areas(section), ""]
    if section.key == "splitter":
        lines += [*splitter_table(section), ""]
    return lines


def render(sections: list[Section], info: dict[str, Any], command: str, elapsed_s: float
           ) -> str:
    pk = ", ".join(f"{k} {v}" for k, v in info["packages"].items() if v)
    lines = [f"- Command: `{command}` — {elapsed_s:.0f} s",
             f"- Machine: {info['nproc']} CPUs ({info['cpu']}), {info['memory_gib']} GiB, "
             f"{info['implementation']} {info['python']}, {info['platform']}",
             f"- Packages: {pk}", "", "### Goals", ""]
    lines += goals(sections)
    for section in sections:
        lines += ["", f"### {section.title}", "", *figures_table(section)]
        extra = details(section)
        if extra:
            lines += ["", *extra]
    return "\n".join(lines) + "\n"
