"""bench.responses and bench.runs.chains on a small stack in this process: the same seeded conversations
over chat and over the Responses API through a kvroute gateway, every chain complete with the same token
counts on both; and the summary's counting of follow-ups (stayed, moved off a killed replica)."""

from __future__ import annotations

from bench.responses import summarize, table, verdicts
from bench.runs.chains import Kill, Phase, Turn, make_chains, run_phase
from bench.systems.fleet import EmulatorFleet
from tests.conftest import Emulators, StartGateway
from tests.proxy.conftest import EMU_FLAGS, MODEL


async def test_the_same_conversations_over_chat_and_responses(
    emulator_server: Emulators, gateway: StartGateway
) -> None:
    urls = [(await emulator_server(*EMU_FLAGS)).url for _ in range(2)]
    gw = await gateway(urls, health_interval=0.2)
    chains = make_chains(4, 3, seed=1, instruction_tokens=200, question_tokens=20, streamed=0.5)
    assert [c.stream for c in chains] == [False, True, False, True]
    phases = [Phase(mode, mode, MODEL, [gw.url, gw.url]) for mode in ("chat", "responses")]
    for phase in phases:
        await run_phase(phase, chains, concurrency=2, cap_s=60.0)
    rows = [summarize(p, 4, 3) for p in phases]
    assert all(r.chains_complete == 4 and r.failed == 0 and r.follow_ups == 8 for r in rows)
    tokens = [sorted((t.chain, t.turn, t.input_tokens) for t in p.turns) for p in phases]
    assert tokens[0] == tokens[1]  # the same prompts, turn by turn
    assert "| chat | 4/4 | 12 | 0 |" in table(rows)


def _turn(chain: int, turn: int, replica: str, after_kill: bool = False) -> Turn:
    return Turn(chain, turn, True, replica, 100, 50, 0.01, after_kill)


def test_follow_ups_forced_off_a_killed_replica_are_counted_apart() -> None:
    fleet = EmulatorFleet(1, (), ports=[1])  # never started: only its URL is read
    phase = Phase("killed", "responses", MODEL, ["g"], Kill([fleet], at=10**6, victim=fleet.urls[0]))
    dead = fleet.urls[0]
    phase.turns = [
        _turn(0, 0, dead),
        _turn(0, 1, "b", after_kill=True),  # moved: its replica is gone
        _turn(0, 2, "b", after_kill=True),  # stayed
        _turn(1, 0, "a"),
        _turn(1, 1, "b"),  # moved for no such reason: counted as not staying
    ]
    s = summarize(phase, 2, 3)
    assert (s.follow_ups, s.stayed, s.moved_off_killed, s.chains_complete) == (2, 1, 1, 1)
    assert s.cached_ratio == 0.5
    checks = verdicts([s, s, s])
    assert [ok for _, ok, _ in checks] == [True, False, True, False]
