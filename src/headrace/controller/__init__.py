"""The Pravega controller: scopes, streams, epochs, transactions; served over gRPC.

* ``naming``: segment ids, segment and transaction names (Pravega's rules);
* ``records``: the metadata records and their layout in the store's tables;
* ``model``: ``ControllerModel``, the metadata logic over the store API;
* ``errors``: what the model raises;
* ``rpc`` and ``service``: the gRPC method table, ``ControllerService``
  (proto <-> model, errors -> replies in one table) and ``ControllerServer``;
* the wire schema (the ``.proto`` and its generated modules) lives with the
  other wire protocol definitions in ``headrace.protocols.pravega``
  (``scripts/gen_controller_proto.py`` regenerates them).
"""

from __future__ import annotations

from headrace.controller.model import ControllerModel
from headrace.controller.naming import TxnId

__all__ = ["ControllerModel", "TxnId"]
