"""Fixtures: in-process emulated replicas on port 0 (the shared ``emulator_server`` of tests/conftest.py,
here named ``emulator``) and an HTTP session."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from tests.conftest import Emu, Emulators, StartEmu

__all__ = ["Emu", "StartEmu"]


@pytest.fixture
async def emulator(emulator_server: Emulators) -> StartEmu:
    """`await emulator("--flag", ...)` starts one replica in this event loop; all stop at teardown."""
    return emulator_server


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session
