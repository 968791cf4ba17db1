"""docs/configuration.md, generated from the settings code: ``python -m proxy.config.reference``.

One row per key of ``kvroute serve``, read from the code that parses it: the flag and its help
(``proxy/config/flags.py``: ``FLAGS``, ``SWITCHES``), the TOML key and the ``KVROUTE_*`` variable
(``proxy/config/settings.py``: every key has one name everywhere), the default (``Settings``) and the
values it accepts (the key's converter in ``proxy/config/converters.py``). Then the ``[routing]`` table:
the fields of ``routing.config.RoutingConfig`` with their defaults and the comment written beside each.

A converter this module cannot describe is an error (``KeyError``), so a new kind of setting cannot
leave the page quietly wrong; ``tests/test_docs.py`` fails when docs/configuration.md differs from
what ``render()`` writes.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import sys
import textwrap
import tokenize
from collections.abc import Callable, Sequence
from typing import Any

from proxy.config.converters import CONVERTERS
from proxy.config.flags import FLAGS, SWITCHES
from proxy.config.settings import MiB, Settings
from routing.config import RoutingConfig

_FIELD = {"backend": "backends", "model_alias": "model_aliases"}  # key -> Settings field, where they differ
_REPEATABLE = ("backend", "discover", "model_alias", "prefill", "prefill_bootstrap_port", "decode")
_SET_BY_SETTINGS = {k: f"replaced by the `{k}` setting" for k in ("policy", "seed")}
_NAMED = {  # converters that are plain functions: what each accepts
    "_str": "a non-empty string",
    "_bool": "true or false (also 1/0, yes/no, on/off)",
    "_backends": "URLs, comma- or space-separated",
    "_ports": "ports, comma- or space-separated",
    "_targets": "dns://NAME:PORT or dns+srv://_PORT._PROTO.NAME, comma- or space-separated",
    "_dns_server": "HOST or HOST:PORT",
    "_aliases": "NAME=MODEL pairs (a [model_alias] table in TOML)",
    "_response_cache": "off, memory, or a redis://, rediss:// or unix:// URL",
}

HEAD = """# Configuration reference

Generated from the settings code by `python -m proxy.config.reference > docs/configuration.md`; do not
edit by hand (`tests/test_docs.py` fails when this page and the code disagree).

Every setting of `kvroute serve` has one name in three places: the flag (`--max-body-bytes`), the TOML
key in the file given with `--config` (`max_body_bytes`) and the environment variable
(`KVROUTE_MAX_BODY_BYTES`). Flags win over the TOML file, which wins over the environment, which wins
over the default. Every value is checked at start-up; an invalid one stops the gateway with a message
naming the key and where it came from. `kvroute serve --help` prints the same list.
"""

ROUTING_HEAD = """## The `[routing]` table

A TOML table `[routing]` in the `--config` file sets fields of the routing library's configuration
(`routing/config.py`); they have no flags or environment variables. `policy` and `seed` follow the
settings of the same name above, whatever the table says. A value must have the type of its default
(an integer where a float is expected is accepted).
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _shown(value: object, name: str = "") -> str:
    """A default as a reader would type it (sizes in bytes also in MiB)."""
    if value is None or value == ():
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if name.endswith("_bytes") and isinstance(value, int) and value % MiB == 0:
        return f"{value} ({value // MiB} MiB)"
    if isinstance(value, tuple):
        return ", ".join(str(v) for v in value)
    return str(value)


def accepts(conv: Callable[[object], Any]) -> str:
    """What a converter accepts, from its name or the values its closure holds."""
    if conv.__name__ != "conv":
        return _NAMED[conv.__name__]
    held = inspect.getclosurevars(conv).nonlocals
    if "options" in held:
        return "one of " + ", ".join(held["options"])
    if "hi" in held:
        return f"an integer in [{held['lo']}, {held['hi']}]"
    return f"a number {'>=' if held['inclusive'] else '>'} {held['lo']}"


def _key(flag: str) -> str:
    """``--max-body-bytes`` -> ``max_body_bytes`` (as ``flags.parser`` names its destinations)."""
    return flag[2:].replace("-", "_")


def _flags() -> dict[str, str]:
    """key -> the flag as typed (``--port PORT``; a switch alone)."""
    out = {_key(flag): f"{flag} {metavar}" for flag, metavar, _ in FLAGS}
    return out | {_key(flag): flag for flag, _ in SWITCHES}


def _helps() -> dict[str, str]:
    return {_key(flag): text for flag, _, text in FLAGS} | {_key(flag): text for flag, text in SWITCHES}


def _defaults() -> dict[str, object]:
    return {f.name: getattr(Settings(), f.name) for f in dataclasses.fields(Settings)}


def setting_rows() -> list[tuple[str, ...]]:
    """(TOML key, flag, environment variable, default, accepts, help) per key, in CONVERTERS order."""
    flags, helps, defaults = _flags(), _helps(), _defaults()
    rows: list[tuple[str, ...]] = []
    for key, conv in CONVERTERS.items():
        toml = "(flag or environment only)" if key == "config" else f"`{key}`"
        what = accepts(conv) + ("; repeatable" if key in _REPEATABLE else "")
        default = _shown(defaults[_FIELD.get(key, key)], key)
        rows.append((toml, f"`{flags[key]}`", f"`KVROUTE_{key.upper()}`", default, what, helps[key]))
    return rows


def field_comments(cls: type) -> dict[str, str]:
    """Field -> the comment written on its lines, else the comment block above its group of fields
    (a group ends at a blank line)."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines, comments = source.splitlines(), _comments(source)
    cls_node = ast.parse(source).body[0]
    if not isinstance(cls_node, ast.ClassDef):
        raise TypeError(f"{cls.__name__}: expected a class")
    out: dict[str, str] = {}
    for node in cls_node.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            span = range(node.lineno, (node.end_lineno or node.lineno) + 1)
            own = " ".join(comments[n] for n in span if n in comments)
            out[node.target.id] = own or _group_comment(lines, comments, node.lineno)
    return out


def _comments(source: str) -> dict[int, str]:
    """Line number (1-based) -> the text of the comment on that line."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return {t.start[0]: t.string.lstrip("#").strip() for t in tokens if t.type == tokenize.COMMENT}


def _group_comment(lines: Sequence[str], comments: dict[int, str], lineno: int) -> str:
    """The comment lines right above the first field of ``lineno``'s group (1-based line numbers)."""
    n = lineno - 1
    while n >= 1 and lines[n - 1].strip() and not lines[n - 1].lstrip().startswith("#"):
        n -= 1  # up over the group's earlier fields
    block: list[str] = []
    while n >= 1 and lines[n - 1].lstrip().startswith("#"):
        block.insert(0, comments[n])
        n -= 1
    return " ".join(block)


def routing_rows() -> list[tuple[str, ...]]:
    """(field, type, default, comment) per field of RoutingConfig."""
    comments = field_comments(RoutingConfig) | _SET_BY_SETTINGS
    default = RoutingConfig()
    return [
        (f"`{f.name}`", str(f.type), _shown(getattr(default, f.name)), comments.get(f.name, ""))
        for f in dataclasses.fields(RoutingConfig)
    ]


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]


def render() -> str:
    """The whole page."""
    head = ("TOML key", "flag", "environment", "default", "accepts", "what it does")
    lines = [HEAD, "## Settings", "", *_table(head, setting_rows()), "", ROUTING_HEAD]
    lines += _table(("field", "type", "default", "what it is"), routing_rows())
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Print the page: ``python -m proxy.config.reference > docs/configuration.md``."""
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
