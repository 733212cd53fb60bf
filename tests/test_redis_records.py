"""Records and signals read back from Redis, fuzzed (SPEC V7): whatever a queue record or a
pub/sub signal holds, decoding gives a record or refuses it, and the inbox acts or drops it,
never another exception. The same paths against a real redis-server are in
tests/test_redis_queue.py."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from discord_io.redis_backend.queue import BadRecord, QueuedRecord
from discord_io.redis_backend.signals import WorkerInbox


@settings(max_examples=200, deadline=None)
@given(raw=st.binary(max_size=200) | st.text(max_size=200) | st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.sampled_from(["message_id", "channel_id", "author", "op", "channel", "fence", "x"]),
        children, max_size=5), max_leaves=12).map(json.dumps))
def test_any_record_or_signal_is_decoded_or_refused(raw: bytes | str) -> None:
    # covers V7, fuzzed: whatever Redis hands back, a record is a QueuedRecord or BadRecord
    # and a signal is acted on or dropped, never another exception
    try:
        record = QueuedRecord.from_json(raw)
    except BadRecord:
        pass
    else:
        assert all(isinstance(v, str) and v for v in
                   (record.message_id, record.channel_id, record.author))
    acted: list[tuple[object, ...]] = []
    inbox = WorkerInbox(None, "turn:worker:X",  # type: ignore[arg-type]
                        on_kill=lambda *args: acted.append(args),
                        on_follow_up=lambda *args: acted.append(args))
    inbox.dispatch(raw)
    assert inbox.received + inbox.dropped == 1
    assert all(isinstance(arg, (str, int)) for call in acted for arg in call)
