"""How long the gateway waits for a replica: connect, first byte, and idle time between chunks.

One fixed timeout is wrong for both a 128K-token cold prefill (minutes) and a cache hit (a fraction of
a second), so the first-byte deadline is scaled from the request's predicted TTFT
(``ticket.prediction.terms.total``):

    first byte  = min(request_timeout, max(first_byte_timeout, factor x predicted TTFT + margin))
                  (defaults: floor 5 s, factor 4, margin 2 s, request_timeout 600 s)

For a stream the first byte is the first body chunk after the headers (SGLang sends its headers at
once). A non-streamed answer arrives whole after the decode, so its deadline adds the decode:
``+ max_new_tokens x decode_timeout_per_token`` (default 0.2 s per token, i.e. a replica slower than
5 tokens/s counts as hung); without ``max_tokens`` it is ``request_timeout``. After a stream's first
byte, each further chunk must come within ``idle_timeout`` (default 60 s). Connecting has its own
``connect_timeout`` (``proxy/upstream/client.py``).

A request that misses its first-byte deadline is retried on another replica (nothing reached the
client yet) and the replica's breaker counts a failure; a stream idle past ``idle_timeout`` ends with
one SSE error event.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from proxy.config.settings import Settings


@dataclass(frozen=True, slots=True)
class Deadlines:
    request_timeout: float = 600.0  # the cap of every deadline
    first_byte_timeout: float = 5.0  # the floor of the first-byte deadline
    first_byte_factor: float = 4.0  # x the predicted TTFT
    first_byte_margin: float = 2.0  # + this
    idle_timeout: float = 60.0  # between two chunks of a stream, after its first byte
    decode_timeout_per_token: float = 0.2  # non-streamed answers: + max_new_tokens x this

    @classmethod
    def of(cls, st: Settings) -> Deadlines:
        """The deadlines the settings name."""
        return cls(
            st.request_timeout,
            st.first_byte_timeout,
            st.first_byte_timeout_factor,
            st.first_byte_timeout_margin,
            st.idle_timeout,
            st.decode_timeout_per_token,
        )

    def first_byte_s(self, predicted_ttft_s: float, streamed: bool, max_new_tokens: int | None) -> float:
        """Seconds from sending the request to its first byte (a whole non-streamed answer)."""
        scaled = self.first_byte_factor * predicted_ttft_s + self.first_byte_margin
        ttft = max(self.first_byte_timeout, scaled)
        if streamed:
            return min(self.request_timeout, ttft)
        if not max_new_tokens or max_new_tokens < 0:  # unknown (or nonsense the replica will refuse)
            return self.request_timeout
        return min(self.request_timeout, ttft + max_new_tokens * self.decode_timeout_per_token)

    def idle_s(self) -> float:
        return min(self.request_timeout, self.idle_timeout)
