"""Settings loaded the way the main job loads them, from a directory of the test's own with
only the `TURN_*` variables the test names (tests/test_operator_settings*.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import pytest

from turn_engine.settings import ConfigurationError, load_settings


@contextmanager
def environment(directory: Path, **values: str) -> Iterator[None]:
    """Only `values` as TURN_* variables, run from `directory` (where .env and turn.toml
    are looked for)."""
    kept = {k: v for k, v in os.environ.items() if not k.upper().startswith("TURN_")}
    previous = Path.cwd()
    with mock.patch.dict(os.environ, {**kept, **values}, clear=True):
        os.chdir(directory)
        try:
            yield
        finally:
            os.chdir(previous)


def problems(directory: Path, **values: str) -> list[str]:
    with environment(directory, **values), pytest.raises(ConfigurationError) as caught:
        load_settings()
    return caught.value.problems
