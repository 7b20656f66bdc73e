"""The transition tables and the demand window on their own, and the generated diagram."""

from __future__ import annotations

import enum
import importlib.util
from pathlib import Path

import pytest

from headrace.protocols.rsio import MAX_DEMAND, DemandWindow, ReactiveConnection, Role
from headrace.protocols.rsio.states import (
    CONNECTION_ON_PROTOCOL_ERROR,
    CONNECTION_TRANSITIONS,
    PUBLISHER_TRANSITIONS,
    SUBSCRIBER_TRANSITIONS,
    Action,
    ConnectionState,
    PublisherInput,
    PublisherState,
    SubscriberInput,
    SubscriberState,
)

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "rsio_state_diagram.py"

# --------------------------------------------------------------------------- DemandWindow


def test_demand_window_starts_at_initial_demand() -> None:
    assert DemandWindow(3).outstanding == 3
    assert DemandWindow().outstanding == 0


def test_demand_window_adds_requests() -> None:
    window = DemandWindow(1)
    window.request(2)
    assert window.outstanding == 3
    assert not window.unbounded


def test_demand_window_consumes() -> None:
    window = DemandWindow(3)
    assert window.can_consume(3)
    assert not window.can_consume(4)
    window.consume(2)
    assert window.outstanding == 1


def test_demand_window_saturates_at_max() -> None:
    window = DemandWindow(MAX_DEMAND - 1)
    window.request(MAX_DEMAND)
    assert window.outstanding == MAX_DEMAND
    assert window.unbounded
    assert repr(window) == "DemandWindow(unbounded)"


def test_demand_window_unbounded_is_sticky() -> None:
    window = DemandWindow(MAX_DEMAND)
    window.consume(10)
    assert window.unbounded


def test_demand_window_repr_shows_the_count() -> None:
    assert repr(DemandWindow(5)) == "DemandWindow(5)"


@pytest.mark.parametrize(
    ("demand", "legal_request", "legal_initial"),
    [
        (-1, False, False),
        (0, False, True),
        (1, True, True),
        (MAX_DEMAND, True, True),
        (MAX_DEMAND + 1, False, False),
    ],
)
def test_demand_legality(demand: int, legal_request: bool, legal_initial: bool) -> None:
    assert DemandWindow.is_legal_request(demand) is legal_request
    assert DemandWindow.is_legal_initial_demand(demand) is legal_initial


# --------------------------------------------------------------------------- tables


def test_every_received_publisher_message_has_a_subscriber_transition() -> None:
    receives = [i for i in SubscriberInput if i.name.startswith("RECV_")]
    for state in SubscriberState:
        for step_input in receives:
            assert (state, step_input) in SUBSCRIBER_TRANSITIONS, (state, step_input)


def test_every_received_subscriber_message_has_a_publisher_transition() -> None:
    for state in PublisherState:
        for step_input in (PublisherInput.RECV_REQUEST, PublisherInput.RECV_CANCEL):
            assert (state, step_input) in PUBLISHER_TRANSITIONS, (state, step_input)


def test_only_receives_are_delivered_and_only_sends_are_sent() -> None:
    steps: list[tuple[tuple[enum.Enum, enum.Enum], tuple[Action, enum.Enum]]] = [
        *CONNECTION_TRANSITIONS.items(),
        *SUBSCRIBER_TRANSITIONS.items(),
        *PUBLISHER_TRANSITIONS.items(),
    ]
    for (_, step_input), (action, _) in steps:
        name = step_input.name
        if action in (Action.DELIVER, Action.ABORT):
            assert name.startswith("RECV_"), name
        if action is Action.SEND:
            assert name.startswith("SEND_"), name


def test_every_connection_state_has_a_protocol_error_transition() -> None:
    assert set(CONNECTION_ON_PROTOCOL_ERROR) == set(ConnectionState)


def test_connection_reports_its_role() -> None:
    assert ReactiveConnection(Role.CLIENT).role is Role.CLIENT


# --------------------------------------------------------------------------- docs


def test_state_diagram_in_the_docs_is_current() -> None:
    spec = importlib.util.spec_from_file_location("rsio_state_diagram", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--check"]) == 0, "run scripts/rsio_state_diagram.py --write"
