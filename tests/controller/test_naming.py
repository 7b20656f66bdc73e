"""Segment ids and names, transaction ids and names: Pravega's rules
(pravega-controller.md#naming)."""

from __future__ import annotations

import pytest

from headrace.controller.naming import (
    TxnId,
    is_valid_name,
    is_valid_token_stream,
    segment_epoch,
    segment_id,
    segment_name,
    segment_number,
    transaction_segment_name,
)


def test_segment_id_packs_epoch_high_and_number_low() -> None:
    assert segment_id(0, 3) == 3
    assert segment_id(2, 5) == (2 << 32) | 5
    assert segment_epoch(segment_id(7, 9)) == 7
    assert segment_number(segment_id(7, 9)) == 9


def test_segment_name_uses_number_and_creation_epoch() -> None:
    assert segment_name("sc", "st", 0) == "sc/st/0.#epoch.0"
    assert segment_name("sc", "st", segment_id(1, 4)) == "sc/st/4.#epoch.1"


def test_transaction_segment_name_matches_the_captured_example() -> None:
    txn = TxnId(0x1234, 0xBADC0FFEE)
    assert (
        transaction_segment_name("sc2/tx/0.#epoch.0", txn)
        == "sc2/tx/0.#epoch.0#transaction.00000000000012340000000badc0ffee"
    )


def test_transaction_hex_is_twos_complement_of_each_half() -> None:
    assert TxnId(-1, 5).hex == "ffffffffffffffff0000000000000005"


def test_new_txn_id_has_epoch_in_high_bits_and_non_negative_low_bits() -> None:
    txn = TxnId.new(epoch=3, counter=42)
    assert txn.high_bits == 3 << 32
    assert txn.low_bits == 42
    assert txn.epoch == 3


@pytest.mark.parametrize("name", ["a", "Scope-1.x", "0", "a" * 255])
def test_valid_names(name: str) -> None:
    assert is_valid_name(name)


@pytest.mark.parametrize("name", ["", "a/b", "_system", "a_b", "sp ace", "é", "a" * 256, "a#b"])
def test_invalid_names(name: str) -> None:
    assert not is_valid_name(name)


@pytest.mark.parametrize(
    "name",
    ["T", "a" * 255, "rg_kvtable", "my_group_kvtable", "g.1-x_hrgroup", "a_b_hrgroup", "_hrgroups"],
)
def test_valid_token_streams(name: str) -> None:
    assert is_valid_token_stream(name)


def test_the_group_index_is_the_clients() -> None:
    from headrace.client.reader import group_index_name
    from headrace.controller.naming import GROUP_INDEX_STREAM

    assert group_index_name("sc") == f"sc/{GROUP_INDEX_STREAM}/0.#epoch.0"


@pytest.mark.parametrize(
    "name",
    ["", "*", "T*", "*_kvtable", "_kvtable", "__kvtable", "a/b_kvtable", "T/x", "a_b", "_system",
     "x_kvtable_", "a" * 248 + "_kvtable"],
)  # fmt: skip
def test_invalid_token_streams(name: str) -> None:
    assert not is_valid_token_stream(name)
