"""Faults on demand (only with --emu-enable-faults): the admin endpoint's state machine.

POST /_emu/faults takes one action at a time:

    {"action": "fail", "status": 503, "count": N}          next N generation requests fail with that status
    {"action": "hang", "count": N}                         next N are accepted and never answered
    {"action": "cut_stream", "after_chunks": K, "count": N} next N streams close after K data chunks
    {"action": "reset", "count": N}                        next N generation requests: the connection is
                                                            reset (TCP RST) before any response byte
    {"action": "unhealthy"[, "count": N | "seconds": S]}   /health, /health_generate and /ready answer
                                                            503: for the next N probes, for S modelled
                                                            seconds, or (neither given) until "clear"
    {"action": "slow", "factor": F}                        multiply every modelled duration by F
    {"action": "restart"[, "down_s": S]}                   GPU and host tiers lost, storage kept, in-flight
                                                            requests aborted, startup_time changes, /health
                                                            503 ~1 s modelled; with S > 0 the replica is
                                                            also down for S modelled s, as a killed process:
                                                            every generation request's connection is reset
                                                            before any byte and every health probe answers
                                                            503; then it serves again (empty GPU and host)
    {"action": "clear"}                                    remove all armed faults (and the slow factor);
                                                            a replica still down is back at once

Generation handlers call `Faults.take()` once per request; it consumes one count of the first armed
fault (fail, then hang, then cut_stream) and returns what to do. Connection-level faults act before any
handler runs (the server's frame middleware): `take_reset()` for a generation request, `probe_fails()`
for a health probe; a reset therefore comes before any fail/hang/cut_stream armed at the same time. While
a restart's down time lasts (`down_until`, loop time), both say yes without consuming anything.
"""

from __future__ import annotations

from dataclasses import dataclass


class FaultError(ValueError):
    """An invalid fault request (400)."""


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str  # "fail" | "hang" | "cut_stream" | "reset"
    status: int = 503
    after_chunks: int = 0


@dataclass(slots=True)
class _Armed:
    fault: Fault
    remaining: int


@dataclass(frozen=True, slots=True)
class Sickness:
    """An armed "unhealthy" fault: failing probes left (None: unbounded) and until when (loop time)."""

    probes: int | None = None
    until: float | None = None

    def describe(self) -> dict[str, object]:
        return {"probes": self.probes, "until": self.until}


class Faults:
    """Armed faults of one replica (mutable, owned by its app)."""

    def __init__(self) -> None:
        self._armed: list[_Armed] = []
        self.slow_factor = 1.0
        self.sickness: Sickness | None = None
        self.down_until: float | None = None  # loop time until which a restarted replica is down

    def arm(self, body: dict[str, object], now: float = 0.0, time_scale: float = 1.0) -> str:
        """Apply one admin action; returns the action name. Restart is handled by the caller (this only
        sets its down time). `now` (loop time) and `time_scale` turn an "unhealthy" fault's or a restart's
        modelled seconds into a deadline."""
        action = body.get("action")
        if action == "clear":
            self._armed.clear()
            self.slow_factor = 1.0
            self.sickness = None
            self.down_until = None
        elif action == "slow":
            factor = _number(body, "factor", 1.0)
            if factor <= 0:
                raise FaultError("factor must be > 0")
            self.slow_factor = factor
        elif action in ("fail", "hang", "cut_stream", "reset"):
            count = int(_number(body, "count", 1))
            status = int(_number(body, "status", 503))
            after = int(_number(body, "after_chunks", 1))
            if count < 1 or not 100 <= status <= 599 or after < 0:
                raise FaultError("count must be >= 1, status 100..599, after_chunks >= 0")
            self._armed.append(_Armed(Fault(str(action), status, after), count))
        elif action == "unhealthy":
            self.sickness = _sickness(body, now, time_scale)
        elif action == "restart":
            self.down_until = _down_until(body, now, time_scale)
        else:
            raise FaultError(f"unknown action {action!r}")
        return str(action)

    def take(self, streaming: bool) -> Fault | None:
        """The fault for the next generation request (cut_stream only applies to streams)."""
        for kind in ("fail", "hang", "cut_stream"):
            if kind == "cut_stream" and not streaming:
                continue
            fault = self._take_kind(kind)
            if fault is not None:
                return fault
        return None

    def is_down(self, now: float) -> bool:
        """True while a restart's down time lasts at loop time `now`."""
        if self.down_until is not None and now >= self.down_until:
            self.down_until = None
        return self.down_until is not None

    def take_reset(self, now: float) -> bool:
        """True if a generation request arriving at loop time `now` must have its connection reset: the
        replica is down, or an armed reset is left (consumes one count)."""
        return self.is_down(now) or self._take_kind("reset") is not None

    def probe_fails(self, now: float) -> bool:
        """True if a health probe arriving at loop time `now` must answer 503: the replica is down, or an
        "unhealthy" fault is armed (consumes one count)."""
        if self.is_down(now):
            return True
        sick = self.sickness
        if sick is None:
            return False
        if sick.until is not None and now >= sick.until:
            self.sickness = None
            return False
        if sick.probes is not None:
            left = sick.probes - 1
            self.sickness = Sickness(left, sick.until) if left > 0 else None
        return True

    def _take_kind(self, kind: str) -> Fault | None:
        for armed in self._armed:
            if armed.fault.kind == kind and armed.remaining > 0:
                armed.remaining -= 1
                if armed.remaining == 0:
                    self._armed.remove(armed)
                return armed.fault
        return None

    def describe(self) -> dict[str, object]:
        armed = [
            {
                "action": a.fault.kind,
                "status": a.fault.status,
                "after_chunks": a.fault.after_chunks,
                "count": a.remaining,
            }
            for a in self._armed
        ]
        unhealthy = self.sickness.describe() if self.sickness is not None else None
        return {
            "faults": armed,
            "slow_factor": self.slow_factor,
            "unhealthy": unhealthy,
            "down_until": self.down_until,
        }


def _sickness(body: dict[str, object], now: float, time_scale: float) -> Sickness:
    probes = int(_number(body, "count", 0)) if "count" in body else None
    seconds = _number(body, "seconds", 0.0) if "seconds" in body else None
    if probes is not None and probes < 1:
        raise FaultError("count must be >= 1")
    if seconds is not None and seconds <= 0:
        raise FaultError("seconds must be > 0")
    return Sickness(probes, None if seconds is None else now + seconds * time_scale)


def _down_until(body: dict[str, object], now: float, time_scale: float) -> float | None:
    down = _number(body, "down_s", 0.0)
    if down < 0:
        raise FaultError("down_s must be >= 0")
    return now + down * time_scale if down > 0 else None


def _number(body: dict[str, object], key: str, default: float) -> float:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FaultError(f"{key} must be a number")
    return float(value)
