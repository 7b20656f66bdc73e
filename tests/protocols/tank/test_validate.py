"""``validate_bundle`` accepts exactly what ``decode_bundle`` accepts."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from headrace.errors import RemoteProtocolError
from headrace.protocols.tank._fast import validate_bundle
from headrace.protocols.tank.bundle import decode_bundle, encode_bundle
from headrace.protocols.tank.commands import BundleMessage

messages = st.lists(
    st.builds(
        BundleMessage,
        content=st.binary(max_size=300),
        timestamp_ms=st.sampled_from([0, 1, 1_700_000_000_000]),
        key=st.binary(max_size=3),
    ),
    min_size=1,
    max_size=40,
)


def sparse_messages(draw_seqs: list[int], base: list[BundleMessage]) -> list[BundleMessage]:
    return [
        BundleMessage(m.content, m.timestamp_ms, m.key, s)
        for m, s in zip(base, draw_seqs, strict=False)
    ]


@st.composite
def bundles(draw: st.DrawFn) -> bytes:
    base = draw(messages)
    compress = draw(st.booleans())
    if draw(st.booleans()):
        gaps = draw(st.lists(st.integers(1, 300), min_size=len(base), max_size=len(base)))
        seqs = [sum(gaps[: i + 1]) for i in range(len(base))]
        return encode_bundle(sparse_messages(seqs, base), compress=compress, sparse=True)
    return encode_bundle(base, compress=compress)


def decodes(bundle: bytes) -> bool:
    try:
        decode_bundle(bundle, 1)
    except RemoteProtocolError:
        return False
    return True


def validates(bundle: bytes) -> bool:
    try:
        validate_bundle(bundle)
    except RemoteProtocolError:
        return False
    return True


@given(bundles())
def test_valid_bundles_validate(bundle: bytes) -> None:
    assert validates(bundle)


@given(bundles(), st.data())
def test_mutated_bundles_agree(bundle: bytes, data: st.DataObject) -> None:
    mutated = bytearray(bundle)
    for _ in range(data.draw(st.integers(1, 3))):
        position = data.draw(st.integers(0, len(mutated) - 1))
        mutated[position] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(mutated) + 2))
    mutated = mutated[:cut] + data.draw(st.binary(max_size=2))
    assert validates(bytes(mutated)) == decodes(bytes(mutated))


@given(st.binary(max_size=64))
def test_arbitrary_bytes_agree(raw: bytes) -> None:
    assert validates(raw) == decodes(raw)


@st.composite
def uniform_bundles(draw: st.DrawFn) -> bytes:
    """Fixed-size records, the shape validated without a walk: one content size,
    one key size, timestamps all equal (only the first message carries one) or not."""
    count = draw(st.integers(1, 60))
    size = draw(st.sampled_from([0, 1, 100, 127, 128, 300, 20_000]))
    key_size = draw(st.sampled_from([0, 1, 16]))
    same_ts = draw(st.booleans())
    base = [
        BundleMessage(
            draw(st.binary(min_size=size, max_size=size)),
            1_700_000_000_000 if same_ts else draw(st.integers(0, 2**63)),
            draw(st.binary(min_size=key_size, max_size=key_size)),
        )
        for _ in range(count)
    ]
    return encode_bundle(base, compress=draw(st.booleans()))


@given(uniform_bundles())
def test_uniform_bundles_validate(bundle: bytes) -> None:
    assert validates(bundle) and decodes(bundle)


@given(uniform_bundles(), st.data())
def test_mutated_uniform_bundles_agree(bundle: bytes, data: st.DataObject) -> None:
    mutated = bytearray(bundle)
    for _ in range(data.draw(st.integers(1, 2))):
        position = data.draw(st.integers(0, len(mutated) - 1))
        mutated[position] = data.draw(st.integers(0, 255))
    cut = data.draw(st.sampled_from([len(mutated), len(mutated) - 1, len(mutated) + 1]))
    mutated = mutated[:cut] + data.draw(st.binary(max_size=1))
    assert validates(bytes(mutated)) == decodes(bytes(mutated))
