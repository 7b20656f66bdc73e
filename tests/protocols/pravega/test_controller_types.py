"""The controller API's value types: one vocabulary for the client and the controller."""

from __future__ import annotations

import pytest

from headrace import client
from headrace.client import errors as client_errors
from headrace.controller import errors as controller_errors
from headrace.controller import naming, records
from headrace.errors import ControllerError
from headrace.protocols.pravega import controller as api
from headrace.protocols.pravega import controller_pb2 as pb


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (api.ScalingType, pb.ScalingPolicy.ScalingPolicyType),
        (api.RetentionType, pb.RetentionPolicy.RetentionPolicyType),
        (api.TxnState, pb.TxnState.State),
    ],
)
def test_enums_have_the_messages_names_and_values(ours: type, theirs: object) -> None:
    assert {m.name: m.value for m in ours} == dict(theirs.items())  # type: ignore[attr-defined]


def test_client_and_controller_import_the_same_classes() -> None:
    for name in ("ScalingPolicy", "RetentionPolicy", "StreamConfig", "TxnId", "TxnState"):
        assert getattr(client, name) is getattr(api, name)
    for name in ("ScalingPolicy", "RetentionPolicy", "StreamConfig", "TxnState"):
        assert getattr(records, name) is getattr(api, name)
    assert naming.TxnId is api.TxnId
    assert client_errors.ControllerError is ControllerError
    assert controller_errors.ControllerError is ControllerError
    assert issubclass(controller_errors.StreamNotFound, ControllerError)


def test_stream_config_round_trips_through_its_message() -> None:
    config = api.StreamConfig(
        api.ScalingPolicy(api.ScalingType.BY_RATE_IN_EVENTS_PER_SEC, 100, 2, 3),
        api.RetentionPolicy(api.RetentionType.SIZE, 1 << 20, 1 << 30),
        ("a", "b"),
    )
    msg = api.config_to_proto("sc", "st", config)
    assert (msg.streamInfo.scope, msg.streamInfo.stream) == ("sc", "st")
    assert msg.retentionPolicy.retentionParam == 1 << 20
    assert api.config_from_proto(pb.StreamConfig.FromString(msg.SerializeToString())) == config


def test_no_tags_and_no_retention_policy_read_as_defaults() -> None:
    msg = api.config_to_proto("sc", "st", api.StreamConfig(api.ScalingPolicy.fixed(2)))
    assert not msg.HasField("tags")
    msg.ClearField("retentionPolicy")
    config = api.config_from_proto(msg)
    assert config == api.StreamConfig(api.ScalingPolicy.fixed(2))
    assert config.retention.retention_max == api.INT64_MAX


def test_an_unknown_policy_type_is_a_value_error() -> None:
    msg = pb.StreamConfig(scalingPolicy=pb.ScalingPolicy(scaleType=7))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        api.config_from_proto(msg)


def test_txn_id_round_trips_and_names_its_segment() -> None:
    txn = api.TxnId(-1, 5)
    assert api.txn_id_from_proto(api.txn_id_to_proto(txn)) == txn
    parent = api.Segment("sc", "st", api.segment_id(1, 4))
    assert parent.name == "sc/st/4.#epoch.1"
    assert api.Segment.parse(parent.name) == parent
    assert txn.segment_name(parent) == (
        "sc/st/4.#epoch.1#transaction.ffffffffffffffff0000000000000005"
    )
