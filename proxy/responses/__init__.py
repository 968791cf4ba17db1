"""The Responses API and the Conversations API, with their state owned by the gateway.

Here: ``create`` (``POST /v1/responses``: expand the chain, route like chat, relay, store; background
responses), ``turn`` (one turn's record as it goes), ``lookup`` (``GET``/``DELETE /v1/responses/{id}``,
its ``input_items``, ``cancel``), ``conversations`` (``/v1/conversations`` and their items), ``request``
(a create body parsed, and the body a replica gets), ``chat_view`` (input items as the chat messages
SGLang renders, for routing), ``items`` (stored items, ids, list pages), ``echo`` (the echoed fields
patched back, in a body and in every stream event), ``state`` (where responses and conversations live:
this process or Redis, per owner), ``routes`` (the routes and the store's lifetime).

May import: ``context``, ``answers``, ``dispatch``, ``front``, ``sync``, ``config``, ``observe``, ``tenancy``,
``errors``, ``types``.
"""
