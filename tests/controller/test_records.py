"""The controller's stored records keep their form with the shared vocabulary."""

from __future__ import annotations

import json

from headrace.controller.records import TxnRecord, decode_txn, encode_txn
from headrace.protocols.pravega.controller import TxnId, TxnState


def test_a_transaction_state_is_stored_by_its_lower_case_name() -> None:
    record = TxnRecord(TxnId.new(1, 7), 1, (4,), TxnState.COMMITTING, 90_000, 5)
    stored = encode_txn(record)
    assert json.loads(stored)["state"] == "committing"
    assert decode_txn(stored) == record


def test_a_stored_open_transaction_loads_as_open() -> None:
    stored = b'{"high":4294967296,"low":7,"epoch":1,"parents":[4],"state":"open"}'
    assert decode_txn(stored).state is TxnState.OPEN
