"""The server: thin asyncio adapters between sockets, the protocol codecs and the store.

``ServerApp`` (``app.py``) owns the store and the listeners; each front door is
one module here with a dispatch table (command -> store call), an error
table (store error -> wire reply) and a starter, one row of the starters
table (``listeners.py``).
"""
