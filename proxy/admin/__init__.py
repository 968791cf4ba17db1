"""The operator's API behind the admin key: replicas, replica control, route previews.

Here: ``replicas`` (list, add, remove, drain), ``control`` (SGLang's control endpoints, only through here),
``preview`` (where a request would go, recording nothing).

May import: ``context``, ``front``, ``config``, ``tenancy``, ``errors``, ``types``.
"""
