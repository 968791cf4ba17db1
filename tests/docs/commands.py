"""What a shell command of the docs is, and the checks that need no running servers.

``kind(words)`` names the rule a command falls under (``tests/test_docs.py`` lists them); the
``check_*`` functions raise ``AssertionError`` (or the parser's own error) when the command would not
work. ``expand`` turns a command line into the words a program would get, by asking bash itself.
"""

from __future__ import annotations

import argparse
import os
import runpy
import shlex
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import yaml

from emulator.config import parse_args as parse_emulator
from proxy.cli import main as kvroute_main
from proxy.config.settings import load_settings
from tests.docs.snippets import ROOT

LIVE_KVROUTE = ("warm", "probe", "ab")  # run for real against the test stack; and `status --once`
LAUNCH_SCRIPT = "deploy/sglang/launch.sh"
OPERATORS = set("|&;<>()")


class Parsed(Exception):
    """Raised in place of running a command once its argument parser accepted the command line."""


def kind(argv: Sequence[str]) -> str:
    """The rule for a command, from its words (environment assignments first are skipped)."""
    if LAUNCH_SCRIPT in argv:
        return "launch-script"
    prog = [*split_env(argv)[1], "", "", ""]
    if prog[0] == "kvroute":
        if prog[1] in LIVE_KVROUTE or (prog[1] == "status" and "--once" in argv):
            return "kvroute-live"
        return {"serve": "kvroute-serve", "emulate": "kvroute-emulate"}.get(prog[1], "kvroute-parsed")
    if prog[0] in ("python", "python3") and prog[1] == "-m":
        return "sglang" if prog[2] == "sglang.launch_server" else "python-module"
    return {"curl": "curl", "make": "make", "docker": "docker", "kubectl": "kubectl"}.get(prog[0], "unknown")


def expand(command: str, env: Mapping[str, str]) -> list[str]:
    """The command's words after the shell's expansions (variables, globs, quotes), without running it.

    Only a trailing ``> FILE`` may follow it (checked: FILE must exist); any other shell operator is an
    error, so that nothing in a docs line is ever run by this."""
    tokens = list(shlex.shlex(command, posix=True, punctuation_chars=True))
    if any(set(t) <= OPERATORS for t in tokens):
        command = _without_redirect(command, tokens)
    out = subprocess.run(
        ["bash", "-c", "printf '%s\\0' " + command],
        env=dict(env),
        cwd=ROOT,
        capture_output=True,
        check=True,
        timeout=10,
    ).stdout.decode()
    return out.split("\0")[:-1]


def _without_redirect(command: str, tokens: list[str]) -> str:
    ops = [i for i, t in enumerate(tokens) if set(t) <= OPERATORS]
    assert [tokens[i] for i in ops] == [">"] and ops[0] == len(tokens) - 2, f"shell operators in {command!r}"
    assert (ROOT / tokens[-1]).exists(), f"{command!r} writes to {tokens[-1]}, which is not in the repository"
    return command[: command.rindex(">")].rstrip()


def split_env(argv: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """Leading ``NAME=value`` words (the command's environment) and the rest."""
    env: dict[str, str] = {}
    rest = list(argv)
    while rest and "=" in rest[0] and rest[0].split("=")[0].isidentifier():
        name, _, value = rest.pop(0).partition("=")
        env[name] = value
    return env, rest


def check_serve(argv: Sequence[str], env: Mapping[str, str]) -> None:
    """``kvroute serve ...``: the gateway's own settings loader (flags, TOML, environment, converters)."""
    load_settings(argv[2:], env={k: v for k, v in env.items() if k.startswith("KVROUTE_")})


def check_sglang_flags(argv: Sequence[str]) -> None:
    """SGLang's (or ``kvroute emulate``'s) flags, by the emulator's parser: every flag must be one it
    knows, so none is a typo that SGLang would refuse."""
    cfg = parse_emulator(argv)
    assert not cfg.ignored_flags, f"flags the emulator does not know: {cfg.ignored_flags}"


def check_make(argv: Sequence[str]) -> None:
    """``make TARGET...``: every target exists in the Makefile (``make -n``: nothing is run)."""
    done = subprocess.run(["make", "-n", *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


@contextmanager
def stop_after_parsing() -> Iterator[None]:
    """Every argparse parser raises ``Parsed`` once it accepted its command line."""
    real = argparse.ArgumentParser.parse_args

    def parse(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> argparse.Namespace:
        raise Parsed(real(self, *args, **kwargs))

    with mock.patch.object(argparse.ArgumentParser, "parse_args", parse):
        yield


def check_parsed(run: Callable[[], object]) -> None:
    """Runs a command until its parser accepted the arguments (a command without one runs to its end)."""
    with stop_after_parsing():
        try:
            code = run()
        except Parsed:
            return
        except SystemExit as e:
            code = e.code
    assert code in (0, None), f"exit status {code}"


def check_kvroute(argv: Sequence[str]) -> None:
    check_parsed(lambda: kvroute_main(list(argv[1:])))


def check_module(argv: Sequence[str]) -> None:
    """``python -m MODULE ...`` run as Python would run it (``runpy``), stopped once parsed."""
    with mock.patch.object(sys, "argv", [argv[2], *argv[3:]]), warnings.catch_warnings():
        # a module an earlier test imported is run afresh as __main__, which is what this warning is about
        warnings.filterwarnings("ignore", "'.*' found in sys.modules", RuntimeWarning)
        check_parsed(lambda: runpy.run_module(argv[2], run_name="__main__", alter_sys=True))


def check_launch_script(command: str, env: Mapping[str, str]) -> None:
    """A line running deploy/sglang/launch.sh: run by bash with DRY_RUN=1 (it prints the SGLang command it
    would start, one argument per line), then that command's flags are checked."""
    done = subprocess.run(
        ["bash", "-c", command], env={**env, "DRY_RUN": "1"}, cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    printed = done.stdout.splitlines()
    assert printed[1:3] == ["-m", "sglang.launch_server"], printed
    check_sglang_flags(printed[3:])


def check_docker(argv: Sequence[str]) -> None:
    """``docker compose -f FILE [--profile P] ...``: the file exists and has that profile."""
    assert argv[1] == "compose" and "-f" in argv, f"no rule for {shlex.join(argv)}"
    doc = yaml.safe_load((ROOT / argv[argv.index("-f") + 1]).read_text())
    profiles = {p for s in doc["services"].values() for p in s.get("profiles", [])}
    if "--profile" in argv:
        assert argv[argv.index("--profile") + 1] in profiles, profiles


def check_kubectl(argv: Sequence[str]) -> None:
    """``kubectl apply -k DIR``: DIR is a kustomization (tests/deploy renders and validates them)."""
    assert argv[1:3] == ["apply", "-k"], f"no rule for {shlex.join(argv)}"
    assert (ROOT / argv[3] / "kustomization.yaml").is_file(), argv[3]


def environment(extra: Mapping[str, str]) -> dict[str, str]:
    """The environment commands run in: this process's, the docs' variables, kvroute's CLI first on PATH."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, "PATH": path, **extra}
