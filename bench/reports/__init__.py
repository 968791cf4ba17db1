"""What runs measured, as tables, JSON, plots and the README's fleet section.

Here: ``tables`` (one point's summaries), ``summary`` (across points), ``plots``, ``readme``, ``comparison``
(request-by-request comparisons and verdicts), ``fleet_work`` (prefill seconds per replica),
``gateways``, ``warmrag`` and ``soak`` (those benchmarks' own reports).

May import: ``overhead``, ``runs``, ``systems``, ``workloads``.
"""
