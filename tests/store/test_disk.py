"""DiskStore: the conformance suite, plus what only a disk store can get wrong."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from headrace.store.disk import DiskStore
from tests.store.contract import StoreContract


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[DiskStore]:
    s = await DiskStore.open(tmp_path / "data")
    yield s
    await s.close()


class TestDiskStore(StoreContract):
    pass
