"""Prefill/decode disaggregation: a request sent to a prefill server and a decode server at once.

Here: ``bootstrap`` (the room and the fields both servers get), ``legs`` (the prefill's leg and the
decode's attempt), ``pair`` (one try on one pair: both sent together, the decode's stream relayed from
its first byte, a failure before it or a departed client aborting both), ``pairs`` (``PairDispatch``:
the decode server chosen, retries as a new pair with a new room; installed as ``proxy.dispatch.PAIRS``),
``report`` (its metrics and its ``/status`` section). docs/pd.md says what it does and why.

May import: ``context``, ``dispatch``, ``fleet``, ``observe``, ``upstream``, ``errors``, ``types``.
"""
