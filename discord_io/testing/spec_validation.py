"""Holds the emulator's REST traffic to Discord's own OpenAPI description of its v10 API.

Every request discord.py sends and every response the emulator returns is validated with
openapi-core against the operation it belongs to (path, method, query, headers, security and
JSON body), so the emulator's shapes are Discord's rather than our guess. A mismatch becomes a
`SpecViolation` naming the operation and the JSON path.

Discord's notes on the spec say its documentation wins where the two disagree; the places
where that mattered are patched in memory at load time, each with its reason, in
`DOCUMENTED_OVERRIDES` (the published file stays untouched beside its licence).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Literal

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match
from openapi_core import Config, OpenAPI
from openapi_core.testing import MockRequest, MockResponse
from openapi_core.validation.response.validators import V31ResponseDataValidator

JsonDict = dict[str, Any]
Direction = Literal["request", "response", "event"]

SPEC_PACKAGE = "discord_io.testing.discord_api_spec"
SPEC_HOST = "https://discord.com"
SPEC_PREFIX = "/api/v10"


@dataclass(frozen=True, slots=True)
class SpecViolation:
    """One place where traffic differs from Discord's spec."""

    operation: str
    direction: Direction
    json_path: str
    message: str
    method: str = ""
    path: str = ""
    status: int | None = None

    def __str__(self) -> str:
        where = f"{self.method} {self.path}".strip()
        status = f" {self.status}" if self.status is not None else ""
        text = f"{self.operation} {self.direction}{status} at {self.json_path}: {self.message}"
        return f"{text} ({where})" if where else text


class SpecViolationError(AssertionError):
    """Raised when a test's Discord traffic broke the spec; lists every violation."""

    def __init__(self, violations: Iterable[SpecViolation]) -> None:
        self.violations = list(violations)
        lines = "\n".join(f"  - {v}" for v in self.violations)
        super().__init__(f"Discord traffic broke Discord's OpenAPI spec:\n{lines}")


@dataclass(frozen=True, slots=True)
class Override:
    """A patch to the published spec, applied because Discord's documentation says so."""

    where: str
    reason: str
    apply: Callable[[JsonDict], None]


def _schema(spec: JsonDict, name: str) -> JsonDict:
    schema: JsonDict = spec["components"]["schemas"][name]
    return schema


def _rate_limit_code_optional(spec: JsonDict) -> None:
    schema = _schema(spec, "RatelimitedResponse")
    error = dict(_schema(spec, "Error"))
    error["required"] = ["message"]
    schema["allOf"] = [error, *schema["allOf"][1:]]


def _field_error_codes_are_names(spec: JsonDict) -> None:
    items = dict(_schema(spec, "Error"))
    items["properties"] = {**items["properties"], "code": {"type": "string"}}
    _schema(spec, "InnerErrors")["properties"]["_errors"]["items"] = items


SNOWFLAKE_REF = "#/components/schemas/SnowflakeType"
REQUEST_SNOWFLAKE = "SnowflakeOrIntegerType"


def _schemas_under(node: Any, schemas: JsonDict, found: set[str]) -> set[str]:
    """Names of the component schemas `node` refers to, transitively."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
            name = ref.rsplit("/", 1)[1]
            if name not in found:
                found.add(name)
                _schemas_under(schemas[name], schemas, found)
        for value in node.values():
            _schemas_under(value, schemas, found)
    elif isinstance(node, list):
        for value in node:
            _schemas_under(value, schemas, found)
    return found


def _replace_ref(node: Any, old: str, new: str) -> None:
    if isinstance(node, dict):
        if node.get("$ref") == old:
            node["$ref"] = new
        for value in node.values():
            _replace_ref(value, old, new)
    elif isinstance(node, list):
        for value in node:
            _replace_ref(value, old, new)


def _integer_snowflakes_in_requests(spec: JsonDict) -> None:
    """Request bodies (and the schemas only they use) accept a snowflake as an integer;
    what Discord returns stays a string."""
    schemas = spec["components"]["schemas"]
    operations = [op for item in spec["paths"].values() for op in item.values()
                  if isinstance(op, dict) and "responses" in op]
    bodies = [op["requestBody"] for op in operations if "requestBody" in op]
    in_requests = _schemas_under(bodies, schemas, set())
    in_responses = _schemas_under([op["responses"] for op in operations], schemas, set())
    schemas[REQUEST_SNOWFLAKE] = {"oneOf": [{"$ref": SNOWFLAKE_REF},
                                            {"type": "integer", "minimum": 0}]}
    new_ref = f"#/components/schemas/{REQUEST_SNOWFLAKE}"
    for name in in_requests - in_responses:
        _replace_ref(schemas[name], SNOWFLAKE_REF, new_ref)
    for body in bodies:
        _replace_ref(body, SNOWFLAKE_REF, new_ref)


DOCUMENTED_OVERRIDES: tuple[Override, ...] = (
    Override(
        "components.schemas.RatelimitedResponse (code)",
        "The documentation (Topics > Rate Limits, 'Rate Limit Response Structure') lists "
        "`code?` as optional in a 429 body, and its example has none; the spec requires it "
        "through the shared Error schema.",
        _rate_limit_code_optional,
    ),
    Override(
        "components.schemas.InnerErrors._errors[].code",
        "The documentation (Reference > Error Messages) shows a field's errors with names for "
        "codes (`\"code\": \"BASE_TYPE_REQUIRED\"`); the spec reuses the integer code of the "
        "top-level error.",
        _field_error_codes_are_names,
    ),
    Override(
        "snowflakes in request bodies (SnowflakeType, e.g. MessageReferenceRequest.message_id, "
        "MessageAttachmentRequest.id)",
        "The documentation (Reference > Snowflakes) says IDs are *returned* as strings; it "
        "sends integers itself in requests (Reference > Uploading Files numbers attachments "
        "`\"id\": 0`), and discord.py sends every snowflake in a body as a JSON integer. The "
        "spec reuses the response's string type for requests; responses stay strings.",
        _integer_snowflakes_in_requests,
    ),
)
"""Where Discord's documentation beats its spec (Discord's own note: the docs win)."""

UNDESCRIBED_STATUS_FROM = 500
"""The spec describes no 5xx answer (the docs: 'the server had an error processing your
request'); their bodies are not validated."""


def load_spec() -> JsonDict:
    """The published spec with `DOCUMENTED_OVERRIDES` applied (a fresh copy each call)."""
    text = resources.files(SPEC_PACKAGE).joinpath("openapi.json").read_text("utf-8")
    spec: JsonDict = json.loads(text)
    for override in DOCUMENTED_OVERRIDES:
        override.apply(spec)
    return spec


def _path_regex(template: str) -> re.Pattern[str]:
    pattern = re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template))
    return re.compile(f"^{pattern}$")


class SpecValidator:
    """Validates emulator traffic; load once (`shared_validator`), it takes about a second."""

    def __init__(self, spec: JsonDict) -> None:
        # None skips re-validating Discord's whole spec at load (openapi-core honours it,
        # its annotation does not admit it).
        config = Config(spec_validator_cls=None)  # type: ignore[arg-type]
        self._api = OpenAPI.from_dict(spec, config=config)
        # Most answers carry none of the headers the spec declares (the rate-limit ones):
        # their bodies alone are validated, which costs less than half as much.
        body_only = Config(spec_validator_cls=None,  # type: ignore[arg-type]
                           response_validator_cls=V31ResponseDataValidator)
        self._body_api = OpenAPI.from_dict(spec, config=body_only)
        self._declared_headers = {
            name.lower() for name in spec["components"].get("headers", {})}
        self._components = spec["components"]
        self._object_validators: dict[str, Draft202012Validator] = {}
        routes = [(template, operations) for template, operations in spec["paths"].items()]
        # Literal segments (`/users/@me`, `/messages/@original`) win over templated ones.
        routes.sort(key=lambda item: item[0].count("{"))
        self._routes = [
            (_path_regex(template), {method.upper(): op.get("operationId", template)
                                     for method, op in operations.items()
                                     if isinstance(op, dict) and "responses" in op})
            for template, operations in routes
        ]

    def operation(self, method: str, path: str) -> str | None:
        """The spec's operationId for `method path` (path without the /api/v10 prefix)."""
        for regex, operations in self._routes:
            if regex.match(path) and method.upper() in operations:
                return str(operations[method.upper()])
        return None

    def check_request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str],
        headers: Mapping[str, str],
        body: Any,
    ) -> list[SpecViolation]:
        """Violations of the request; `body` is the decoded JSON (for multipart, the
        `payload_json` part, which the spec describes with the JSON body's schema)."""
        operation = self.operation(method, path)
        if operation is None:
            return [SpecViolation("(none)", "request", "$", "no operation in the spec",
                                  method, path)]
        request = self._request(method, path, query, headers, body)
        return [self._violation(error, operation, "request", method, path, None)
                for error in self._api.iter_request_errors(request)]

    def check_response(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str],
        headers: Mapping[str, str],
        status: int,
        body: bytes,
        content_type: str,
        response_headers: Mapping[str, str] | None = None,
    ) -> list[SpecViolation]:
        """Violations of the answer: its body, and its headers where it has any the spec
        declares (`X-RateLimit-*`)."""
        operation = self.operation(method, path)
        if operation is None or status >= UNDESCRIBED_STATUS_FROM:
            return []
        request = self._request(method, path, query, headers, None)
        sent = dict(response_headers or {})
        response = MockResponse(body, status_code=status, headers=sent,
                                content_type=content_type or "application/json")
        api = (self._api if any(k.lower() in self._declared_headers for k in sent)
               else self._body_api)
        return [self._violation(error, operation, "response", method, path, status)
                for error in api.iter_response_errors(request, response)]

    def check_object(self, schema: str, data: Any, *, where: str) -> list[SpecViolation]:
        """Violations of `data` against the component schema `schema` — for the objects a
        gateway event carries (the spec describes HTTP only, but a MESSAGE_CREATE carries a
        message, a GUILD_CREATE channels and users, as REST returns them)."""
        validator = self._object_validators.get(schema)
        if validator is None:
            root = {"$ref": f"#/components/schemas/{schema}", "components": self._components}
            validator = self._object_validators[schema] = Draft202012Validator(root)
        return [SpecViolation(where, "event", path, message)
                for error in validator.iter_errors(data)
                for path, message in _leaves(error)]

    @staticmethod
    def _request(method: str, path: str, query: Mapping[str, str],
                 headers: Mapping[str, str], body: Any) -> MockRequest:
        data = json.dumps(body).encode() if body is not None else None
        return MockRequest(
            SPEC_HOST, method.lower(), SPEC_PREFIX + path, args=dict(query),
            headers=dict(headers), data=data, content_type="application/json",
        )

    @staticmethod
    def _violation(error: Exception, operation: str, direction: Direction, method: str,
                   path: str, status: int | None) -> SpecViolation:
        details = list(_schema_errors(error))
        if not details:
            return SpecViolation(operation, direction, "$", _describe(error), method, path,
                                 status)
        json_path, message = details[0]
        if len(details) > 1:
            others = "; ".join(f"{p}: {m}" for p, m in details[1:])
            message = f"{message}; {others}"
        return SpecViolation(operation, direction, json_path, message, method, path, status)


def _describe(error: BaseException) -> str:
    parts = [f"{type(error).__name__}: {error}"]
    cause = error.__cause__
    while cause is not None:
        parts.append(f"{type(cause).__name__}: {cause}")
        cause = cause.__cause__
    return " <- ".join(parts)


def _schema_errors(error: BaseException) -> Iterator[tuple[str, str]]:
    """(JSON path, message) of each schema error under `error`, the innermost first."""
    current: BaseException | None = error
    while current is not None:
        for schema_error in getattr(current, "schema_errors", ()) or ():
            yield from _leaves(schema_error)
        current = current.__cause__


def _leaves(schema_error: Any) -> Iterator[tuple[str, str]]:
    """A union's error says little ("is not valid under any of the given schemas"); its
    best-matching branch's errors say where the payload went wrong."""
    context = list(getattr(schema_error, "context", None) or ())
    # A branch the value fails on its type alone (`null` in "null or object") says nothing.
    telling = [e for e in context if not (e.validator == "type" and not e.path)]
    if telling or context:
        best = best_match(telling or context)
        if best is not None:
            yield from _leaves(best)
            return
    yield str(getattr(schema_error, "json_path", "$")), str(schema_error.message)


@cache
def shared_validator() -> SpecValidator:
    """One validator per process (loading the 1 MB spec is the slow part)."""
    return SpecValidator(load_spec())
