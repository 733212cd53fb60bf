"""The names an operator may write, so a misspelt one is an error with a "did you mean".

pydantic-settings silently ignores a `TURN_*` variable it does not know, which turns a typo
(`TURN_ENGIN__IDLE_TIMEOUT_S`) into a default that was never asked for. The names are derived
from the settings models themselves, so they cannot drift from them.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel

PREFIX = "TURN_"
DELIMITER = "__"
EXTRA_NAMES = frozenset({"TURN_CONFIG_FILE"})
"""Read before the settings themselves (where the configuration file is)."""


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside `annotation` (`Model`, `Model | None`, an `Annotated`
    model), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) is typing.Annotated:
        return _model_of(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _model_of(arg)
            if found is not None:
                return found
    return None


def is_mapping(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(is_mapping(arg) for arg in typing.get_args(annotation))
    return origin in (dict, Mapping) or annotation is dict


def field_paths(model: type[BaseModel]) -> tuple[list[tuple[str, ...]], list[tuple[str, ...]]]:
    """Every field path of `model` (nested models expanded), and the paths of mapping fields
    under which any key is allowed."""
    paths: list[tuple[str, ...]] = []
    open_paths: list[tuple[str, ...]] = []
    for name, info in model.model_fields.items():
        paths.append((name,))
        nested = _model_of(info.annotation)
        if nested is not None:
            sub_paths, sub_open = field_paths(nested)
            paths.extend((name, *p) for p in sub_paths)
            open_paths.extend((name, *p) for p in sub_open)
        elif is_mapping(info.annotation):
            open_paths.append((name,))
    return paths, open_paths


def annotation_at(model: type[BaseModel], path: Iterable[str]) -> Any:
    """The type annotation of the field at `path`, or None when there is no such field."""
    current: type[BaseModel] | None = model
    annotation: Any = None
    for part in path:
        if current is None or part not in current.model_fields:
            return None
        annotation = current.model_fields[part].annotation
        current = _model_of(annotation)
    return annotation


def _item_model_of(annotation: Any) -> type[BaseModel] | None:
    """The model of a list of models (`list[Model]`), if `annotation` is one."""
    if typing.get_origin(annotation) in (list, tuple) and typing.get_args(annotation):
        return _model_of(typing.get_args(annotation)[0])
    return None


def is_json_valued(annotation: Any) -> bool:
    """Whether pydantic-settings reads the variable as JSON (lists, maps, models)."""
    if _model_of(annotation) is not None or is_mapping(annotation):
        return True
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(is_json_valued(arg) for arg in typing.get_args(annotation))
    return origin in (list, tuple, set, frozenset) or annotation in (list, tuple, set)


def needs_json(annotation: Any) -> str | None:
    """"object" or "list" when every value a variable of this type can take is JSON of that
    shape (a model, a map, a list, or one of them or None), else None: `bool | list[str]`
    also takes `yes`, so its variable is not checked as JSON."""
    options = [a for a in typing.get_args(annotation) if a is not type(None)] \
        if typing.get_origin(annotation) in (typing.Union, types.UnionType) else [annotation]
    shapes = {"list" if typing.get_origin(a) in (list, tuple, set, frozenset) else "object"
              for a in options if is_json_valued(a)}
    return shapes.pop() if len(shapes) == 1 and len(options) == 1 else None


def env_name(path: Iterable[str]) -> str:
    return PREFIX + DELIMITER.join(part.upper() for part in path)


def unknown_names(model: type[BaseModel], names: Iterable[str]) -> list[str]:
    """One line per `TURN_*` name in `names` that `model` does not have, with the closest
    known name when there is one."""
    paths, open_paths = field_paths(model)
    known = {env_name(p) for p in paths} | EXTRA_NAMES
    open_prefixes = tuple(env_name(p) + DELIMITER for p in open_paths)
    problems: list[str] = []
    for raw in sorted(set(names)):
        name = raw.upper()
        if not name.startswith(PREFIX) or name in known or name.startswith(open_prefixes):
            continue
        problems.append(f"{raw}: not a setting{_suggestion(name, known)}")
    return problems


Path = tuple[str | int, ...]


def unknown_keys(model: type[BaseModel], data: Mapping[str, Any],
                 at: Path = ()) -> list[tuple[Path, str]]:
    """The keys of a configuration file's tables (and of its arrays of tables) that `model`
    does not have, each with its path and a "did you mean" hint (or "")."""
    found: list[tuple[Path, str]] = []
    fields = model.model_fields
    for key, value in data.items():
        info = fields.get(key)
        if info is None:
            found.append(((*at, key), _suggestion(key, set(fields))))
            continue
        nested = _model_of(info.annotation)
        items = _item_model_of(info.annotation)
        if nested is not None and isinstance(value, Mapping):
            found.extend(unknown_keys(nested, value, (*at, key)))
        elif items is not None and isinstance(value, list):
            for index, item in enumerate(value):
                if isinstance(item, Mapping):
                    found.extend(unknown_keys(items, item, (*at, key, index)))
    return found


def model_at(model: type[BaseModel], path: Iterable[str | int]) -> type[BaseModel] | None:
    """The model that holds the fields under `path` (list indexes stepped over), if any."""
    current: type[BaseModel] | None = model
    for part in path:
        if isinstance(part, int):
            continue
        if current is None or part not in current.model_fields:
            return None
        annotation = current.model_fields[part].annotation
        current = _model_of(annotation) or _item_model_of(annotation)
    return current


def suggestion(name: str, model: type[BaseModel] | None) -> str:
    """" (did you mean NAME?)" for the field of `model` closest to `name`, or ""."""
    return _suggestion(name, set(model.model_fields)) if model is not None else ""


def _suggestion(name: str, known: Iterable[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""
