"""Configuration mistakes as the lines an operator reads: each names where the value was
written — the variable (`TURN_ENGINE__IDLE_TIMEOUT_S`, from the environment or `.env`) or the
file, section and key (`turn.toml: [engine] idle_timeout_s`) — and what was expected, and
none repeats a value (values may be secrets).

pydantic reports a field by its path in the settings, which does not say where the operator
wrote it; `Sources` knows what each source holds, and so which one a path came from, in the
order the settings read them (environment, then `.env`, then the file).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from .setting_names import (
    PREFIX,
    annotation_at,
    env_name,
    is_mapping,
    model_at,
    needs_json,
    suggestion,
)

SettingPath = tuple[str | int, ...]
_PROVIDER = '{"kind": "openai", "model": "…", "base_url": "…"}'
_EXAMPLES = {"provider": _PROVIDER, "fallbacks": f"[{_PROVIDER}]"}
JSON_TYPES = {dict: "an object", list: "a list", str: "a string", int: "a number",
              float: "a number", bool: "true or false", type(None): "null"}


@dataclass
class Sources:
    """What the environment, `.env` and the configuration file hold."""

    environ: Mapping[str, str]
    dotenv: Mapping[str, str | None]
    file: Path | None = None
    data: Mapping[str, Any] = field(default_factory=dict)

    def variables(self) -> dict[str, str]:
        """Every `TURN_*` variable set, by its upper-case name, the environment winning."""
        found: dict[str, str] = {}
        for source in (self.dotenv, self.environ):
            for name, value in source.items():
                if name.upper().startswith(PREFIX) and value is not None:
                    found[name.upper()] = value
        return found

    def variable_for(self, path: SettingPath) -> str | None:
        """The variable that holds `path`: its own (`TURN_ENGINE__IDLE_TIMEOUT_S`) or the JSON
        of an enclosing one (`TURN_PROVIDER` for `provider.base_url`), if one does."""
        variables = self.variables()
        leading = _leading_names(path)
        for depth in range(len(leading), 0, -1):
            name = env_name(leading[:depth])
            if name not in variables:
                continue
            if depth == len(path) or _holds(_json(variables[name]), path[depth:]):
                return name
        return None

    def where(self, path: SettingPath) -> str:
        """How a problem line names `path`: the variable, else the file's section and key."""
        variable = self.variable_for(path)
        dotted = ".".join(str(p) for p in path) or "settings"
        if variable is None and self.in_file(path):
            return f"{self.file}: {file_location(path)}"
        leading = _leading_names(path)
        named = variable or (env_name(leading) if leading else PREFIX)
        return f"{dotted} ({named})"

    def in_file(self, path: SettingPath) -> bool:
        return self.file is not None and bool(path) and path[0] in self.data and \
            _holds(self.data, path)


def file_location(path: SettingPath) -> str:
    """`[engine] idle_timeout_s`, `[[fallbacks]] #2 model`, `queue_limit` (a top-level key)."""
    if len(path) == 1:
        return str(path[0])
    section, rest = str(path[0]), list(path[1:])
    if rest and isinstance(rest[0], int):
        head = f"[[{section}]] #{int(rest.pop(0)) + 1}"
    else:
        head = f"[{section}]"
    return f"{head} {'.'.join(str(p) for p in rest)}".rstrip()


def json_problems(model: type[BaseModel], sources: Sources) -> tuple[list[str], set[str]]:
    """A line for each variable that must hold JSON and does not parse, and their names (so
    the settings are read without them and every other problem is still reported)."""
    lines: list[str] = []
    names: set[str] = set()
    for name, value in sorted(sources.variables().items()):
        path = name.removeprefix(PREFIX).lower().split("__")
        shape = needs_json(annotation_at(model, path))
        if shape is None:
            continue
        try:
            json.loads(value)
        except ValueError as exc:
            where = getattr(exc, "pos", None)
            at = f" at character {where + 1}" if isinstance(where, int) else ""
            example = _EXAMPLES.get(path[0], '["…", "…"]' if shape == "list" else '{"…": …}')
            lines.append(f"{'.'.join(path)} ({name}): not valid JSON{at}; expected a JSON "
                         f"{shape} such as {example} (see .env.example)")
            names.add(name)
    return lines, names


def unknown_key_lines(found: Iterable[tuple[SettingPath, str]], file: Path) -> list[str]:
    return [f"{file}: {file_location(path)}: not a setting{hint}" for path, hint in found]


def validation_lines(model: type[BaseModel], errors: Iterable[Any],
                     sources: Sources) -> list[str]:
    """One line per setting pydantic refused, naming where the value was written; the
    alternatives of a union (`bool | list[str]`) are one line."""
    messages: dict[SettingPath, list[str]] = {}
    for error in errors:
        loc = _setting_path(model, error["loc"])
        path: SettingPath = (*loc, *(error.get("ctx") or {}).get("at", ()))
        message = _message(model, error, path, sources)
        if message not in messages.setdefault(path, []):
            messages[path].append(message)
    return [f"{sources.where(path)}: {', or '.join(found)}" for path, found in messages.items()]


def _setting_path(model: type[BaseModel], loc: Iterable[str | int]) -> SettingPath:
    """`loc` without the names pydantic gives a union's alternatives (`tools.bool`,
    `tools.list[str]`): the parts past a field that is no model, list or map."""
    path: list[str | int] = []
    holder: type[BaseModel] | None = model
    open_keys = False
    for part in loc:
        if isinstance(part, int) or open_keys:
            path.append(part)
            continue
        if holder is None:
            break  # a union alternative's name: the setting is the path so far
        path.append(part)
        annotation = holder.model_fields[part].annotation if part in holder.model_fields \
            else None
        holder = model_at(model, path)
        open_keys = holder is None and is_mapping(annotation)
    return tuple(path)


def _message(model: type[BaseModel], error: Any, path: SettingPath, sources: Sources) -> str:
    kind = error["type"]
    if kind == "extra_forbidden" and path:
        return f"not a setting{suggestion(str(path[-1]), model_at(model, path[:-1]))}"
    if kind in ("model_type", "dict_type", "list_type"):
        wanted = "list" if kind == "list_type" else "object"
        from_file = sources.variable_for(path) is None and sources.in_file(path)
        expected = ("an array" if wanted == "list" else "a table") if from_file \
            else f"a JSON {wanted}"
        got = JSON_TYPES.get(type(error.get("input")), "something else")
        return f"expected {expected}, got {got}"
    return " ".join(str(error["msg"]).split())


def _leading_names(path: SettingPath) -> list[str]:
    leading: list[str] = []
    for part in path:
        if not isinstance(part, str):
            break
        leading.append(part)
    return leading


def _json(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return None


def _holds(data: Any, path: SettingPath) -> bool:
    """Whether `data` holds `path`, or at least the table or object it belongs in (a missing
    required key is reported where its table was written)."""
    if not path:
        return data is not None
    current = data
    for depth, part in enumerate(path):
        in_table = isinstance(current, Mapping) and part in current
        in_array = isinstance(current, list) and isinstance(part, int) and part < len(current)
        if in_table or in_array:
            current = current[part]
        else:
            return depth == len(path) - 1 and isinstance(current, Mapping)
    return True
