"""The `kvroute` command: one entry point, one sub-command per package.

    kvroute serve    the gateway            (proxy.server)
    kvroute emulate  emulated SGLang fleet  (emulator.cli)
    kvroute bench    the fleet benchmark    (bench.cli)
    kvroute demo     gateway + 3 emulated replicas + a short workload (bench.demo)
    kvroute probe    HiCache eviction-reuse probe of a replica or gateway (diag.probe)
    kvroute ab       cold/hot A/B of one or more replicas or gateways (diag.ab)
    kvroute warm     warm documents on a kvroute fleet (diag.warm)
    kvroute status   a gateway's live status in the terminal (diag.status)

Sub-commands are imported lazily by name, so that the gateway never imports the emulator or the bench.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence

from proxy.config.flags import kvroute_version

_COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("proxy.server", "the OpenAI-compatible gateway"),
    "emulate": ("emulator.cli", "emulated SGLang replicas"),
    "bench": ("bench.cli", "the fleet benchmark"),
    "demo": ("bench.demo", "gateway + 3 emulated replicas + a short workload"),
    "probe": ("diag.probe", "HiCache eviction-reuse probe (cold, pressure, re-send, re-send)"),
    "ab": ("diag.ab", "cold/hot A/B with /flush_cache, median of 3 runs"),
    "warm": ("diag.warm", "warm documents on a kvroute fleet before their first question"),
    "status": ("diag.status", "a gateway's live status: replicas, load, fill, hit ratio, decisions"),
}


def _usage() -> str:
    lines = ["usage: kvroute <command> [options]    (kvroute <command> -h for its options)", "", "commands:"]
    lines += [f"  {name:<8} {help_}" for name, (_, help_) in _COMMANDS.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _dispatch(list(sys.argv[1:] if argv is None else argv))
    except BrokenPipeError:  # `kvroute -h | head -3`: the reader left, nothing to report
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python flushes stdout again at exit
        return 0


def _dispatch(args: list[str]) -> int:
    if not args or args[0] in {"-h", "--help"}:
        print(_usage(), flush=True)
        return 0 if args else 2
    if args[0] == "--version":
        print(f"kvroute {kvroute_version()}", flush=True)
        return 0
    if args[0] not in _COMMANDS:
        print(f"kvroute: unknown command {args[0]!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(_COMMANDS[args[0]][0])
    entry: Callable[[list[str]], int] = module.main
    return entry(args[1:])


if __name__ == "__main__":
    sys.exit(main())
