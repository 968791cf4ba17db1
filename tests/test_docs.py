"""Every code block of README.md and docs/*.md works as written, and docs/configuration.md is current.

Each fenced block is one test (``README.md:42``). Its language decides what is done with it:

- ``python``: run against a live stack in this process (``tests/docs/live.py``: a kvroute gateway over two
  emulated replicas serving ``qwen3-8b``), with the docs' addresses rewritten to the stack's:
  ``http://127.0.0.1:8080`` is the gateway, ``http://127.0.0.1:30000`` and ``:30001`` the replicas. The
  gateway has the admin key ``$KVROUTE_ADMIN_KEY`` and an open status page; on a page with a keys block
  (below) it also requires that page's client keys. A block must work on its own (no state from another).
- ``bash`` / ``sh`` / ``shell``: one command per line (``\\`` continues a line, ``#`` comments), each checked:
  - ``curl ...`` runs for real (bash, addresses rewritten) and must answer below 400 (curl
    ``--fail-with-body``; a pipe fails the line when any part fails);
  - client commands run for real against the stack, through kvroute's own ``main``: ``kvroute warm``,
    ``kvroute probe``, ``kvroute ab`` and ``kvroute status --once``;
  - server and long commands are checked by the real parsers, nothing started: ``kvroute serve``
    (``proxy.config.settings.load_settings``, converters included), ``kvroute emulate`` and
    ``python -m sglang.launch_server`` (``emulator.config.parse_args``, which takes SGLang's flags: every
    flag must be one it knows), any other ``kvroute`` command and ``python -m MODULE`` (run until their
    argparse parser accepted the line; a module without one runs to its end), a line running
    ``deploy/sglang/launch.sh`` (run with ``DRY_RUN=1``, the SGLang command it prints checked as above),
    ``make TARGET`` (``make -n``), ``docker compose -f FILE --profile P`` (the file has that profile) and
    ``kubectl apply -k DIR`` (a kustomization);
  - anything else fails: a new kind of command needs a rule here first.
  Words are expanded by bash itself (variables, globs, quotes) with the docs' variables set; only a
  trailing ``> FILE`` (an existing file) may follow a checked command.
- ``toml``: parsed; a kvroute config is loaded with ``load_settings(["--config", FILE])``, a keys file
  (``[[key]]`` tables) with ``proxy.tenancy.keys.load_keys``. ``jsonl``: every line a JSON object; a
  keys file (entries with ``key`` or ``sha256``) loaded with ``load_keys``. ``json`` and ``yaml``: parsed.
- ``text``: output and pictures, not run. A block without a language, or in another one, fails.
  Indented blocks (four spaces) are formulas, not code: they are not read.

Also: docs/configuration.md is what ``python -m proxy.config.reference`` writes; docs/design.md's wing
tables list every wing of proxy/ and bench/ with its docstring's ``May import:`` names; every relative
link of these pages names a file that exists (and a heading of it). The whole module takes ~5 s.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
import yaml

from proxy.config.converters import CONVERTERS
from proxy.config.reference import accepts, render
from proxy.config.settings import load_settings
from proxy.tenancy.keys import load_keys
from tests.conftest import Emulators, StartGateway
from tests.docs import commands as cmd
from tests.docs import live
from tests.docs.snippets import ROOT, SHELL, Snippet, commands, pages, snippets, words
from tests.test_imports import _allowed

SNIPPETS = [s for page in pages() for s in snippets(page)]
DATA = ("toml", "json", "jsonl", "yaml")


def keys_block(page: Path) -> Snippet | None:
    """The page's client keys file, when it shows one."""
    return next((s for s in snippets(page) if _is_keys(s)), None)


def _is_keys(s: Snippet) -> bool:
    if s.lang == "toml":
        return "key" in tomllib.loads(s.text)
    if s.lang == "jsonl":
        return any({"key", "sha256"} & json.loads(line).keys() for line in s.text.splitlines() if line)
    return False


def check_data(s: Snippet, tmp: Path) -> None:
    """A data block parses, and a kvroute config or keys file loads."""
    path = tmp / f"block.{s.lang}"
    path.write_text(s.text)
    if _is_keys(s):
        load_keys(str(path))
    elif s.lang == "toml":
        load_settings(["--config", str(path)], env={})
    elif s.lang == "jsonl":
        assert all(isinstance(json.loads(line), dict) for line in s.text.splitlines() if line.strip())
    elif s.lang == "json":
        json.loads(s.text)
    else:
        list(yaml.safe_load_all(s.text))


def check_offline(command: str, env: dict[str, str]) -> None:
    """A command checked by its parsers (no live stack needed)."""
    rule = cmd.kind(words(command))
    if rule == "launch-script":
        return cmd.check_launch_script(command, env)
    extra, argv = cmd.split_env(cmd.expand(command, env))
    checks = {
        "kvroute-serve": lambda: cmd.check_serve(argv, extra),
        "kvroute-emulate": lambda: cmd.check_sglang_flags(argv[2:]),
        "sglang": lambda: cmd.check_sglang_flags(argv[3:]),
        "kvroute-parsed": lambda: cmd.check_kvroute(argv),
        "python-module": lambda: cmd.check_module(argv),
        "make": lambda: cmd.check_make(argv),
        "docker": lambda: cmd.check_docker(argv),
        "kubectl": lambda: cmd.check_kubectl(argv),
    }
    assert rule in checks, f"no rule for the command {command!r} (see tests/test_docs.py)"
    checks[rule]()


class Run:
    """One block's run: the live stack is started on first use."""

    def __init__(self, s: Snippet, emulators: Emulators, gateway: StartGateway, tmp: Path) -> None:
        self.snippet, self.emulators, self.gateway, self.tmp = s, emulators, gateway, tmp
        self._stack: live.Stack | None = None

    async def stack(self) -> live.Stack:
        if self._stack is None:
            keys = keys_block(self.snippet.path)
            path = self.tmp / f"keys.{keys.lang}" if keys else None
            if keys and path:
                path.write_text(keys.text)
            self._stack = await live.start(self.emulators, self.gateway, path)
        return self._stack

    async def shell(self) -> None:
        for command in commands(self.snippet.text):
            rule = cmd.kind(words(command))
            if rule == "curl":
                await live.run_curl(await self.stack(), command)
            elif rule == "kvroute-live":
                await live.run_kvroute(await self.stack(), command)
            else:
                check_offline(command, cmd.environment({"KVROUTE_ADMIN_KEY": live.ADMIN_KEY}))


@pytest.mark.parametrize("snippet", SNIPPETS, ids=lambda s: s.name)
async def test_snippet(
    snippet: Snippet,
    emulator_server: Emulators,
    gateway: StartGateway,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("KVROUTE_ADMIN_KEY", live.ADMIN_KEY)
    run = Run(snippet, emulator_server, gateway, tmp_path)
    if snippet.lang == "python":
        await live.run_python(await run.stack(), snippet.text, snippet.path, snippet.line)
    elif snippet.lang in SHELL:
        await run.shell()
    elif snippet.lang in DATA:
        check_data(snippet, tmp_path)
    else:
        assert snippet.lang == "text", (
            f"a block must name its language (python, bash, toml, ..., text): {snippet.lang!r}"
        )


def test_configuration_page_is_current() -> None:
    """docs/configuration.md is what ``python -m proxy.config.reference`` writes now."""
    assert (ROOT / "docs" / "configuration.md").read_text() == render(), (
        "docs/configuration.md is stale: run python -m proxy.config.reference > docs/configuration.md"
    )


def test_every_page_has_blocks() -> None:
    """The extractor finds the blocks (a broken fence pattern would find none, and test nothing)."""
    found = {s.path.name for s in SNIPPETS}
    assert {"README.md", "getting-started.md", "operations.md", "security.md"} <= found


def wing_table(page: str, package: str) -> dict[str, set[str]]:
    """A page's table of ``package``'s wings: wing -> the names in its "may import" column."""
    text = page.split(f"## The wings of `{package}/`", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|") for line in text.splitlines() if line.startswith("| `")]
    return {row[1].strip(" `"): set(re.findall(r"`(\w+)`", row[-2])) for row in rows}


@pytest.mark.parametrize("package", ["proxy", "bench"])
def test_design_page_draws_every_wing(package: str) -> None:
    """docs/design.md lists every wing of proxy/ and bench/ with what its docstring says it may import."""
    root = ROOT / package
    wings = {p.name for p in root.iterdir() if (p / "__init__.py").exists()}
    table = wing_table((ROOT / "docs" / "design.md").read_text(), package)
    assert table == {w: _allowed(package, w) - {package} for w in wings}


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def prose(page: Path) -> str:
    """A page without its fenced blocks."""
    return re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)


def links(page: Path) -> list[str]:
    """The relative link targets of a page, outside its code blocks."""
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", prose(page)) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_links_resolve(page: Path) -> None:
    """Every relative link of README.md and docs/ names a file that exists, and a heading of it."""
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.name}: {target}: no such file"
        if anchor and dest.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", prose(dest), flags=re.M)
            assert anchor in {slug(h) for h in headings}, f"{page.name}: {target}: no such heading"


def test_the_reference_describes_every_kind_of_value() -> None:
    """Each converter kind gets its description, and a converter it does not know stops the generator
    (a new kind of setting cannot leave docs/configuration.md quietly wrong)."""
    assert accepts(CONVERTERS["port"]) == "an integer in [0, 65535]"
    assert accepts(CONVERTERS["retry_backoff"]) == "a number >= 0.0"
    assert accepts(CONVERTERS["kv_events"]) == "one of auto, on, off"
    assert accepts(CONVERTERS["public_status"]).startswith("true or false")

    def _new_kind(value: object) -> str:
        return str(value)

    with pytest.raises(KeyError):
        accepts(_new_kind)
