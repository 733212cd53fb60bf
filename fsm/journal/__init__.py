"""Turn journals: what a live turn recorded, how it is written and how it is read back.

Below both the scenario tools (which replay a journal as a scenario) and the review tools
(which draw and summarize one), so neither depends on the other for the format.
"""

from __future__ import annotations

from .document import journal_document
from .encoding import orjson_bytes
from .reading import ScenarioError, decode_json, loads, read_journal, read_json, read_text
from .recorder import (
    JournalRecorder,
    RecordingStash,
    jsonable,
    save_journal,
    serialize_journal,
    write_journal,
)

__all__ = ["JournalRecorder", "RecordingStash", "ScenarioError", "decode_json",
           "journal_document", "jsonable", "loads", "orjson_bytes", "read_journal",
           "read_json", "read_text", "save_journal", "serialize_journal", "write_journal"]
