"""Running the gateway process: the runner and serve loop, graceful drain, allocator tuning, ``--workers``.

Here: ``serving`` (the runner, protocol errors in OpenAI's shape, TLS, the serve loop), ``ready_line``
(``kvroute ready URL``, printed once ``/ready`` would say ready), ``drain`` (SIGTERM: finish what is in
flight), ``malloc``, ``supervisor`` (N worker processes on one port).

May import: ``context``.
"""
