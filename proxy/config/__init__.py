"""Settings: one frozen value read once at start-up from flags, a TOML file and ``KVROUTE_*`` variables.

Here: ``settings`` (the value and its loading), ``flags`` (the command line and its help),
``converters`` (each key's parser), ``targets`` and ``urls`` (what DNS targets and replica URLs say,
parsed), ``reference`` (docs/configuration.md, generated from the flags and defaults).

May import: nothing of ``proxy`` (only ``routing.config``): every other wing may import it.
"""
