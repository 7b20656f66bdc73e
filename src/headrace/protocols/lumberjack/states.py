"""Lumberjack window state machines, written as transition tables.

Theory of operation
-------------------

A Lumberjack connection carries *windows*. The client announces a window with
``W count``, sends ``count`` data frames (``D`` on v1, ``J`` on v2, bare or
inside ``C`` frames, which are unpacked before they reach these tables), then
waits for one cumulative ``A seq`` whose ``seq`` is the seq field of the
window's last data frame (lumberjack.md#ack-value: never the count).

The server side has four states:

* ``AWAITING_WINDOW``: no window is open. A data frame here is an error (as in
  go-lumber); ``W`` > 0 opens a window; ``W`` = 0 queues an ack point that
  repeats the last ack given (rule 6; pylogbeat's empty ``send``).
* ``IN_WINDOW``: a window is open and not full. Each data frame is delivered
  at once (rule 2: store on arrival, the window only decides when the ack goes
  out); the one that fills the window closes it. A ``W`` here closes the
  incomplete window as it is (rule 5) and opens the next one.
* ``WINDOW_FULL``: the last window is complete. A new ``W`` opens the next
  window (pipelining, rule 3); a data frame without one opens an *implicit*
  window of the last count ("W once" clients, rule 4).
* ``CLOSED``: the peer sent EOF. Nothing more is received; acks for pending
  windows may still be sent (a half-close).

Every closed window becomes an *ack point* in a FIFO: the server acks them in
order, each only after its events are durable (invariant 1). The FIFO, the
partial acks and the keepalives are kept by the connection
(``connection.py``); these tables only say which action a received frame
causes and what state follows. A ``(state, input)`` pair that is not in a
table is a protocol error: a ``RemoteProtocolError`` for what the peer sent,
a ``LocalProtocolError`` for what our caller tried to send.

The client side is the mirror image for what our own client *sends*: a ``W``,
then exactly ``count`` data frames, then the next ``W`` (it may pipeline
windows without waiting for their acks). Received acks do not change its
state.
"""

from __future__ import annotations

import enum
from typing import Final

__all__ = [
    "CLIENT_TRANSITIONS",
    "SERVER_TRANSITIONS",
    "ClientInput",
    "Role",
    "ServerAction",
    "ServerInput",
    "WindowState",
    "transition_table_markdown",
]


class Role(enum.Enum):
    """Which end of the connection we are."""

    CLIENT = "client"
    SERVER = "server"


class WindowState(enum.Enum):
    """Where the window protocol stands (same states for both roles)."""

    AWAITING_WINDOW = "awaiting-window"
    IN_WINDOW = "in-window"
    WINDOW_FULL = "window-full"
    CLOSED = "closed"


class ServerInput(enum.Enum):
    """A received frame, classified (``C`` frames are unpacked first)."""

    WINDOW_SIZE = "W(count>0)"
    EMPTY_WINDOW_SIZE = "W(0)"
    DATA = "data"
    """A data frame that does not fill its window."""
    LAST_DATA = "last data"
    """A data frame that fills its window (counting an implicit window too)."""
    EOF = "EOF"


class ServerAction(enum.Enum):
    """What the connection does for a transition (``connection.py`` runs them)."""

    OPEN_WINDOW = "open window"
    CLOSE_AND_OPEN_WINDOW = "close the incomplete window (ack point), open a new one"
    ACK_LAST = "ack point repeating the last ack"
    CLOSE_AND_ACK_LAST = "close the incomplete window (ack point), then ack point repeating it"
    DELIVER = "deliver the event"
    DELIVER_AND_CLOSE = "deliver the event, close the window (ack point)"
    OPEN_IMPLICIT_AND_DELIVER = "open an implicit window of the last count, deliver"
    OPEN_IMPLICIT_DELIVER_AND_CLOSE = "open an implicit window of count 1, deliver, close"
    CLOSE_CONNECTION = "report ConnectionClosed"


class ClientInput(enum.Enum):
    """A frame our client asks to send, classified."""

    WINDOW_SIZE = "send W(count>0)"
    EMPTY_WINDOW_SIZE = "send W(0)"
    DATA = "send data"
    LAST_DATA = "send last data of window"
    EOF = "EOF"


_S = WindowState
_I = ServerInput
_A = ServerAction

SERVER_TRANSITIONS: Final[
    dict[tuple[WindowState, ServerInput], tuple[ServerAction, WindowState]]
] = {
    (_S.AWAITING_WINDOW, _I.WINDOW_SIZE): (_A.OPEN_WINDOW, _S.IN_WINDOW),
    (_S.AWAITING_WINDOW, _I.EMPTY_WINDOW_SIZE): (_A.ACK_LAST, _S.AWAITING_WINDOW),
    (_S.AWAITING_WINDOW, _I.EOF): (_A.CLOSE_CONNECTION, _S.CLOSED),
    (_S.IN_WINDOW, _I.DATA): (_A.DELIVER, _S.IN_WINDOW),
    (_S.IN_WINDOW, _I.LAST_DATA): (_A.DELIVER_AND_CLOSE, _S.WINDOW_FULL),
    (_S.IN_WINDOW, _I.WINDOW_SIZE): (_A.CLOSE_AND_OPEN_WINDOW, _S.IN_WINDOW),
    (_S.IN_WINDOW, _I.EMPTY_WINDOW_SIZE): (_A.CLOSE_AND_ACK_LAST, _S.AWAITING_WINDOW),
    (_S.IN_WINDOW, _I.EOF): (_A.CLOSE_CONNECTION, _S.CLOSED),
    (_S.WINDOW_FULL, _I.WINDOW_SIZE): (_A.OPEN_WINDOW, _S.IN_WINDOW),
    (_S.WINDOW_FULL, _I.EMPTY_WINDOW_SIZE): (_A.ACK_LAST, _S.AWAITING_WINDOW),
    (_S.WINDOW_FULL, _I.DATA): (_A.OPEN_IMPLICIT_AND_DELIVER, _S.IN_WINDOW),
    (_S.WINDOW_FULL, _I.LAST_DATA): (_A.OPEN_IMPLICIT_DELIVER_AND_CLOSE, _S.WINDOW_FULL),
    (_S.WINDOW_FULL, _I.EOF): (_A.CLOSE_CONNECTION, _S.CLOSED),
}
"""Server: ``(state, received input) -> (action, next state)``; absent = protocol error."""

_C = ClientInput

CLIENT_TRANSITIONS: Final[dict[tuple[WindowState, ClientInput], WindowState]] = {
    (_S.AWAITING_WINDOW, _C.WINDOW_SIZE): _S.IN_WINDOW,
    (_S.AWAITING_WINDOW, _C.EMPTY_WINDOW_SIZE): _S.AWAITING_WINDOW,
    (_S.AWAITING_WINDOW, _C.EOF): _S.CLOSED,
    (_S.IN_WINDOW, _C.DATA): _S.IN_WINDOW,
    (_S.IN_WINDOW, _C.LAST_DATA): _S.AWAITING_WINDOW,
    (_S.IN_WINDOW, _C.EOF): _S.CLOSED,
}
"""Client: ``(state, input to send) -> next state``; absent = ``LocalProtocolError``.

The client never enters ``WINDOW_FULL``: it does not send implicit windows."""


def transition_table_markdown() -> str:
    """Both tables as Markdown, for ``docs/protocols/lumberjack.md`` (kept in sync by a test)."""
    lines = [
        "| server state | received | action | next state |",
        "| --- | --- | --- | --- |",
    ]
    for (state, received), (action, next_state) in SERVER_TRANSITIONS.items():
        lines.append(
            f"| `{state.value}` | `{received.value}` | {action.value} | `{next_state.value}` |"
        )
    lines += ["", "| client state | sending | next state |", "| --- | --- | --- |"]
    for (state, sending), next_state in CLIENT_TRANSITIONS.items():
        lines.append(f"| `{state.value}` | `{sending.value}` | `{next_state.value}` |")
    return "\n".join(lines) + "\n"
