"""The exact-response cache (``--response-cache``): a deterministic request answered again without a replica.

Here: ``cache`` (eligibility, keys per client and tenant, lookup and store around ``forward``), ``store``
(in memory or in Redis), ``capture`` (the answer a miss relayed), ``answer`` (a stored answer as a body
or an SSE stream).

May import: ``context``, ``dispatch``, ``config``, ``observe``, ``tenancy``, ``upstream``, ``types``.
"""
