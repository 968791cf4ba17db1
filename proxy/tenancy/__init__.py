"""Who may call and as whom: client API keys, tenants' namespaces and rate limits, the operator's keys.

Here: ``keys`` (``--api-keys``: ``ApiKey``, ``KeyRing``), ``namespace`` (a tenant's salt in SGLang's
``cache_salt``/``extra_key`` and in routing; sessions scoped per client), ``rate_limit`` (token buckets),
``shared_limits`` (the buckets of a deployment, in a store, spent from local leases),
``admin_key`` (the admin and status keys).

May import: ``config``, ``observe``, ``errors``, ``types``.
"""
