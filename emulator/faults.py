"""Faults on demand (only with --emu-enable-faults): the admin endpoint's state machine.

POST /_emu/faults takes one action at a time:

    {"action": "fail", "status": 503, "count": N}          next N generation requests fail with that status
    {"action": "hang", "count": N}                         next N are accepted and never answered
    {"action": "cut_stream", "after_chunks": K, "count": N} next N streams close after K data chunks
    {"action": "slow", "factor": F}                        multiply every modelled duration by F
    {"action": "restart"}                                  GPU and host tiers lost, storage kept,
                                                            startup_time changes, /health 503 ~1 s modelled
    {"action": "clear"}                                    remove all armed faults (and the slow factor)

Generation handlers call `Faults.take()` once per request; it consumes one count of the first armed
fault (fail, then hang, then cut_stream) and returns what to do.
"""

from __future__ import annotations

from dataclasses import dataclass


class FaultError(ValueError):
    """An invalid fault request (400)."""


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str  # "fail" | "hang" | "cut_stream"
    status: int = 503
    after_chunks: int = 0


@dataclass(slots=True)
class _Armed:
    fault: Fault
    remaining: int


class Faults:
    """Armed faults of one replica (mutable, owned by its app)."""

    def __init__(self) -> None:
        self._armed: list[_Armed] = []
        self.slow_factor = 1.0

    def arm(self, body: dict[str, object]) -> str:
        """Apply one admin action; returns the action name. Restart is handled by the caller."""
        action = body.get("action")
        if action == "clear":
            self._armed.clear()
            self.slow_factor = 1.0
        elif action == "slow":
            factor = _number(body, "factor", 1.0)
            if factor <= 0:
                raise FaultError("factor must be > 0")
            self.slow_factor = factor
        elif action in ("fail", "hang", "cut_stream"):
            count = int(_number(body, "count", 1))
            status = int(_number(body, "status", 503))
            after = int(_number(body, "after_chunks", 1))
            if count < 1 or not 100 <= status <= 599 or after < 0:
                raise FaultError("count must be >= 1, status 100..599, after_chunks >= 0")
            self._armed.append(_Armed(Fault(str(action), status, after), count))
        elif action != "restart":
            raise FaultError(f"unknown action {action!r}")
        return str(action)

    def take(self, streaming: bool) -> Fault | None:
        """The fault for the next generation request (cut_stream only applies to streams)."""
        for kind in ("fail", "hang", "cut_stream"):
            if kind == "cut_stream" and not streaming:
                continue
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
        return {"faults": armed, "slow_factor": self.slow_factor}


def _number(body: dict[str, object], key: str, default: float) -> float:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FaultError(f"{key} must be a number")
    return float(value)
