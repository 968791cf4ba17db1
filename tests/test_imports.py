"""The house's shape, checked on the source (AST, nothing imported): no import circles in any package,
``routing/`` pure, ``emulator/`` independent, and every wing of ``proxy/`` and ``bench/`` importing only
what its ``__init__`` docstring's ``May import:`` line allows (top-level modules are their own names)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("proxy", "routing", "diag", "bench", "emulator")


def modules(package: str) -> dict[str, Path]:
    """Dotted module name → file, for every module of ``package``."""
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imported(path: Path) -> Iterator[str]:
    """Every absolute module name ``path`` imports, anywhere in it (``TYPE_CHECKING`` blocks and
    function bodies included: a circle hidden there is a circle still)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{a.name}" for a in node.names)


def graph(package: str) -> dict[str, set[str]]:
    mods = modules(package)
    return {m: {i for i in imported(p) if i in mods and i != m} for m, p in mods.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        top = stack.pop()
                        on.discard(top)
                        comp.append(top)
                        if top == node:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on.add(child)
                work.append((child, iter(sorted(edges[child]))))
            elif child in on:
                low[node] = min(low[node], index[child])
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_circles(package: str) -> None:
    assert cycles(graph(package)) == []


def test_cycles_finds_a_circle() -> None:
    """The check itself: a two-module circle and a three-module one are found, a chain is not."""
    edges = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"}}
    assert sorted(cycles(edges)) == [["a", "b"], ["c", "d", "e"]]


def _top(name: str) -> str:
    return name.split(".")[0]


def test_routing_is_pure() -> None:
    """routing/ imports no web framework, no event loop, no store client and nothing of proxy/, and never
    reads the environment."""
    forbidden = {"aiohttp", "asyncio", "proxy", "redis", "prometheus_client", "zmq"}
    for m, path in modules("routing").items():
        assert not {_top(i) for i in imported(path)} & forbidden, m
        assert "os.environ" not in path.read_text(), m


def test_the_emulator_is_independent() -> None:
    for m, path in modules("emulator").items():
        assert not {_top(i) for i in imported(path)} & {"proxy", "routing"}, m


def _wing(module: str) -> str:
    """``proxy.fleet.load`` → ``fleet``; a top-level module (``proxy.context``) is its own name."""
    return module.split(".")[1] if module.count(".") >= 1 else module


def _allowed(package: str, wing: str) -> set[str]:
    doc = ast.get_docstring(ast.parse((ROOT / package / wing / "__init__.py").read_text())) or ""
    line = doc.split("May import:", 1)[1] if "May import:" in doc else ""
    return set(re.findall(r"``(\w+)``", line))


@pytest.mark.parametrize("package", ["proxy", "bench"])
def test_wings_import_what_they_say(package: str) -> None:
    """Wings point downward: each imports only the wings (and top-level modules) its docstring names,
    and at most ~14 modules stay on the package's top level."""
    root = ROOT / package
    wings = sorted(p.name for p in root.iterdir() if (p / "__init__.py").exists())
    assert len(wings) >= 5 and len(list(root.glob("*.py"))) <= 14
    edges = graph(package)
    for wing in wings:
        inside = f"{package}.{wing}."
        used = {_wing(d) for m, ds in edges.items() if m.startswith(inside) for d in ds} - {wing}
        assert used <= _allowed(package, wing), (wing, sorted(used - _allowed(package, wing)))
