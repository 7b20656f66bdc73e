"""Sans-I/O protocol codecs and connection state machines.

Every protocol package has the same four modules (``commands``, ``codec``,
``connection``, ``states``) and the same verbs: ``receive_data(bytes)``
(``b""`` = EOF), ``events()``, ``send(command)``, ``data_to_send()``. Nothing
here imports asyncio, sockets, logging or the store.
"""
