"""The HTTP surface clients meet: handlers, request parsing and checks, middlewares, operational routes.

Here: ``handlers`` (generation routes and the errors middleware), ``openai`` (parsing a body once, pure),
``request_guard`` (paths and headers), ``request_body`` (size, type, deadline), ``input_limits``,
``gatekeeper`` (client keys and admission), ``passthrough`` (the allowlisted ``/v1`` paths),
``operations`` (models, health, ready, status, metrics).

May import: ``context``, ``answers``, ``dispatch``, ``status``, ``sync``, ``config``, ``fleet``, ``observe``,
``tenancy``, ``errors``, ``types``.
"""
