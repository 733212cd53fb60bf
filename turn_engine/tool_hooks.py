"""Tools written in Python (`tool_hooks`): a module path or an entry point exposing
`FunctionTool`s (or anything keeping the engine's `Tool` contract).

A hook is `package.module` (its `TOOLS`), `package.module:attribute`, or the name of an entry
point in the group `turn_engine.tools`. What it names may be a tool, a list of tools, or a
function (no arguments) returning either. Hooks are imported once, at start-up: Python code
is not reloaded on SIGHUP. Anything wrong — a module that does not import, an attribute that
is missing, something that is not a tool, a schema that is not valid JSON Schema — stops
start-up with one line naming the hook.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Iterable
from typing import Any

from fsm import LOOP_POLICIES, Tool, schema_of

from .settings import ConfigurationError
from .tool_schema import TOOL_NAME, schema_problem

ENTRY_POINT_GROUP = "turn_engine.tools"
DEFAULT_ATTRIBUTE = "TOOLS"


def load_hook_tools(hooks: Iterable[str]) -> list[Tool]:
    """Every hook's tools, in order; a `ConfigurationError` listing each broken hook."""
    tools: list[Tool] = []
    problems: list[str] = []
    for hook in hooks:
        try:
            tools.extend(_tools_of(hook, _resolve(hook)))
        except _HookError as exc:
            problems.append(f"tool_hooks (TURN_TOOL_HOOKS): {hook}: {exc}")
    if problems:
        raise ConfigurationError(problems)
    return tools


class _HookError(ValueError):
    pass


def _resolve(hook: str) -> Any:
    entry = _entry_point(hook)
    try:
        if entry is not None:
            return entry.load()
        module_name, _, attribute = hook.partition(":")
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise _HookError(f"cannot be imported ({type(exc).__name__}: {exc})") from None
    except Exception as exc:
        raise _HookError(f"raised {type(exc).__name__} while importing: {exc}") from None
    name = attribute or DEFAULT_ATTRIBUTE
    if not hasattr(module, name):
        raise _HookError(f"the module has no {name!r}")
    return getattr(module, name)


def _entry_point(name: str) -> importlib.metadata.EntryPoint | None:
    if ":" in name or "." in name:
        return None
    found = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP, name=name)
    return next(iter(found), None)


def _tools_of(hook: str, value: Any) -> list[Tool]:
    if callable(value) and not _looks_like_tool(value):
        try:
            value = value()
        except Exception as exc:
            raise _HookError(f"raised {type(exc).__name__}: {exc}") from None
    items = [value] if _looks_like_tool(value) else value
    if not isinstance(items, Iterable) or isinstance(items, (str, bytes)):
        raise _HookError(f"gives {type(value).__name__}, not a tool or a list of tools")
    tools: list[Tool] = []
    for item in items:
        if not _looks_like_tool(item):
            raise _HookError(f"gives {type(item).__name__}, which is not a tool (a FunctionTool "
                             "has a name, description, args_model, guard, loop and run)")
        problem = _tool_problem(item)
        if problem is not None:
            raise _HookError(f"tool {getattr(item, 'name', '?')!r}: {problem}")
        tools.append(item)
    return tools


def _looks_like_tool(value: Any) -> bool:
    return all(hasattr(value, attr) for attr in
               ("name", "description", "args_model", "guard", "loop", "run"))


def _tool_problem(tool: Any) -> str | None:
    if not isinstance(tool.name, str) or not TOOL_NAME.match(tool.name):
        return "a tool name may only have letters, digits, _ and - (at most 64)"
    if tool.loop not in LOOP_POLICIES:
        return f"loop must be one of {', '.join(LOOP_POLICIES)}"
    try:
        schema = schema_of(tool)["parameters"]
    except Exception as exc:
        return f"its arguments model has no JSON schema ({type(exc).__name__})"
    return schema_problem(schema)
