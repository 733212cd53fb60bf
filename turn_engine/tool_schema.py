"""What makes a tool's declaration acceptable to every provider: a name they all take and an
input schema that is valid JSON Schema describing an object (MCP servers' tools and Python
hooks' tools are both checked with it)."""

from __future__ import annotations

import re
from typing import Any

import jsonschema
from jsonschema.exceptions import SchemaError

TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
"""What every provider accepts as a function name (OpenAI's rule is the strictest)."""


def schema_problem(schema: Any) -> str | None:
    """Why `schema` cannot be a tool's input schema, or None: it must be a valid JSON Schema
    (of the draft its `$schema` names, 2020-12 by default) describing an object."""
    if not isinstance(schema, dict):
        return "the input schema is not a JSON object"
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "the schema"
        return f"not valid JSON Schema at {where}: {exc.message}"
    if schema.get("type", "object") != "object":
        return f"the input schema describes {schema.get('type')!r}, not an object"
    return None
