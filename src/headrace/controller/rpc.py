"""The controller's gRPC method table, built from the service descriptor.

``controller_pb2`` (generated from ``protocols/pravega/controller.proto``) describes the
``ControllerService``; this module turns that description into what grpc
needs on either side: for each RPC its full method path and its request and
response message classes. The servicer (``service.py``) and test clients use
the same table, so a name typo cannot make one side miss the other.
"""

from __future__ import annotations

from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from headrace.protocols.pravega import controller_pb2 as pb

__all__ = ["METHODS", "SERVICE_NAME", "RpcMethod", "method_path"]

_SERVICE = pb.DESCRIPTOR.services_by_name["ControllerService"]

SERVICE_NAME: str = _SERVICE.full_name
"""``io.pravega.controller.stream.api.grpc.v1.ControllerService``."""


class RpcMethod:
    """One unary RPC: its name, path and message classes."""

    __slots__ = ("name", "path", "request", "response")

    def __init__(self, name: str, request: type[Message], response: type[Message]) -> None:
        self.name = name
        self.path = method_path(name)
        self.request = request
        self.response = response


def method_path(name: str) -> str:
    """``/io.pravega.controller.stream.api.grpc.v1.ControllerService/<name>``."""
    return f"/{SERVICE_NAME}/{name}"


METHODS: dict[str, RpcMethod] = {
    m.name: RpcMethod(m.name, GetMessageClass(m.input_type), GetMessageClass(m.output_type))
    for m in _SERVICE.methods
}
"""Every RPC of the service by its proto name (``createScope``, ``getURI``...)."""
