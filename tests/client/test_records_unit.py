"""Record decoding without a server: event reassembly across reads, TANK unpacking."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace.client.records import _EventBuffer, iter_events, records_from_events
from headrace.protocols import pravega as p
from headrace.protocols.records import MAX_EVENT_TIME_JSON_BYTES, event_time_ms
from headrace.protocols.tank.bundle import encode_bundle
from headrace.protocols.tank.commands import BundleMessage


@given(
    st.lists(st.binary(max_size=40), max_size=20),
    st.lists(st.integers(min_value=1, max_value=30), max_size=50),
    st.integers(min_value=0, max_value=10_000),
)
def test_events_reassembled_whatever_the_read_sizes(
    payloads: list[bytes], cuts: list[int], base: int
) -> None:
    data = b"".join(p.encode_event(x) for x in payloads)
    buf = _EventBuffer(base)
    got: list[tuple[int, bytes]] = []
    pos = 0
    for cut in cuts:
        got.extend(buf.feed(data[pos : pos + cut]))
        pos += cut
    got.extend(buf.feed(data[pos:]))
    expected, offset = [], base
    for x in payloads:
        expected.append((offset, x))
        offset += 8 + len(x)
    assert got == expected
    assert buf.offset == base + len(data) and not buf.buffer


@pytest.mark.parametrize("split", [3, 12, 20])  # in the header, in the raw bytes, after
def test_bytes_that_are_not_events_are_raw_chunks(split: int) -> None:
    """A byte stream after an event: the event as usual, then every byte as it is."""
    raw = b"\x00\x00\x00\x05not an event at all"  # type 5 is not an Event
    data = p.encode_event(b"ev") + raw
    buf = _EventBuffer(100)
    events = list(buf.feed(data[: 10 + split])) + list(buf.feed(data[10 + split :]))
    records = list(records_from_events("sc/st", "sc/st/0.#epoch.0", iter(events), tank=False))
    assert (records[0].offset, records[0].value, records[0].format) == (100, b"ev", "event")
    assert [r.format for r in records[1:]] == ["bytes"] * (len(records) - 1)
    assert b"".join(r.value for r in records[1:]) == raw
    assert records[1].offset == 110 and buf.offset == 100 + len(data) and not buf.buffer


def test_an_event_that_never_completes_is_flushed_raw() -> None:
    buf = _EventBuffer(0)
    assert list(buf.feed(b"\x00\x00\x00\x00\x00\x00\x00\x09abc")) == []
    assert buf.missing_bytes() == 6
    assert list(buf.flush()) == [(0, b"\x00\x00\x00\x00\x00\x00\x00\x09abc")]
    assert buf.raw and buf.missing_bytes() == 0


def test_plain_events_become_records_without_key_or_timestamp() -> None:
    events = iter_events(p.encode_event(b"a") + p.encode_event(b"bc"), 100)
    records = list(records_from_events("sc/st", "sc/st/0.#epoch.0", events, tank=False))
    assert [(r.offset, r.key, r.value, r.timestamp_ms) for r in records] == [
        (100, None, b"a", None),
        (109, None, b"bc", None),
    ]


def test_compressed_tank_bundle_unpacked() -> None:
    messages = [BundleMessage(f"v{i}".encode() * 50, 1000 + i, b"k") for i in range(600)]
    bundle = encode_bundle(messages, compress=True)
    events = iter_events(p.encode_event(bundle))
    records = list(records_from_events("tank/t", "tank/t/0.#epoch.0", events, tank=True))
    assert [(r.key, r.value, r.timestamp_ms, r.index) for r in records] == [
        (b"k", m.content, m.timestamp_ms, i) for i, m in enumerate(messages)
    ]


def test_a_json_documents_own_time_is_its_timestamp() -> None:
    shipped = b'{"@timestamp":"2026-01-31T12:00:00.123Z","message":"GET /"}'
    assert event_time_ms(shipped) == 1_769_860_800_123
    assert event_time_ms(b'{"@timestamp":"2026-01-31T12:00:00"}') == 1_769_860_800_000  # UTC
    for other in (
        b"plain text",
        b'{"@timestamp": 5}',
        b'{"@timestamp": "not a time"}',
        b'{"@timestamp"' + b"\xff",
        b'{"@timestamp":' + b"[" * 60_000 + b"}",  # too deep to parse: no time, no crash
        b'{"@timestamp":"2026-01-31T12:00:00Z","pad":"' + b"x" * MAX_EVENT_TIME_JSON_BYTES + b'"}',
    ):
        assert event_time_ms(other) is None
    events = iter_events(p.encode_event(shipped), 0)
    [record] = records_from_events("sc/st", "sc/st/0.#epoch.0", events, tank=False)
    assert (record.timestamp_ms, record.append_time) == (1_769_860_800_123, False)
