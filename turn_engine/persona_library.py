"""Named personas (`personas` in the settings), each from a file, for /persona to choose.

A `.toml` file holds `system_prompt` and optionally `name` (what the bot calls itself, and
its nickname in a server that chose the persona for the whole server) and `avatar` (an
image file beside it, the bot's avatar in that server). Any other file is the system prompt
as it is. `{date}` and `{time}` are filled in per reply (`persona.render`). The files are
read at start-up and on each reload; a missing or broken one is one line naming it.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .settings import ConfigurationError

PERSONA_KEYS = frozenset({"system_prompt", "name", "avatar"})
MAX_AVATAR_BYTES = 8 * 1024 * 1024
AVATAR_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".gif", ".webp"})


@dataclass(frozen=True, slots=True)
class NamedPersona:
    key: str
    """The name /persona knows it by."""
    system_prompt: str
    display_name: str | None = None
    avatar: bytes | None = None
    source: Path | None = None


class PersonaError(ValueError):
    """A persona file that cannot be used; the message is one line."""


def load_persona(key: str, path: Path) -> NamedPersona:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise PersonaError(f"cannot read the persona file {path} ({type(exc).__name__})"
                           ) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise PersonaError(f"the persona file {path} is not UTF-8 text") from None
    if path.suffix.lower() != ".toml":
        return NamedPersona(key, text, source=path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PersonaError(f"the persona file {path} is not valid TOML ({exc})") from None
    unknown = sorted(set(data) - PERSONA_KEYS)
    if unknown:
        raise PersonaError(f"the persona file {path}: unknown key {', '.join(unknown)} (it may "
                           f"have {', '.join(sorted(PERSONA_KEYS))})")
    prompt = data.get("system_prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise PersonaError(f"the persona file {path} needs a system_prompt (text)")
    name = data.get("name")
    if name is not None and (not isinstance(name, str) or not 1 <= len(name) <= 32):
        raise PersonaError(f"the persona file {path}: name must be text of 1 to 32 characters")
    avatar = _avatar(path, data.get("avatar"))
    return NamedPersona(key, prompt, display_name=name, avatar=avatar, source=path)


def _avatar(persona_file: Path, value: object) -> bytes | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise PersonaError(f"the persona file {persona_file}: avatar must be a file name")
    path = persona_file.parent / value
    if path.suffix.lower() not in AVATAR_SUFFIXES:
        raise PersonaError(f"the persona file {persona_file}: avatar {value} is not a PNG, "
                           "JPEG, GIF or WebP file")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PersonaError(f"the persona file {persona_file}: cannot read avatar {path} "
                           f"({type(exc).__name__})") from None
    if len(data) > MAX_AVATAR_BYTES:
        raise PersonaError(f"the persona file {persona_file}: avatar {value} is over 8 MiB")
    if not _is_image(data):
        raise PersonaError(f"the persona file {persona_file}: avatar {value} is not a PNG, "
                           "JPEG, GIF or WebP image")
    return data


def _is_image(data: bytes) -> bool:
    """The formats Discord takes for an avatar, by their magic bytes (as discord.py checks)."""
    return (data.startswith((b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a"))
            or (data[:4] == b"RIFF" and data[8:12] == b"WEBP"))


def load_personas(files: Mapping[str, Path]) -> dict[str, NamedPersona]:
    """Every configured persona; a `ConfigurationError` with a line per broken file."""
    found: dict[str, NamedPersona] = {}
    problems: list[str] = []
    for key, path in files.items():
        try:
            found[key] = load_persona(key, path)
        except PersonaError as exc:
            problems.append(f"personas.{key} (TURN_PERSONAS): {exc}")
    if problems:
        raise ConfigurationError(problems)
    return found
