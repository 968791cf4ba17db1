"""Stream chunks of SGLang's OpenAI routes (contract §2): `ChunkWriter` turns engine events into chunks.

Chat sends a role chunk per choice (`delta: {"role": "assistant", "content": ""}`), then content or
tool-call deltas, then after generation one finish chunk per choice with an empty delta; completions put
`finish_reason` on the last content chunk. Both end with an optional usage chunk (`choices: []`; for
completions serialized without null fields) before `[DONE]`. Ordinary chunks carry `usage: null` unless
`continuous_usage_stats` asks for usage on every chunk. An engine failure is one in-band error chunk.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from emulator.openai_request import Plan
from emulator.openai_shapes import batch_usage, chat_logprobs, legacy_logprobs
from emulator.replica import Job, Run
from emulator.sampler import Completion
from emulator.tickets import Emitted, Event, Failed, Finished

_EMPTY_DELTA = {"role": None, "content": None, "reasoning_content": None, "tool_calls": None}


class ChunkWriter:
    """Turns the engine events of a request's runs (one per prompt of a batch) into its chunk dicts."""

    def __init__(self, plan: Plan, jobs: Sequence[Job], runs: Sequence[Run], report: bool) -> None:
        self.plan = plan
        self.jobs = jobs
        self.runs = runs
        self.report = report
        self.sent = [0] * len(plan.completions)
        self.started = [False] * len(plan.completions)
        self.unfinished = len(runs)

    def on_event(self, k: int, event: Event) -> list[dict[str, Any]]:
        """The chunks for an event of run `k` (prompt k: choices k * n ... k * n + n - 1)."""
        first = k * self.plan.n
        if isinstance(event, Emitted):
            return [c for i, n in enumerate(event.counts) for c in self._advance(first + i, n)]
        if isinstance(event, Finished):
            self.unfinished -= 1
            mine = range(first, first + self.plan.n) if self.plan.chat else range(0)
            comps = self.plan.completions
            chunks = [self._chunk(i, _EMPTY_DELTA, comps[i].finish, comps[i].matched) for i in mine]
            if self.plan.include_usage and not self.unfinished:
                chunks.append(self._usage_chunk())
            return chunks
        if isinstance(event, Failed):
            err = {"object": "error", "message": event.message, "type": "InternalServerError"}
            return [{"error": err | {"param": None, "code": event.status}}]
        return []

    def _advance(self, i: int, count: int) -> list[dict[str, Any]]:
        comp, before = self.plan.completions[i], self.sent[i]
        chunks: list[dict[str, Any]] = []
        if self.plan.chat and not self.started[i]:
            self.started[i] = True
            role = {**_EMPTY_DELTA, "role": "assistant", "content": ""}
            chunks.append(self._chunk(i, role, None, None))
        if count <= before:
            return chunks
        self.sent[i] = count
        text = comp.text_upto(count)[len(comp.text_upto(before)) :]
        done = count >= len(comp.ids)
        if self.plan.chat:
            chunks += self._chat_delta(i, comp, text, before, count, done)
        elif text or done:
            lps = legacy_logprobs(comp, before, count, 0) if self.plan.logprobs else None
            finish = comp.finish if done else None
            chunks.append(
                self._chunk(i, None, finish, comp.matched if done else None, text=text, logprobs=lps)
            )
        return chunks

    def _chat_delta(
        self, i: int, comp: Completion, text: str, before: int, count: int, done: bool
    ) -> list[dict[str, Any]]:
        call = self.plan.tool_calls[i]
        if call is not None:
            fn = call["function"]
            if before == 0:
                head = {
                    **call,
                    "function": {"name": fn["name"], "arguments": fn["arguments"] if done else ""},
                }
                return [self._chunk(i, {**_EMPTY_DELTA, "tool_calls": [head]}, None, None)]
            if done:
                tail = {
                    "id": None,
                    "index": 0,
                    "type": None,
                    "function": {"name": None, "arguments": fn["arguments"]},
                }
                return [self._chunk(i, {**_EMPTY_DELTA, "tool_calls": [tail]}, None, None)]
            return []
        if not text:
            return []
        lps = chat_logprobs(comp, before, count) if self.plan.logprobs else None
        return [self._chunk(i, {**_EMPTY_DELTA, "content": text}, None, None, logprobs=lps)]

    def _chunk(
        self,
        i: int,
        delta: dict[str, Any] | None,
        finish: str | None,
        matched: str | int | None,
        text: str = "",
        logprobs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": i}
        if self.plan.chat:
            choice["delta"] = delta
        else:
            choice["text"] = text
        choice |= {"logprobs": logprobs, "finish_reason": finish, "matched_stop": matched}
        chunk = self._envelope()
        chunk["choices"] = [choice]
        chunk["usage"] = self._usage() if self.plan.continuous_usage else None
        return chunk

    def _envelope(self) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.plan.chat else "text_completion"
        return {
            "id": self.jobs[0].rid,
            "object": obj,
            "created": self.plan.created,
            "model": self.plan.model,
        }

    def _usage(self) -> dict[str, Any]:
        return batch_usage(self.jobs, self.runs, sum(self.sent), self.report)

    def _usage_chunk(self) -> dict[str, Any]:
        chunk = self._envelope() | {"choices": [], "usage": self._usage()}
        if not self.plan.chat and chunk["usage"]["prompt_tokens_details"] is None:
            del chunk["usage"]["prompt_tokens_details"]  # completions: exclude_none
        return chunk
