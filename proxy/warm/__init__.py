"""The warm-up API: long documents placed and prefilled before their first question, per tenant.

Here: ``api`` (the routes), ``access`` (who may warm what, quotas), ``documents`` (validation and the
prefill-only steps), ``registry`` (jobs and placements, this gateway's and others'), ``jobs`` (the
worker that yields to live traffic, and re-warming).

May import: ``context``, ``front``, ``sync``, ``fleet``, ``tenancy``, ``upstream``, ``errors``, ``types``.
"""
