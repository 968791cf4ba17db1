"""A prefill/decode fleet for the gateway's tests: emulated prefill servers (HiCache, cache reports, faults)
and decode servers (no radix cache, as SGLang forces) in this process, each optionally behind a ``Tap``
(tests/proxy/disagg/taps.py), and kvroute over them with ``--prefill`` / ``--decode``."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import pytest

from tests.conftest import Emu, Emulators, Gw, StartGateway
from tests.proxy.conftest import ADMIN_KEY, EMU_FLAGS, PLAIN_FLAGS
from tests.proxy.disagg.taps import Tap

PD_TIME = ("--emu-time-scale", "0.01")
PREFILL_FLAGS = (*EMU_FLAGS, "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", "0")
DECODE_FLAGS = (*PLAIN_FLAGS, "--enable-metrics", "--disaggregation-mode", "decode")


@dataclasses.dataclass
class PdFleet:
    gw: Gw
    prefills: list[Emu]
    decodes: list[Emu]
    urls: dict[str, str]  # server name (p0, d1, ...) -> the URL the gateway was given
    taps: dict[str, Tap]
    events: list[str]

    @property
    def url(self) -> str:
        return self.gw.url

    def name_of(self, url: str) -> str:
        return next(k for k, v in self.urls.items() if v == url)


PdFactory = Callable[..., Awaitable[PdFleet]]


@pytest.fixture
async def pd_fleet(emulator_server: Emulators, gateway: StartGateway) -> AsyncIterator[PdFactory]:
    async with AsyncExitStack() as exits:

        async def make(
            prefills: int = 1,
            decodes: int = 2,
            taps: bool = False,
            prefill_flags: tuple[str, ...] = (),
            decode_flags: tuple[str, ...] = (),
            **settings: Any,
        ) -> PdFleet:
            events: list[str] = []
            ps = [await emulator_server(*PREFILL_FLAGS, *prefill_flags) for _ in range(prefills)]
            ds = [await emulator_server(*DECODE_FLAGS, *decode_flags) for _ in range(decodes)]
            named = {f"p{i}": e for i, e in enumerate(ps)} | {f"d{i}": e for i, e in enumerate(ds)}
            urls, tapped = {k: e.url for k, e in named.items()}, {}
            if taps:
                for k, e in named.items():
                    tapped[k] = Tap(k, e.url, events)
                    urls[k] = await exits.enter_async_context(tapped[k].running())
            defaults = {"health_interval": 0.1, "retries": 2, "admin_key": ADMIN_KEY}
            gw = await gateway(
                [],
                prefill=tuple(urls[f"p{i}"] for i in range(prefills)),
                decode=tuple(urls[f"d{i}"] for i in range(decodes)),
                **(defaults | settings),
            )
            return PdFleet(gw, ps, ds, urls, tapped, events)

        yield make
