"""ControllerModel over both stores: scopes, streams, segments, scaling, transactions, restarts."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest

from headrace.controller.errors import (
    InvalidArgument,
    InvalidName,
    LeaseTooLarge,
    ScalePreconditionFailed,
    ScopeExists,
    ScopeNotEmpty,
    ScopeNotFound,
    SegmentNotInStream,
    StreamExists,
    StreamNotFound,
    StreamNotSealed,
    StreamSealed,
    TableExists,
    TableNotFound,
    TxnNotFound,
    TxnNotOpen,
)
from headrace.controller.model import (
    ABORTED_SEGMENT_GRACE_MS,
    AUTO_SCALE_COLD_SAMPLES,
    AUTO_SCALE_HOT_SAMPLES,
    COMPLETED_TXN_KEEP_MS,
    LEASE_SLACK_FACTOR,
    MAX_RETENTION_CUTS,
    MAX_SEGMENTS_PER_EPOCH,
    MAX_TABLE_PARTITIONS,
    MAX_TXN_LEASE_MS,
    TRANSIENT_SEGMENT_MAX_IDLE_MS,
    ControllerModel,
)
from headrace.controller.naming import TxnId, segment_id, segment_name
from headrace.controller.records import (
    STREAMS_TABLE,
    TRANSACTIONS_TABLE,
    KeyValueTableConfig,
    RetentionPolicy,
    RetentionType,
    ScalingPolicy,
    ScalingType,
    StreamConfig,
    TxnState,
)
from headrace.errors import SegmentNotFound, SegmentSealed
from headrace.store.api import FsyncPolicy, SegmentStore
from headrace.store.disk import DiskStore
from headrace.store.memory import MemoryStore
from headrace.types import WriterAppend


class Clock:
    def __init__(self) -> None:
        self.now_ms = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now_ms


class Env:
    """A store and a model on it; ``restart`` rebuilds the model (and reopens a disk store)."""

    def __init__(self, kind: str, path: Path) -> None:
        self.kind = kind
        self.path = path
        self.clock = Clock()
        self.store: SegmentStore = MemoryStore()
        self.model: ControllerModel

    async def open(self, store: SegmentStore | None = None) -> None:
        if store is None:
            if self.kind == "disk":
                self.store = await DiskStore.open(self.path, fsync=FsyncPolicy.NEVER)
            store = self.store
        self.model = await ControllerModel.open(store, clock_ms=self.clock)

    async def restart(self, store: SegmentStore | None = None) -> None:
        if self.kind == "disk":
            await self.store.close()
        await self.open(store)

    async def close(self) -> None:
        await self.store.close()


@pytest.fixture(params=["memory", "disk"])
async def env(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Env]:
    e = Env(request.param, tmp_path / "data")
    await e.open()
    yield e
    await e.close()


def fixed(n: int, tags: tuple[str, ...] = ()) -> StreamConfig:
    return StreamConfig(scaling=ScalingPolicy(min_num_segments=n), tags=tags)


async def make_stream(env: Env, n: int = 1, scope: str = "sc", stream: str = "st") -> None:
    if not env.model.scope_exists(scope):
        await env.model.create_scope(scope)
    await env.model.create_stream(scope, stream, fixed(n))


# --------------------------------------------------------------------------- scopes


async def test_create_scope_then_exists_and_listed(env: Env) -> None:
    await env.model.create_scope("b")
    await env.model.create_scope("a")
    assert env.model.scope_exists("a")
    assert env.model.list_scopes(limit=10) == ["a", "b"]


async def test_create_scope_twice_raises_scope_exists(env: Env) -> None:
    await env.model.create_scope("a")
    with pytest.raises(ScopeExists):
        await env.model.create_scope("a")


@pytest.mark.parametrize("name", ["", "a/b", "_system", "x y"])
async def test_create_scope_with_invalid_name_raises(env: Env, name: str) -> None:
    with pytest.raises(InvalidName):
        await env.model.create_scope(name)


async def test_list_scopes_pages_after_the_token(env: Env) -> None:
    for name in ["s1", "s2", "s3"]:
        await env.model.create_scope(name)
    assert env.model.list_scopes(limit=2) == ["s1", "s2"]
    assert env.model.list_scopes(after="s2", limit=2) == ["s3"]
    assert env.model.list_scopes(after="s3", limit=2) == []


async def test_delete_scope_with_streams_raises_not_empty(env: Env) -> None:
    await make_stream(env)
    with pytest.raises(ScopeNotEmpty):
        await env.model.delete_scope("sc")


async def test_delete_missing_scope_raises_not_found(env: Env) -> None:
    with pytest.raises(ScopeNotFound):
        await env.model.delete_scope("nope")


async def test_delete_empty_scope(env: Env) -> None:
    await env.model.create_scope("a")
    await env.model.delete_scope("a")
    assert not env.model.scope_exists("a")
    assert env.model.list_scopes(limit=10) == []


# --------------------------------------------------------------------------- streams


async def test_create_stream_creates_segments_partitioning_the_key_space(env: Env) -> None:
    await make_stream(env, 3)
    segs = env.model.current_segments("sc", "st")
    assert [s.id for s in segs] == [0, 1, 2]
    assert segs[0].min_key == 0.0 and segs[-1].max_key == 1.0
    assert all(a.max_key == b.min_key for a, b in itertools.pairwise(segs))
    names = await env.store.list_segments()
    for i in range(3):
        assert f"sc/st/{i}.#epoch.0" in names


async def test_create_stream_in_missing_scope_raises_scope_not_found(env: Env) -> None:
    with pytest.raises(ScopeNotFound):
        await env.model.create_stream("nope", "st", fixed(1))


async def test_create_stream_twice_raises_stream_exists(env: Env) -> None:
    await make_stream(env)
    with pytest.raises(StreamExists):
        await env.model.create_stream("sc", "st", fixed(1))


async def test_create_stream_with_invalid_name_raises(env: Env) -> None:
    await env.model.create_scope("sc")
    with pytest.raises(InvalidName):
        await env.model.create_stream("sc", "a_kvtable", fixed(1))


async def test_create_stream_with_zero_segments_gets_one(env: Env) -> None:
    await env.model.create_scope("sc")
    await env.model.create_stream("sc", "st", fixed(0))
    assert len(env.model.current_segments("sc", "st")) == 1


async def test_create_stream_with_too_many_segments_raises(env: Env) -> None:
    await env.model.create_scope("sc")
    with pytest.raises(InvalidArgument):
        await env.model.create_stream("sc", "st", fixed(MAX_SEGMENTS_PER_EPOCH + 1))


async def test_auto_scaling_policy_is_recorded_and_starts_at_min_segments(env: Env) -> None:
    await env.model.create_scope("sc")
    cfg = StreamConfig(
        scaling=ScalingPolicy(ScalingType.BY_RATE_IN_EVENTS_PER_SEC, 100, 2, 2),
        retention=RetentionPolicy(RetentionType.SIZE, 1024, 4096),
    )
    await env.model.create_stream("sc", "st", cfg)
    assert env.model.stream_config("sc", "st") == cfg
    assert len(env.model.current_segments("sc", "st")) == 2


async def test_update_stream_replaces_tags_and_list_filters_by_tag(env: Env) -> None:
    await env.model.create_scope("sc")
    await env.model.create_stream("sc", "a", fixed(1, ("x",)))
    await env.model.create_stream("sc", "b", fixed(1))
    assert env.model.list_streams("sc", limit=10, tag="x") == ["a"]
    await env.model.update_stream("sc", "b", fixed(1, ("x", "y", "x")))
    assert env.model.stream_config("sc", "b").tags == ("x", "y")
    assert env.model.list_streams("sc", limit=10, tag="x") == ["a", "b"]
    assert env.model.list_streams("sc", limit=10) == ["a", "b"]


@pytest.mark.parametrize(("before", "after"), [(1, 3), (4, 2)])
async def test_update_to_another_fixed_count_rescales(env: Env, before: int, after: int) -> None:
    await make_stream(env, before)
    await env.model.update_stream("sc", "st", fixed(after))
    segs = env.model.current_segments("sc", "st")
    assert len(segs) == after
    assert (segs[0].min_key, segs[0].max_key) == (0.0, 1 / after)
    assert segs[-1].max_key == 1.0
    assert env.model.current_epoch("sc", "st") == 1
    assert {s.segment.id for s in env.model.successors("sc", "st", 0)} <= {s.id for s in segs}


async def test_update_auto_scaling_minimum_only_scales_up(env: Env) -> None:
    await make_stream(env, 3)
    auto = ScalingType.BY_RATE_IN_EVENTS_PER_SEC
    await env.model.update_stream("sc", "st", StreamConfig(ScalingPolicy(auto, 10, 2, 2)))
    assert len(env.model.current_segments("sc", "st")) == 3
    await env.model.update_stream("sc", "st", StreamConfig(ScalingPolicy(auto, 10, 2, 5)))
    assert len(env.model.current_segments("sc", "st")) == 5


async def test_update_with_open_transaction_rescales(env: Env) -> None:
    await make_stream(env, 1)
    await env.model.create_txn("sc", "st", 90_000)
    await env.model.update_stream("sc", "st", fixed(2))
    assert env.model.stream_config("sc", "st").scaling.min_num_segments == 2
    assert len(env.model.current_segments("sc", "st")) == 2


async def test_update_missing_stream_raises_stream_not_found(env: Env) -> None:
    await env.model.create_scope("sc")
    with pytest.raises(StreamNotFound):
        await env.model.update_stream("sc", "nope", fixed(1))
    with pytest.raises(ScopeNotFound):
        await env.model.update_stream("nope", "nope", fixed(1))


async def test_list_streams_of_missing_scope_raises(env: Env) -> None:
    with pytest.raises(ScopeNotFound):
        env.model.list_streams("nope", limit=10)


async def test_seal_stream_seals_segments_and_empties_current(env: Env) -> None:
    await make_stream(env, 2)
    await env.model.seal_stream("sc", "st")
    assert env.model.current_segments("sc", "st") == []
    assert env.model.successors("sc", "st", 0) == []
    assert [s.id for s in env.model.epoch_segments("sc", "st", 0)] == [0, 1]
    for i in range(2):
        assert (await env.store.info(f"sc/st/{i}.#epoch.0")).sealed
    await env.model.seal_stream("sc", "st")  # idempotent


async def test_delete_unsealed_stream_raises_not_sealed(env: Env) -> None:
    await make_stream(env)
    with pytest.raises(StreamNotSealed):
        await env.model.delete_stream("sc", "st")


async def test_delete_sealed_stream_removes_segments_and_record(env: Env) -> None:
    await make_stream(env, 2)
    await env.model.seal_stream("sc", "st")
    await env.model.delete_stream("sc", "st")
    assert not env.model.stream_exists("sc", "st")
    assert not [n for n in await env.store.list_segments() if n.startswith("sc/")]
    with pytest.raises(StreamNotFound):
        await env.model.delete_stream("sc", "st")
    await env.model.delete_scope("sc")


async def test_recreated_stream_starts_empty(env: Env) -> None:
    await make_stream(env)
    await env.store.append("sc/st/0.#epoch.0", b"old")
    await env.model.seal_stream("sc", "st")
    await env.model.delete_stream("sc", "st")
    await env.model.create_stream("sc", "st", fixed(1))
    assert (await env.store.info("sc/st/0.#epoch.0")).length == 0


async def test_create_stream_replaces_an_orphan_segment(env: Env) -> None:
    await env.model.create_scope("sc")
    await env.store.create_segment("sc/st/0.#epoch.0")
    await env.store.append("sc/st/0.#epoch.0", b"orphan")
    await env.model.create_stream("sc", "st", fixed(1))
    assert (await env.store.info("sc/st/0.#epoch.0")).length == 0


# --------------------------------------------------------------------------- segments


async def test_head_segments_start_at_the_store_start_offset(env: Env) -> None:
    await make_stream(env)
    await env.store.append("sc/st/0.#epoch.0", b"0123456789")
    await env.store.truncate("sc/st/0.#epoch.0", 4)
    [head] = await env.model.head_segments("sc", "st")
    assert (head.segment.id, head.offset) == (0, 4)
    [at_zero] = await env.model.segments_at("sc", "st", 0)
    assert at_zero == head


async def test_unknown_segment_has_no_successors_but_an_error(env: Env) -> None:
    await make_stream(env)
    with pytest.raises(SegmentNotInStream):
        env.model.successors("sc", "st", 99)


async def test_epoch_out_of_range_raises(env: Env) -> None:
    await make_stream(env)
    with pytest.raises(InvalidArgument):
        env.model.epoch_segments("sc", "st", 1)


async def test_scale_splits_a_segment_and_links_successors(env: Env) -> None:
    await make_stream(env, 1)
    env.clock.now_ms += 1000
    start_epoch, new = await env.model.scale("sc", "st", [0], [(0.0, 0.5), (0.5, 1.0)])
    assert start_epoch == 0
    assert [s.id for s in new] == [segment_id(1, 1), segment_id(1, 2)]
    assert [s.id for s in env.model.current_segments("sc", "st")] == [s.id for s in new]
    assert (await env.store.info("sc/st/0.#epoch.0")).sealed
    assert "sc/st/1.#epoch.1" in await env.store.list_segments()
    succ = env.model.successors("sc", "st", 0)
    assert [(s.segment.id, s.predecessors) for s in succ] == [
        (segment_id(1, 1), (0,)),
        (segment_id(1, 2), (0,)),
    ]
    assert env.model.successors("sc", "st", segment_id(1, 1)) == []
    assert env.model.is_segment_open("sc", "st", segment_id(1, 2))
    assert not env.model.is_segment_open("sc", "st", 0)
    # The head is still epoch 0; a time after the scale gives epoch 1.
    assert [h.segment.id for h in await env.model.head_segments("sc", "st")] == [0]
    later = await env.model.segments_at("sc", "st", env.clock.now_ms)
    assert [h.segment.id for h in later] == [s.id for s in new]


async def test_scale_merging_two_segments_lists_both_predecessors(env: Env) -> None:
    await make_stream(env, 2)
    _, [merged] = await env.model.scale("sc", "st", [0, 1], [(0.0, 1.0)])
    [succ] = env.model.successors("sc", "st", 1)
    assert succ.segment.id == merged.id
    assert succ.predecessors == (0, 1)


@pytest.mark.parametrize(
    ("sealed", "ranges"),
    [
        ([0], [(0.0, 0.4), (0.5, 1.0)]),  # a gap
        ([0], [(0.0, 0.6), (0.5, 1.0)]),  # an overlap
        ([0], [(0.0, 0.4)]),  # too short
        ([0], []),  # nothing
        ([7], [(0.0, 1.0)]),  # not a segment
        ([0, 0], [(0.0, 1.0)]),  # twice
    ],
)
async def test_scale_with_ranges_that_do_not_fit_fails(
    env: Env, sealed: list[int], ranges: list[tuple[float, float]]
) -> None:
    await make_stream(env, 1)
    with pytest.raises(ScalePreconditionFailed):
        await env.model.scale("sc", "st", sealed, ranges)
    assert [s.id for s in env.model.current_segments("sc", "st")] == [0]


async def test_commit_after_a_scale_rolls_the_transaction_into_new_epochs(env: Env) -> None:
    await make_stream(env, 2)
    await env.store.append("sc/st/0.#epoch.0", b"a0|")
    txn, _ = await env.model.create_txn("sc", "st", 90_000)
    t0, t1 = env.model.txn_segments("sc", "st", txn.txn)
    await env.store.append(t0, b"t0|")
    await env.store.append(t1, b"t1|")
    # The scale does not wait for the open transaction.
    _, new = await env.model.scale("sc", "st", [1], [(0.5, 0.75), (0.75, 1.0)])
    await env.store.append("sc/st/0.#epoch.0", b"a1|")

    await env.model.commit_txn("sc", "st", txn.txn)

    assert env.model.txn_state("sc", "st", txn.txn) is TxnState.COMMITTED
    assert env.model.current_epoch("sc", "st") == 3
    # Epoch 2 copies epoch 0's segments and holds the transaction; sealed.
    copies = env.model.epoch_segments("sc", "st", 2)
    assert [(s.id, s.min_key, s.max_key) for s in copies] == [
        (segment_id(2, 0), 0.0, 0.5),
        (segment_id(2, 1), 0.5, 1.0),
    ]
    for seg, data in zip(copies, (b"t0|", b"t1|"), strict=True):
        name = segment_name("sc", "st", seg.id)
        assert (await env.store.read(name, 0, 100)).data == data
        assert (await env.store.info(name)).sealed
    # Epoch 3 copies epoch 1's segments and is the active one.
    assert [s.id for s in env.model.current_segments("sc", "st")] == [
        segment_id(3, 0),
        segment_id(3, 2),
        segment_id(3, 3),
    ]
    for sid in (0, new[0].id, new[1].id):
        assert (await env.store.info(segment_name("sc", "st", sid))).sealed
    # Readers go from epoch 1 through the transaction's events to epoch 3.
    assert [s.segment.id for s in env.model.successors("sc", "st", 0)] == [segment_id(2, 0)]
    [(after_new)] = env.model.successors("sc", "st", new[0].id)
    assert after_new.segment.id == segment_id(2, 1)
    assert after_new.predecessors == (new[0].id, new[1].id)
    assert [s.segment.id for s in env.model.successors("sc", "st", segment_id(2, 1))] == [
        segment_id(3, 2),
        segment_id(3, 3),
    ]
    for name in (t0, t1):
        with pytest.raises(SegmentNotFound):
            await env.store.info(name)
    # A transaction of the current epoch merges straight into its parents.
    later, _ = await env.model.create_txn("sc", "st", 90_000)
    await env.model.commit_txn("sc", "st", later.txn)
    assert env.model.current_epoch("sc", "st") == 3
    await env.restart()
    assert env.model.current_epoch("sc", "st") == 3
    assert env.model.txn_state("sc", "st", txn.txn) is TxnState.COMMITTED


async def test_commits_arriving_together_share_one_rolling_commit(env: Env) -> None:
    await make_stream(env, 1)
    txns = [(await env.model.create_txn("sc", "st", 90_000))[0].txn for _ in range(3)]
    for i, txn in enumerate(txns):
        [seg] = env.model.txn_segments("sc", "st", txn)
        await env.store.append(seg, f"t{i}|".encode())
    await env.model.scale("sc", "st", [0], [(0.0, 0.5), (0.5, 1.0)])
    await asyncio.gather(*(env.model.commit_txn("sc", "st", t) for t in txns))
    assert env.model.current_epoch("sc", "st") == 3  # one roll: epochs 2 and 3
    [copy] = env.model.epoch_segments("sc", "st", 2)
    data = (await env.store.read(segment_name("sc", "st", copy.id), 0, 100)).data
    assert sorted(data.split(b"|")[:-1]) == [b"t0", b"t1", b"t2"]


async def test_stream_cut_validity(env: Env) -> None:
    await make_stream(env, 2)
    assert env.model.is_stream_cut_valid("sc", "st", {0: 0, 1: 10})
    assert not env.model.is_stream_cut_valid("sc", "st", {0: 0})  # a hole
    assert not env.model.is_stream_cut_valid("sc", "st", {0: 0, 1: -1})
    assert not env.model.is_stream_cut_valid("sc", "st", {0: 0, 5: 0})
    assert not env.model.is_stream_cut_valid("sc", "nope", {0: 0})


async def test_truncate_stream_moves_start_and_deletes_older_segments(env: Env) -> None:
    await make_stream(env, 1)
    await env.store.append("sc/st/0.#epoch.0", b"old")
    _, new = await env.model.scale("sc", "st", [0], [(0.0, 0.5), (0.5, 1.0)])
    a, b = (s.id for s in new)
    await env.store.append(segment_name("sc", "st", a), b"abcdef")
    assert [s.id for s in env.model.segments_between("sc", "st", {}, {})] == [0, a, b]
    await env.model.truncate_stream("sc", "st", {a: 2, b: 0})
    assert "sc/st/0.#epoch.0" not in await env.store.list_segments()
    assert (await env.store.info(segment_name("sc", "st", a))).start_offset == 2
    heads = await env.model.head_segments("sc", "st")
    assert [(h.segment.id, h.offset) for h in heads] == [(a, 2), (b, 0)]
    assert [s.id for s in env.model.segments_between("sc", "st", {}, {})] == [a, b]


async def test_truncate_beyond_length_is_invalid(env: Env) -> None:
    await make_stream(env, 1)
    with pytest.raises(InvalidArgument):
        await env.model.truncate_stream("sc", "st", {0: 5})


# --------------------------------------------------------------------------- transactions


async def test_create_txn_makes_one_segment_per_active_segment(env: Env) -> None:
    await make_stream(env, 2)
    txn, segs = await env.model.create_txn("sc", "st", 90_000)
    assert [s.id for s in segs] == [0, 1]
    assert txn.txn.low_bits >= 0
    assert txn.txn.epoch == 0
    names = env.model.txn_segments("sc", "st", txn.txn)
    assert names == [
        f"sc/st/0.#epoch.0#transaction.{txn.txn.hex}",
        f"sc/st/1.#epoch.0#transaction.{txn.txn.hex}",
    ]
    stored = await env.store.list_segments()
    assert all(n in stored for n in names)
    second, _ = await env.model.create_txn("sc", "st", 90_000)
    assert second.txn != txn.txn
    assert env.model.txn_state("sc", "st", txn.txn) is TxnState.OPEN


async def test_commit_merges_transaction_data_contiguously(env: Env) -> None:
    await make_stream(env, 1)
    txn, _ = await env.model.create_txn("sc", "st", 90_000)
    [txn_seg] = env.model.txn_segments("sc", "st", txn.txn)
    await env.store.append("sc/st/0.#epoch.0", b"before|")
    await env.store.append(txn_seg, b"t1|")
    await env.store.append(txn_seg, b"t2|")
    await env.store.append("sc/st/0.#epoch.0", b"after|")
    await env.model.commit_txn("sc", "st", txn.txn, writer_id="7", timestamp=-(2**63))
    data = (await env.store.read("sc/st/0.#epoch.0", 0, 1000)).data
    assert data == b"before|after|t1|t2|"
    assert txn_seg not in await env.store.list_segments()
    assert env.model.txn_state("sc", "st", txn.txn) is TxnState.COMMITTED
    await env.model.commit_txn("sc", "st", txn.txn)  # idempotent
    with pytest.raises(TxnNotOpen):
        await env.model.abort_txn("sc", "st", txn.txn)


async def test_abort_seals_transaction_segments_and_sweep_deletes_them_later(env: Env) -> None:
    await make_stream(env, 1)
    txn, _ = await env.model.create_txn("sc", "st", 90_000)
    [txn_seg] = env.model.txn_segments("sc", "st", txn.txn)
    await env.store.append(txn_seg, b"never")
    await env.model.abort_txn("sc", "st", txn.txn)
    # Sealed, not deleted: a writer racing the abort gets SegmentIsSealed.
    assert (await env.store.info(txn_seg)).sealed
    with pytest.raises(SegmentSealed):
        await env.store.append(txn_seg, b"late")
    assert (await env.store.info("sc/st/0.#epoch.0")).length == 0
    assert env.model.txn_state("sc", "st", txn.txn) is TxnState.ABORTED
    await env.model.abort_txn("sc", "st", txn.txn)  # idempotent
    with pytest.raises(TxnNotOpen):
        await env.model.commit_txn("sc", "st", txn.txn)
    env.clock.now_ms += ABORTED_SEGMENT_GRACE_MS - 1
    assert (await env.model.sweep()).aborted_segments_deleted == 0
    assert txn_seg in await env.store.list_segments()
    env.clock.now_ms += 1
    assert (await env.model.sweep()).aborted_segments_deleted == 1
    assert txn_seg not in await env.store.list_segments()
    assert (await env.model.sweep()).aborted_segments_deleted == 0  # done once
    assert env.model.txn_state("sc", "st", txn.txn) is TxnState.ABORTED


async def test_aborted_segments_are_deleted_after_a_restart(env: Env) -> None:
    await make_stream(env, 2)
    txn, _ = await env.model.create_txn("sc", "st", 90_000)
    segs = env.model.txn_segments("sc", "st", txn.txn)
    await env.model.abort_txn("sc", "st", txn.txn)
    await env.restart()
    assert set(segs) <= set(await env.store.list_segments())
    env.clock.now_ms += ABORTED_SEGMENT_GRACE_MS
    assert (await env.model.sweep()).aborted_segments_deleted == 1
    assert not set(segs) & set(await env.store.list_segments())


async def test_delete_stream_deletes_segments_of_aborted_transactions(env: Env) -> None:
    await make_stream(env, 1)
    txn, _ = await env.model.create_txn("sc", "st", 90_000)
    [txn_seg] = env.model.txn_segments("sc", "st", txn.txn)
    await env.model.abort_txn("sc", "st", txn.txn)
    await env.model.seal_stream("sc", "st")
    await env.model.delete_stream("sc", "st")
    assert txn_seg not in await env.store.list_segments()


async def test_sweep_deletes_idle_transient_segments_only(env: Env) -> None:
    await make_stream(env, 1)
    parent = "sc/st/0.#epoch.0"
    stale = f"{parent}#transient.{'a' * 32}.{'b' * 32}"
    await env.store.create_segment(stale)
    await env.store.append(stale, b"half of a large event")
    modified_ms = (await env.store.info(stale)).last_modified_ms
    env.clock.now_ms = modified_ms + TRANSIENT_SEGMENT_MAX_IDLE_MS - 1
    assert (await env.model.sweep()).transients_deleted == 0
    await env.restart()  # the store's segment list is the record: nothing to persist
    env.clock.now_ms = modified_ms + TRANSIENT_SEGMENT_MAX_IDLE_MS
    assert (await env.model.sweep()).transients_deleted == 1
    names = await env.store.list_segments()
    assert stale not in names and parent in names


async def test_unknown_transaction_raises_txn_not_found(env: Env) -> None:
    await make_stream(env, 1)
    with pytest.raises(TxnNotFound):
        env.model.txn_state("sc", "st", TxnId(0, 12345))
    with pytest.raises(TxnNotFound):
        await env.model.commit_txn("sc", "st", TxnId(0, 12345))


async def test_txn_on_sealed_stream_raises(env: Env) -> None:
    await make_stream(env, 1)
    await env.model.seal_stream("sc", "st")
    with pytest.raises(StreamSealed):
        await env.model.create_txn("sc", "st", 90_000)


async def test_lease_limits(env: Env) -> None:
    await make_stream(env, 1)
    with pytest.raises(LeaseTooLarge):
        await env.model.create_txn("sc", "st", MAX_TXN_LEASE_MS + 1)
    with pytest.raises(InvalidArgument):
        await env.model.create_txn("sc", "st", 0)
    txn, _ = await env.model.create_txn("sc", "st", 90_000)
    with pytest.raises(LeaseTooLarge):
        env.model.ping_txn("sc", "st", txn.txn, MAX_TXN_LEASE_MS + 1)


async def test_sweep_aborts_only_after_the_lease_slack(env: Env) -> None:
    await make_stream(env, 1)
    txn, _ = await env.model.create_txn("sc", "st", 90_000)
    env.clock.now_ms += 90_000 + 1  # one lease: the pinger may still be asleep
    assert (await env.model.sweep()).aborted == 0
    assert env.model.ping_txn("sc", "st", txn.txn, 90_000) is TxnState.OPEN
    env.clock.now_ms += LEASE_SLACK_FACTOR * 90_000 - 1
    assert (await env.model.sweep()).aborted == 0
    env.clock.now_ms += 1
    assert (await env.model.sweep()).aborted == 1
    assert env.model.txn_state("sc", "st", txn.txn) is TxnState.ABORTED
    assert env.model.ping_txn("sc", "st", txn.txn, 90_000) is TxnState.ABORTED
    env.clock.now_ms += COMPLETED_TXN_KEEP_MS
    assert (await env.model.sweep()).purged == 1
    with pytest.raises(TxnNotFound):
        env.model.txn_state("sc", "st", txn.txn)


async def test_seal_stream_aborts_open_transactions(env: Env) -> None:
    await make_stream(env, 1)
    txn, _ = await env.model.create_txn("sc", "st", 90_000)
    await env.model.seal_stream("sc", "st")
    assert env.model.txn_state("sc", "st", txn.txn) is TxnState.ABORTED


async def test_delete_stream_removes_its_transactions(env: Env) -> None:
    await make_stream(env, 1)
    txn, _ = await env.model.create_txn("sc", "st", 90_000)
    await env.model.seal_stream("sc", "st")
    await env.model.delete_stream("sc", "st")
    await env.model.create_stream("sc", "st", fixed(1))
    with pytest.raises(TxnNotFound):
        env.model.txn_state("sc", "st", txn.txn)


# --------------------------------------------------------------------------- restarts


async def test_metadata_survives_a_restart(env: Env) -> None:
    await env.model.create_scope("sc")
    await env.model.create_stream("sc", "st", fixed(2, ("t",)))
    await env.model.create_stream("sc", "sealed", fixed(1))
    await env.model.seal_stream("sc", "sealed")
    _, new = await env.model.scale("sc", "st", [0], [(0.0, 0.25), (0.25, 0.5)])
    open_txn, _ = await env.model.create_txn("sc", "st", 90_000)
    done_txn, _ = await env.model.create_txn("sc", "st", 90_000)
    await env.model.commit_txn("sc", "st", done_txn.txn)
    before = env.model.current_segments("sc", "st")

    await env.restart()

    assert env.model.list_scopes(limit=10) == ["sc"]
    assert env.model.list_streams("sc", limit=10) == ["sealed", "st"]
    assert env.model.stream_config("sc", "st").tags == ("t",)
    assert env.model.current_segments("sc", "st") == before
    assert env.model.current_segments("sc", "sealed") == []
    assert env.model.txn_state("sc", "st", open_txn.txn) is TxnState.OPEN
    assert env.model.txn_state("sc", "st", done_txn.txn) is TxnState.COMMITTED
    third, _ = await env.model.create_txn("sc", "st", 90_000)
    assert third.txn not in (open_txn.txn, done_txn.txn)
    assert [s.segment.id for s in env.model.successors("sc", "st", 0)] == [s.id for s in new]


class FailingMerge:
    """A store whose merges fail: a crash in the middle of a commit."""

    def __init__(self, inner: SegmentStore) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def merge(self, target: str, source: str) -> int:
        raise OSError("injected: the process dies here")


async def test_restart_finishes_an_interrupted_commit(env: Env) -> None:
    await make_stream(env, 1)
    txn, _ = await env.model.create_txn("sc", "st", 90_000)
    [txn_seg] = env.model.txn_segments("sc", "st", txn.txn)
    await env.store.append(txn_seg, b"payload")
    broken = await ControllerModel.open(FailingMerge(env.store), clock_ms=env.clock)  # type: ignore[arg-type]
    with pytest.raises(OSError, match="injected"):
        await broken.commit_txn("sc", "st", txn.txn)
    assert broken.txn_state("sc", "st", txn.txn) is TxnState.COMMITTING

    await env.restart()

    assert env.model.txn_state("sc", "st", txn.txn) is TxnState.COMMITTED
    assert (await env.store.read("sc/st/0.#epoch.0", 0, 100)).data == b"payload"
    with pytest.raises(SegmentNotFound):
        await env.store.info(txn_seg)


class FailingStreamSave:
    """A store that fails the first write of a stream record holding no rolling
    commit: a crash in the middle of a rolling commit, before its epochs are recorded."""

    def __init__(self, inner: SegmentStore) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def update_table(self, table: str, updates: list[Any], *args: Any) -> Any:
        if table == STREAMS_TABLE and b'"rolling"' not in updates[0].value:
            raise OSError("injected: the process dies here")
        return await self._inner.update_table(table, updates, *args)


class FailingCommittedSave:
    """A store that fails recording a transaction ``committed``: a crash after a
    rolling commit recorded its epochs."""

    def __init__(self, inner: SegmentStore) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def update_table(self, table: str, updates: list[Any], *args: Any) -> Any:
        if table == TRANSACTIONS_TABLE and b'"committed"' in updates[0].value:
            raise OSError("injected: the process dies here")
        return await self._inner.update_table(table, updates, *args)


@pytest.mark.parametrize("failing", [FailingStreamSave, FailingCommittedSave])
async def test_restart_finishes_an_interrupted_rolling_commit(env: Env, failing: type) -> None:
    await make_stream(env, 1)
    txn, _ = await env.model.create_txn("sc", "st", 90_000)
    [txn_seg] = env.model.txn_segments("sc", "st", txn.txn)
    await env.store.append(txn_seg, b"payload")
    await env.model.scale("sc", "st", [0], [(0.0, 0.5), (0.5, 1.0)])
    broken = await ControllerModel.open(failing(env.store), clock_ms=env.clock)
    with pytest.raises(OSError, match="injected"):
        await broken.commit_txn("sc", "st", txn.txn)
    assert broken.txn_state("sc", "st", txn.txn) is TxnState.COMMITTING

    await env.restart()

    assert env.model.txn_state("sc", "st", txn.txn) is TxnState.COMMITTED
    assert env.model.current_epoch("sc", "st") == 3
    copy = segment_name("sc", "st", segment_id(2, 0))
    assert (await env.store.read(copy, 0, 100)).data == b"payload"
    assert (await env.store.info(copy)).sealed
    assert all(s.created_epoch == 3 for s in env.model.current_segments("sc", "st"))


# --------------------------------------------------------------------------- key-value tables


async def test_key_value_table_lifecycle(env: Env) -> None:
    await env.model.create_scope("sc")
    config = KeyValueTableConfig(partition_count=3, primary_key_length=4, secondary_key_length=2)
    await env.model.create_kvtable("sc", "kv", config)
    with pytest.raises(TableExists):
        await env.model.create_kvtable("sc", "kv", config)
    names = [f"sc/kv_kvtable/{n}.#epoch.0" for n in range(3)]
    for name in names:
        assert (await env.store.table_info(name)).length == 0
    parts = env.model.kvtable_partitions("sc", "kv")
    assert [(p.id, p.min_key, p.max_key) for p in parts] == [
        (0, 0.0, 1 / 3),
        (1, 1 / 3, 2 / 3),
        (2, 2 / 3, 1.0),
    ]
    with pytest.raises(ScopeNotEmpty):
        await env.model.delete_scope("sc")
    await env.restart()
    assert env.model.kvtable_config("sc", "kv") == config
    assert env.model.list_kvtables("sc", limit=10) == ["kv"]
    await env.model.delete_kvtable("sc", "kv")
    assert env.model.list_kvtables("sc", limit=10) == []
    for name in names:
        with pytest.raises(SegmentNotFound):
            await env.store.table_info(name)
    with pytest.raises(TableNotFound):
        await env.model.delete_kvtable("sc", "kv")
    await env.model.delete_scope("sc")


@pytest.mark.parametrize(
    "config",
    [
        KeyValueTableConfig(partition_count=0),
        KeyValueTableConfig(partition_count=MAX_TABLE_PARTITIONS + 1),
        KeyValueTableConfig(primary_key_length=0),
        KeyValueTableConfig(secondary_key_length=-1),
        KeyValueTableConfig(primary_key_length=8192, secondary_key_length=1),
        KeyValueTableConfig(rollover_size_bytes=-1),
    ],
)
async def test_key_value_table_shapes_java_refuses_are_refused(
    env: Env, config: KeyValueTableConfig
) -> None:
    await env.model.create_scope("sc")
    with pytest.raises(InvalidArgument):
        await env.model.create_kvtable("sc", "kv", config)
    with pytest.raises(InvalidName):
        await env.model.create_kvtable("sc", "_kv", KeyValueTableConfig())
    assert env.model.list_kvtables("sc", limit=10) == []


# --------------------------------------------------------------------------- retention


async def make_retained_stream(env: Env, kind: RetentionType, param: int) -> None:
    await env.model.create_scope("sc")
    cfg = StreamConfig(
        scaling=ScalingPolicy(min_num_segments=1),
        retention=RetentionPolicy(kind, param),
    )
    await env.model.create_stream("sc", "st", cfg)


async def tick(env: Env, ms: int = 1000) -> int:
    env.clock.now_ms += ms
    return await env.model.enforce_retention()


async def test_size_retention_truncates_at_a_recorded_cut(env: Env) -> None:
    await make_retained_stream(env, RetentionType.SIZE, 10)
    seg = "sc/st/0.#epoch.0"
    await env.store.append(seg, b"event-1|")
    assert await tick(env) == 0  # cut at 8; 8 bytes are under the limit
    await env.store.append(seg, b"event-2|")
    assert await tick(env) == 0  # cut at 16; no cut keeps 10 bytes after it yet
    await env.store.append(seg, b"event-3|")
    assert await tick(env) == 1  # cut at 8 keeps 16 bytes: truncate there
    assert (await env.store.info(seg)).start_offset == 8
    [head] = await env.model.head_segments("sc", "st")
    assert head.offset == 8
    assert [c.cut for c in env.model.retention_cuts("sc", "st")] == [{0: 16}, {0: 24}]
    assert await tick(env) == 0  # nothing more to do


async def test_time_retention_truncates_cuts_older_than_the_window(env: Env) -> None:
    await make_retained_stream(env, RetentionType.TIME, 60_000)
    seg = "sc/st/0.#epoch.0"
    await env.store.append(seg, b"old|")
    assert await tick(env) == 0  # cut at 4
    await env.store.append(seg, b"new|")
    assert await tick(env, 30_000) == 0  # cut at 8, the first one is 30 s old
    assert await tick(env, 30_000) == 1  # the first cut is now 60 s old
    assert (await env.store.info(seg)).start_offset == 4


async def test_no_retention_policy_records_nothing(env: Env) -> None:
    await make_stream(env, 1)
    await env.store.append("sc/st/0.#epoch.0", b"x" * 100)
    assert await tick(env) == 0
    assert env.model.retention_cuts("sc", "st") == []


async def test_size_retention_deletes_segments_replaced_by_a_scale(env: Env) -> None:
    await make_retained_stream(env, RetentionType.SIZE, 15)
    await env.store.append("sc/st/0.#epoch.0", b"0123456789")
    await tick(env)  # cut {0: 10}
    _, new = await env.model.scale("sc", "st", [0], [(0.0, 0.5), (0.5, 1.0)])
    names = [segment_name("sc", "st", s.id) for s in new]
    for name in names:
        await env.store.append(name, b"abcdefghij")
    assert await tick(env) == 1  # 30 bytes; the cut {0: 10} keeps 20
    assert (await env.store.info("sc/st/0.#epoch.0")).start_offset == 10
    for name in names:
        await env.store.append(name, b"klmnopqrst")
    assert await tick(env) == 1  # 40 bytes; the cut at the scale keeps 20
    assert "sc/st/0.#epoch.0" not in await env.store.list_segments()
    heads = await env.model.head_segments("sc", "st")
    assert [(h.segment.id, h.offset) for h in heads] == [(s.id, 10) for s in new]


async def test_retention_cuts_are_thinned_not_unbounded(env: Env) -> None:
    await make_retained_stream(env, RetentionType.SIZE, 10**12)
    for _ in range(MAX_RETENTION_CUTS + 5):
        await tick(env)
    cuts = env.model.retention_cuts("sc", "st")
    assert len(cuts) <= MAX_RETENTION_CUTS
    times = [c.time_ms for c in cuts]
    assert times == sorted(times)
    assert times[-1] == env.clock.now_ms


async def test_retention_cuts_survive_a_restart(env: Env) -> None:
    await make_retained_stream(env, RetentionType.SIZE, 10**12)
    await env.store.append("sc/st/0.#epoch.0", b"abc")
    await tick(env)
    await tick(env)
    before = env.model.retention_cuts("sc", "st")
    await env.restart()
    assert env.model.retention_cuts("sc", "st") == before


async def test_delete_stream_drops_its_retention_cuts(env: Env) -> None:
    await make_retained_stream(env, RetentionType.SIZE, 10**12)
    await tick(env)
    await env.model.seal_stream("sc", "st")
    await env.model.delete_stream("sc", "st")
    await env.model.create_stream("sc", "st", fixed(1))
    assert env.model.retention_cuts("sc", "st") == []


class FailingTruncate(FailingMerge):
    """A store whose truncations fail: a crash in the middle of a truncation."""

    async def truncate(self, name: str, offset: int) -> None:
        raise OSError("injected: the process dies here")


async def test_restart_finishes_an_interrupted_truncation(env: Env) -> None:
    await make_stream(env, 1)
    await env.store.append("sc/st/0.#epoch.0", b"0123456789")
    broken = await ControllerModel.open(FailingTruncate(env.store), clock_ms=env.clock)  # type: ignore[arg-type]
    with pytest.raises(OSError, match="injected"):
        await broken.truncate_stream("sc", "st", {0: 6})
    assert (await env.store.info("sc/st/0.#epoch.0")).start_offset == 0

    await env.restart()

    assert (await env.store.info("sc/st/0.#epoch.0")).start_offset == 6
    [head] = await env.model.head_segments("sc", "st")
    assert head.offset == 6


# --------------------------------------------------------------------------- auto-scaling


async def make_auto_stream(env: Env, kind: ScalingType, target: int, count: int = 1) -> None:
    await env.model.create_scope("sc")
    policy = ScalingPolicy(kind, target, 2, count)
    await env.model.create_stream("sc", "st", StreamConfig(scaling=policy))


async def sample(env: Env) -> int:
    env.clock.now_ms += 1000
    return await env.model.auto_scale()


async def test_data_rate_above_target_splits_after_sustained_load(env: Env) -> None:
    await make_auto_stream(env, ScalingType.BY_RATE_IN_KBYTES_PER_SEC, 1)  # 1 KiB/s
    assert await sample(env) == 0  # the baseline
    for _ in range(AUTO_SCALE_HOT_SAMPLES - 1):
        await env.store.append("sc/st/0.#epoch.0", b"x" * 4096)
        assert await sample(env) == 0
    assert env.model.segment_loads("sc", "st") == {0: 4096.0}
    await env.store.append("sc/st/0.#epoch.0", b"x" * 4096)
    assert await sample(env) == 1
    segs = env.model.current_segments("sc", "st")
    assert [(s.min_key, s.max_key) for s in segs] == [(0.0, 0.5), (0.5, 1.0)]


async def test_event_rate_counts_writer_event_numbers(env: Env) -> None:
    await make_auto_stream(env, ScalingType.BY_RATE_IN_EVENTS_PER_SEC, 5)
    writer = uuid4()
    number = 0
    await sample(env)
    for _ in range(AUTO_SCALE_HOT_SAMPLES):
        number += 10  # ten events a second, over the target of five
        await env.store.append(
            "sc/st/0.#epoch.0", b"e", writer=WriterAppend(writer, event_number=number)
        )
        scaled = await sample(env)
    assert scaled == 1
    assert len(env.model.current_segments("sc", "st")) == 2


async def test_a_burst_does_not_split(env: Env) -> None:
    await make_auto_stream(env, ScalingType.BY_RATE_IN_KBYTES_PER_SEC, 1)
    await sample(env)
    await env.store.append("sc/st/0.#epoch.0", b"x" * 100_000)
    for _ in range(AUTO_SCALE_HOT_SAMPLES + 2):
        assert await sample(env) == 0
    assert len(env.model.current_segments("sc", "st")) == 1


async def test_cold_neighbours_merge_but_not_below_the_minimum(env: Env) -> None:
    await make_auto_stream(env, ScalingType.BY_RATE_IN_KBYTES_PER_SEC, 1, count=3)
    policy = ScalingPolicy(ScalingType.BY_RATE_IN_KBYTES_PER_SEC, 1, 2, 2)
    await env.model.update_stream("sc", "st", StreamConfig(scaling=policy))
    scaled = 0
    for _ in range(3 * AUTO_SCALE_COLD_SAMPLES):
        scaled += await sample(env)
    assert scaled == 1
    segs = env.model.current_segments("sc", "st")
    assert len(segs) == 2
    assert segs[0].min_key == 0.0 and segs[-1].max_key == 1.0


async def test_open_transaction_does_not_hold_back_auto_scaling(env: Env) -> None:
    await make_auto_stream(env, ScalingType.BY_RATE_IN_KBYTES_PER_SEC, 1)
    await env.model.create_txn("sc", "st", 90_000)
    await sample(env)
    for _ in range(AUTO_SCALE_HOT_SAMPLES):
        await env.store.append("sc/st/0.#epoch.0", b"x" * 4096)
        scaled = await sample(env)
    assert scaled == 1


async def test_fixed_streams_are_not_sampled(env: Env) -> None:
    await make_stream(env, 1)
    await env.store.append("sc/st/0.#epoch.0", b"x" * 100_000)
    await sample(env)
    assert env.model.segment_loads("sc", "st") == {}
