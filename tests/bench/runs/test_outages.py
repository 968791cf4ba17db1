"""A workload's outage against a real emulated fleet: the restart fault is posted at its modelled time,
the killed replica resets every request for its down time, then serves again with an empty cache."""

from __future__ import annotations

import io
import time
from pathlib import Path

import aiohttp
import pytest

from bench.runs import outages
from bench.runs.progress import Progress
from bench.runs.replay import replay, rotating
from bench.systems.fleet import EmulatorFleet, FleetSpec
from bench.workloads.shapes import CHAT, Outage, TimedRequest, Workload
from bench.workloads.text import WordSource

pytestmark = pytest.mark.slow
SCALE = 0.1  # wall seconds per modelled second: the replay takes ~2 s


def _workload() -> Workload:
    """11 requests for one prompt, every 2 modelled s (0..20); replica 1 (of 2, alternating) is killed at
    0.45 x 20 = 9 s for 6 s: its requests at 10 and 14 s fall in the down time, at 2, 6 and 18 s not."""
    text = WordSource(1).sentences(300)
    body = {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 4}
    reqs = tuple(TimedRequest(i, 2.0 * i, f"s{i}", CHAT, body, 300, "t") for i in range(11))
    return Workload("outage", "", reqs, time_scale=SCALE, outages=(Outage(0.45, 1, 6.0),))


@pytest.mark.timeout(60)
async def test_the_outage_is_posted_on_time_and_the_replica_comes_back_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wl = _workload()
    spec = FleetSpec(replicas=2, gpu_tokens=6_000, time_scale=SCALE, faults=True)
    assert "--emu-enable-faults" in spec.args(1)
    assert "--emu-enable-faults" not in FleetSpec(2, 6_000, SCALE).args(1)
    posted: list[tuple[str, float, float]] = []
    post = outages.restart

    async def restart(session: aiohttp.ClientSession, url: str, down_s: float) -> None:
        posted.append((url, time.perf_counter(), down_s))
        await post(session, url, down_s)

    monkeypatch.setattr(outages, "restart", restart)
    async with EmulatorFleet(2, spec.args(1), tmp_path / "emu.log") as fleet:
        inject = outages.injector(wl, fleet.urls, SCALE)
        assert inject is not None
        starts: list[float] = []

        async def during(session: aiohttp.ClientSession, t0: float) -> None:
            starts.append(t0)
            await inject(session, t0)

        records = await replay(wl, rotating(fleet.urls), SCALE, 30.0, Progress("t", 11, io.StringIO()),
                               during=during)  # fmt: skip
        async with aiohttp.ClientSession() as http:
            url = fleet.urls[1] + "/_emu/requests?path=/v1/chat/completions"
            async with http.get(url) as resp:
                log = (await resp.json())["requests"]
    ((url, at, down_s),) = posted
    assert url == fleet.urls[1] and down_s == 6.0
    assert (at - starts[0]) / SCALE == pytest.approx(9.0, abs=0.5)  # modelled seconds after t0
    failed = [r.index for r in records if not r.ok]
    assert failed == [5, 7], [(r.index, r.error) for r in records]
    assert all(records[i].status == 0 and records[i].error for i in failed)  # no HTTP status: a reset
    assert [e["outcome"] for e in log] == ["answered", "answered", "reset", "reset", "answered"]
    assert records[3].cached_tokens > 0 and records[9].cached_tokens == 0  # cached before, empty after
    assert records[8].cached_tokens > 0 and records[10].cached_tokens > 0  # replica 0 kept its cache
