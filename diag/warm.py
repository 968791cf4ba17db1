"""``kvroute warm FILE... --gateway URL``: warm documents on a kvroute fleet before their first question.

    kvroute warm docs/*.md --gateway http://127.0.0.1:8080 [--model M] [--replicas K|all] [--ttl 3600]
                 [--layout system|user|text] [--batch 50] [--admin-key K [--tenant T] | --api-key K]
                 [--json]

Files: ``.txt`` and ``.md`` are one document each (id: the file name), warmed in ``--layout``:
``system`` (default: the document is the system message, as many RAG frameworks build it), ``user``
(the user message starts with the document, the question follows it), or ``text`` (a plain prompt, for
``/v1/completions``). ``.jsonl`` files hold one document per line: ``{"id"?, "text"}`` or
``{"id"?, "messages"}`` (the messages later requests start with, exactly). Documents go in batches of
``--batch`` to ``POST /v1/warmup``; progress (documents and tokens warm, elapsed) is drawn on stderr
while the gateway works, from ``GET /v1/warmup/{id}``; the end is a table per document: tokens,
replicas, the tier it sits in per the gateway's cache model, status, seconds, warnings.

Tenants (``--api-keys`` on the gateway): a client ``--api-key`` warms the documents into its own
tenant's namespace, where only that tenant's requests find them; the ``--admin-key`` warms for no
tenant, or for ``--tenant T``. The table names the tenant of each document. ``--help`` prints the same
in plain text (``DESCRIPTION``, ``EPILOG``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from diag.client import DiagError, SGLangClient
from diag.options import positive_float, positive_int, url

POLL_S = 0.5
TEXT_SUFFIXES = (".txt", ".md", ".markdown", ".rst")
DESCRIPTION = """\
Warm documents on a kvroute fleet before their first question: each document is prefilled on
--replicas replicas through the gateway's POST /v1/warmup and kept warm for --ttl seconds."""
EPILOG = """\
files:
  .txt .md      one document each (its id: the file name), laid out as --layout says:
                  system  the document is the system message (as many RAG frameworks build it)
                  user    the user message starts with the document, the question follows it
                  text    a plain prompt, for /v1/completions
  .jsonl        one document per line: {"id": ..., "text": ...} or {"id": ..., "messages": [...]}
                (the messages later requests start with, exactly); the id is optional

Progress is drawn on stderr; the end is a table: per document its tokens, replicas, the tier it sits
in per the gateway's cache model, status, seconds and warnings. The exit status is 0 when every
document is warm.

tenants (the gateway's --api-keys): --api-key K warms into that key's tenant, where only its requests
find the documents; --admin-key K warms for no tenant, or for --tenant T.

example:
  kvroute warm docs/*.md --gateway http://127.0.0.1:8080 --replicas 2 --ttl 7200
"""


def read_documents(paths: list[Path], layout: str) -> list[dict[str, Any]]:
    """The warm-up documents of ``paths`` (see the module docstring); DiagError naming a bad file."""
    docs: list[dict[str, Any]] = []
    for path in paths:
        if path.suffix == ".jsonl":
            docs.extend(_jsonl(path))
        elif path.suffix in TEXT_SUFFIXES:
            docs.append(_text_document(path.name, _read(path), layout))
        else:
            raise DiagError(f"{path}: expected .txt, .md or .jsonl")
    return docs


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DiagError(f"{path}: {e}") from None


def _text_document(doc_id: str, text: str, layout: str) -> dict[str, Any]:
    if layout == "text":
        return {"id": doc_id, "text": text}
    return {"id": doc_id, "messages": [{"role": "system" if layout == "system" else "user", "content": text}]}


def _jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    for n, line in enumerate(_read(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            doc = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            raise DiagError(f"{path}:{n}: not JSON: {e}") from None
        if not isinstance(doc, dict) or ("text" in doc) == ("messages" in doc):
            raise DiagError(f"{path}:{n}: expected an object with 'text' or 'messages'")
        out.append({"id": f"{path.stem}-{n}", **doc})
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvroute warm",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("files", nargs="+", type=Path, help="documents: .txt, .md or .jsonl files")
    p.add_argument("--gateway", type=url, required=True, help="the kvroute gateway's base URL")
    p.add_argument("--model", help="model name (default: the gateway's only model)")
    p.add_argument("--replicas", default="1", help="replicas per document: a number or 'all' (default 1)")
    p.add_argument("--ttl", type=positive_float, default=3600.0, help="seconds to keep re-warming (3600)")
    p.add_argument(
        "--layout",
        choices=("system", "user", "text"),
        default="system",
        help="how a .txt or .md document is sent (default system; see below)",
    )
    p.add_argument("--batch", type=positive_int, default=50, help="documents per request (50)")
    key = p.add_mutually_exclusive_group()
    key.add_argument("--admin-key", help="the gateway's admin key, when it has one")
    key.add_argument("--api-key", help="a client API key: warm into its own tenant's namespace")
    p.add_argument("--tenant", help="with --admin-key: the tenant whose namespace the documents go to")
    p.add_argument("--json", action="store_true", help="print the jobs as JSON")
    return p


async def warm(args: argparse.Namespace) -> list[dict[str, Any]]:
    docs = read_documents(args.files, args.layout)
    replicas: int | str = "all" if args.replicas == "all" else int(args.replicas)
    if args.tenant and not args.admin_key:
        raise DiagError("--tenant needs --admin-key (a client key warms its own tenant)")
    async with SGLangClient(args.gateway, api_key=args.admin_key or args.api_key) as client:
        model = args.model or await _only_model(client)
        jobs = []
        tenant = {"tenant": args.tenant} if args.tenant else {}
        for start in range(0, len(docs), args.batch):
            body = {"model": model, "documents": docs[start : start + args.batch], "replicas": replicas}
            body |= tenant
            status, raw = await client.request("POST", "/v1/warmup", orjson.dumps({**body, "ttl": args.ttl}))
            if status != 202:
                raise DiagError(
                    f"POST /v1/warmup answered HTTP {status}: {raw[:300].decode(errors='replace')}"
                )
            jobs.append(orjson.loads(raw)["id"])
        return await _follow(client, jobs, len(docs))


async def _only_model(client: SGLangClient) -> str:
    models = [m["id"] for m in (await client.get_json("/v1/models")).get("data", [])]
    if len(models) != 1:
        raise DiagError(
            f"the gateway serves {len(models)} models: name one with --model ({', '.join(models)})"
        )
    return str(models[0])


async def _follow(client: SGLangClient, job_ids: list[str], total: int) -> list[dict[str, Any]]:
    started, tty = time.monotonic(), sys.stderr.isatty()
    while True:
        jobs = [await client.get_json(f"/v1/warmup/{j}") for j in job_ids]
        docs = [d for j in jobs for d in j["documents"]]
        done = [d for d in docs if d["status"] not in ("queued", "warming")]
        tokens = sum(d["tokens"] for d in done)
        elapsed = time.monotonic() - started
        line = f"kvroute warm  {len(done):>5}/{total} documents  {tokens:>12,} tokens  {elapsed:7.1f} s"
        finished = all(j["status"] == "done" for j in jobs)
        if tty or finished:
            sys.stderr.write(("\r" + line + "\x1b[K") if tty else line + "\n")
        if finished:
            if tty:
                sys.stderr.write("\n")
            return jobs
        await asyncio.sleep(POLL_S)


def table(jobs: list[dict[str, Any]]) -> str:
    rows = [
        "| document | tenant | tokens | replicas | tier | status | seconds | warnings |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for job, d in ((jb, doc) for jb in jobs for doc in jb["documents"]):
        reps = d["replicas"]
        tiers = ", ".join(str(r.get("now", {}).get("tier", "?")) for r in reps) or "-"
        seconds = max((r["seconds"] for r in reps), default=0.0)
        warn = "; ".join(d["warnings"]) or ""
        cells = [d["id"], job.get("tenant") or "-", f"{d['tokens']:,}", str(len(reps)), tiers, d["status"]]
        cells += [f"{seconds:.2f}", warn]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        jobs = asyncio.run(warm(args))
    except DiagError as e:
        print(f"kvroute warm: {e}", file=sys.stderr)
        return 1
    print(orjson.dumps(jobs, option=orjson.OPT_INDENT_2).decode() if args.json else table(jobs))
    return 0 if all(d["status"] == "warm" for j in jobs for d in j["documents"]) else 1
