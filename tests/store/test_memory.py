"""The store conformance suite against ``MemoryStore``, the reference implementation."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from headrace.store import MemoryStore
from tests.store.contract import StoreContract


class TestMemoryStore(StoreContract):
    @pytest.fixture
    async def store(self) -> AsyncIterator[MemoryStore]:
        store = MemoryStore()
        yield store
        await store.close()
