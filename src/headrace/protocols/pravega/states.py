"""Pravega connection state machines, written as transition tables.

Theory of operation
-------------------

A Pravega connection carries two streams of frames that are independent at
the framing level: the client's stream (requests and appends) and the
server's stream (replies). Each stream has its own small state machine, and
*both* peers run *both* machines (as in h11): a peer checks what it is about to
send against the machine of its own stream (a violation is our bug:
``LocalProtocolError``), and what it receives against the machine of the
peer's stream (a violation is the peer's fault: ``RemoteProtocolError``).

Each table maps ``(state, input) -> (action, next_state)``. The input is the
class of the command (:func:`classify`); the action names what the
*receiving* side does besides handing the command to its user (the sending
side only checks legality and moves to ``next_state``). A pair missing from a
table is a protocol violation. End of input is the ``EOF`` input and is legal
in every state.

Client stream::

    START --Hello--> OPEN --request | SetupAppend | KeepAlive--> OPEN
                     OPEN --AppendBlockEnd | ConditionalAppend | ConditionalBlockEnd--> OPEN
                     OPEN --AppendBlock--> IN_APPEND_BLOCK --AppendBlockEnd--> OPEN

Server stream::

    START --Hello--> OPEN --reply | KeepAlive--> OPEN

Invariants the tables encode (``docs/protocols/pravega.md``; ``pravega.md#...``
names its anchors):

* Hello is the first frame of each stream, and appears once (pravega.md#handshake). The
  server's Hello answers the client's; a client never sees a reply before it.
* Between an AppendBlock and its AppendBlockEnd nothing else may appear on the
  client stream (pravega.md#java-append-blocks): the only way out of ``IN_APPEND_BLOCK`` is
  AppendBlockEnd.
* Event, PartialEvent and Padding frames only exist inside append data; as
  frames of their own they are legal in no state.

Rules that need more than a state (kept in ``connection.py``): the server
answers Hello and echoes KeepAlive itself and never sends either on its own
(the real client fails on unsolicited frames, pravega.md#request-ids); an append needs a prior
SetupAppend from the same writer on the same connection that the server
accepted (answered with AppendSetup), and its last event number must not go
backwards (pravega.md#append-sessions).
"""

from __future__ import annotations

import enum

from . import commands as c

__all__ = [
    "CLIENT_STREAM",
    "SERVER_STREAM",
    "Action",
    "Input",
    "Role",
    "StreamState",
    "Transitions",
    "classify",
    "format_table",
]


class Role(enum.Enum):
    """Which end of the connection this side is."""

    CLIENT = "client"
    SERVER = "server"


class StreamState(enum.Enum):
    """State of one direction's stream of frames."""

    # Hashed in every transition's (state, input) key: identity, as equality is,
    # instead of Enum's hash of the name (a Python call per lookup).
    __hash__ = object.__hash__

    START = "START"
    """Nothing sent yet: the next frame must be Hello."""
    OPEN = "OPEN"
    """Handshake frame sent; requests (or replies) flow."""
    IN_APPEND_BLOCK = "IN_APPEND_BLOCK"
    """Client stream only: an AppendBlock was sent; AppendBlockEnd must follow."""
    CLOSED = "CLOSED"
    """The stream ended (end of input)."""


class Input(enum.Enum):
    """What kind of frame arrives (or is sent), as far as the state machines care."""

    # Hashed in every transition's (state, input) key: identity, as equality is,
    # instead of Enum's hash of the name (a Python call per lookup).
    __hash__ = object.__hash__

    HELLO = "Hello"
    KEEP_ALIVE = "KeepAlive"
    REQUEST = "request"
    SETUP_APPEND = "SetupAppend"
    APPEND_BLOCK = "AppendBlock"
    APPEND_BLOCK_END = "AppendBlockEnd"
    CONDITIONAL_APPEND = "ConditionalAppend/ConditionalBlockEnd"
    REPLY = "reply"
    EMBEDDED = "Event/PartialEvent/Padding"
    EOF = "EOF"


class Action(enum.Enum):
    """What the receiving side does (besides the state change)."""

    # Hashed in every transition's (state, input) key: identity, as equality is,
    # instead of Enum's hash of the name (a Python call per lookup).
    __hash__ = object.__hash__

    ANSWER_HELLO = "check versions; answer Hello"
    CHECK_HELLO = "check versions"
    ECHO = "echo KeepAlive"
    EMIT = "deliver the command"
    SETUP_WRITER = "end the writer's session (AppendSetup opens the next); deliver"
    APPEND = "check the writer's session; deliver AppendData"
    HOLD_BLOCK = "keep the block until its AppendBlockEnd"
    APPEND_BLOCK = "join block and AppendBlockEnd; deliver AppendData"
    CLOSE = "deliver ConnectionClosed"


Transitions = dict[tuple[StreamState, Input], tuple[Action, StreamState]]

_S = StreamState
_I = Input
_A = Action

CLIENT_STREAM: Transitions = {
    (_S.START, _I.HELLO): (_A.ANSWER_HELLO, _S.OPEN),
    (_S.OPEN, _I.KEEP_ALIVE): (_A.ECHO, _S.OPEN),
    (_S.OPEN, _I.REQUEST): (_A.EMIT, _S.OPEN),
    (_S.OPEN, _I.SETUP_APPEND): (_A.SETUP_WRITER, _S.OPEN),
    (_S.OPEN, _I.APPEND_BLOCK_END): (_A.APPEND, _S.OPEN),
    (_S.OPEN, _I.CONDITIONAL_APPEND): (_A.APPEND, _S.OPEN),
    (_S.OPEN, _I.APPEND_BLOCK): (_A.HOLD_BLOCK, _S.IN_APPEND_BLOCK),
    (_S.IN_APPEND_BLOCK, _I.APPEND_BLOCK_END): (_A.APPEND_BLOCK, _S.OPEN),
    (_S.START, _I.EOF): (_A.CLOSE, _S.CLOSED),
    (_S.OPEN, _I.EOF): (_A.CLOSE, _S.CLOSED),
    # A block cut short by the end of input was never acknowledged; the
    # writer re-sends it after reconnecting.
    (_S.IN_APPEND_BLOCK, _I.EOF): (_A.CLOSE, _S.CLOSED),
}
"""The client's stream: checked by the client on send, by the server on receive."""

SERVER_STREAM: Transitions = {
    (_S.START, _I.HELLO): (_A.CHECK_HELLO, _S.OPEN),
    (_S.OPEN, _I.REPLY): (_A.EMIT, _S.OPEN),
    (_S.OPEN, _I.KEEP_ALIVE): (_A.EMIT, _S.OPEN),
    (_S.START, _I.EOF): (_A.CLOSE, _S.CLOSED),
    (_S.OPEN, _I.EOF): (_A.CLOSE, _S.CLOSED),
}
"""The server's stream: checked by the server on send, by the client on receive."""

_SPECIAL_INPUTS: dict[c.CommandType, Input] = {
    c.CommandType.HELLO: Input.HELLO,
    c.CommandType.KEEP_ALIVE: Input.KEEP_ALIVE,
    c.CommandType.SETUP_APPEND: Input.SETUP_APPEND,
    c.CommandType.APPEND_BLOCK: Input.APPEND_BLOCK,
    c.CommandType.APPEND_BLOCK_END: Input.APPEND_BLOCK_END,
    c.CommandType.CONDITIONAL_APPEND: Input.CONDITIONAL_APPEND,
    c.CommandType.CONDITIONAL_BLOCK_END: Input.CONDITIONAL_APPEND,
}

_DIRECTION_INPUTS: dict[c.Direction, Input] = {
    c.Direction.REQUEST: Input.REQUEST,
    c.Direction.REPLY: Input.REPLY,
    c.Direction.EMBEDDED: Input.EMBEDDED,
}


def classify(cmd: c.Command | type[c.Command]) -> Input:
    """The state-machine input a command (or a class of them) is."""
    special = _SPECIAL_INPUTS.get(cmd.type)
    if special is not None:
        return special
    return _DIRECTION_INPUTS[cmd.direction]


def format_table(table: Transitions) -> str:
    """Render a transition table as a Markdown table (used for docs/protocols/pravega.md)."""
    lines = ["| state | input | action | next state |", "|---|---|---|---|"]
    for (state, inp), (action, next_state) in table.items():
        lines.append(f"| {state.value} | {inp.value} | {action.value} | {next_state.value} |")
    return "\n".join(lines)
