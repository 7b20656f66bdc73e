"""Hypothesis: any sequence of splits and merges keeps the epoch history consistent.

Transactions are opened and committed between the scales, so some commit by
rolling. Afterwards each epoch's segments tile [0, 1) exactly, the successors
of every replaced segment cover its key range and list it among their
predecessors, the store holds exactly the sealed/active segments the metadata
says, and every committed transaction's events are in the stream exactly once.
"""

from __future__ import annotations

import asyncio
import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headrace.controller.model import ControllerModel
from headrace.controller.naming import TxnId, segment_name
from headrace.controller.records import ScalingPolicy, SegmentRecord, StreamConfig
from headrace.store.memory import MemoryStore
from tests._hypothesis import examples

# A step: (split?, which segment/pair by index modulo the current count, split point,
# what to do with transactions first).
steps = st.lists(
    st.tuples(
        st.booleans(),
        st.integers(0, 1000),
        st.floats(0.05, 0.95),
        st.sampled_from(["", "open", "commit"]),
    ),
    min_size=1,
    max_size=12,
)


def assert_tiles(segs: list[SegmentRecord]) -> None:
    segs = sorted(segs, key=lambda s: s.min_key)
    assert segs[0].min_key == 0.0
    assert segs[-1].max_key == 1.0
    for a, b in itertools.pairwise(segs):
        assert a.max_key == b.min_key


async def run(initial: int, plan: list[tuple[bool, int, float, str]]) -> None:
    store = MemoryStore()
    model = await ControllerModel.open(store)
    model.rolling_commit_window_s = 0
    await model.create_scope("sc")
    await model.create_stream("sc", "st", StreamConfig(ScalingPolicy(min_num_segments=initial)))
    txns: list[tuple[TxnId, int]] = []  # (id, number of parents)
    pending: list[TxnId] = []
    for split, pick, point, action in plan:
        if action == "open":
            txn, parents = await model.create_txn("sc", "st", 90_000)
            for name in model.txn_segments("sc", "st", txn.txn):
                await store.append(name, f"<{txn.txn.hex}>".encode())
            txns.append((txn.txn, len(parents)))
            pending.append(txn.txn)
        elif action == "commit" and pending:
            await model.commit_txn("sc", "st", pending.pop(0))
        current = model.current_segments("sc", "st")
        if split or len(current) == 1:
            seg = current[pick % len(current)]
            mid = seg.min_key + (seg.max_key - seg.min_key) * point
            if not seg.min_key < mid < seg.max_key:
                continue
            await model.scale("sc", "st", [seg.id], [(seg.min_key, mid), (mid, seg.max_key)])
        else:
            i = pick % (len(current) - 1)
            a, b = current[i], current[i + 1]
            await model.scale("sc", "st", [a.id, b.id], [(a.min_key, b.max_key)])

    for txn in pending:
        await model.commit_txn("sc", "st", txn)
    epoch = model.current_epoch("sc", "st")
    for e in range(epoch + 1):
        assert_tiles(model.epoch_segments("sc", "st", e))
    history = model.segments_between("sc", "st", {}, {})
    for seg in history:
        successors = model.successors("sc", "st", seg.id)
        if seg.sealed_epoch is None:
            assert successors == []
            assert not (await store.info(segment_name("sc", "st", seg.id))).sealed
            continue
        assert (await store.info(segment_name("sc", "st", seg.id))).sealed
        covered = sorted(
            (max(s.segment.min_key, seg.min_key), min(s.segment.max_key, seg.max_key))
            for s in successors
        )
        assert covered[0][0] == seg.min_key and covered[-1][1] == seg.max_key
        for (_, hi), (lo, _) in itertools.pairwise(covered):
            assert hi == lo
        assert all(seg.id in s.predecessors for s in successors)
    data = b"".join(
        [(await store.read(segment_name("sc", "st", seg.id), 0, 1 << 20)).data for seg in history]
    )
    for txn, parents in txns:
        assert data.count(f"<{txn.hex}>".encode()) == parents
    await store.close()


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(initial=st.integers(1, 4), plan=steps)
def test_scaling_keeps_epochs_tiled_and_successors_consistent(
    initial: int, plan: list[tuple[bool, int, float, str]]
) -> None:
    asyncio.run(run(initial, plan))
