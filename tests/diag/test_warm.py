"""``kvroute warm``: files to documents, a warm-up through a real gateway with progress, the table."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from diag.client import DiagError
from diag.warm import main, parser, read_documents, table, warm
from tests.conftest import Emulators, StartGateway

FLAGS = (
    "--enable-cache-report",
    "--emu-time-scale",
    "0.01",
    "--enable-hierarchical-cache",
    "--hicache-write-policy",
    "write_back",
)


def _write(tmp: Path) -> list[Path]:
    (tmp / "a.md").write_text("# A\n" + "alpha beta gamma " * 400)
    (tmp / "b.txt").write_text("delta epsilon " * 500)
    lines = [
        {"id": "c", "text": "zeta eta " * 300},
        {"messages": [{"role": "system", "content": "iota " * 900}]},
    ]
    (tmp / "more.jsonl").write_text("\n".join(orjson.dumps(x).decode() for x in lines) + "\n\n")
    return [tmp / "a.md", tmp / "b.txt", tmp / "more.jsonl"]


def test_files_become_documents_in_the_chosen_layout(tmp_path: Path) -> None:
    paths = _write(tmp_path)
    docs = read_documents(paths, "user")
    assert [d["id"] for d in docs] == ["a.md", "b.txt", "c", "more-2"]
    assert docs[0]["messages"][0]["role"] == "user" and docs[2]["text"].startswith("zeta")
    assert read_documents(paths[:1], "text")[0]["text"].startswith("# A")
    (tmp_path / "x.pdf").write_bytes(b"%PDF")
    with pytest.raises(DiagError, match=r"x\.pdf"):
        read_documents([tmp_path / "x.pdf"], "system")
    (tmp_path / "bad.jsonl").write_text('{"id": "no body"}\n')
    with pytest.raises(DiagError, match=r"bad\.jsonl:1"):
        read_documents([tmp_path / "bad.jsonl"], "system")


async def test_warm_through_a_gateway(
    tmp_path: Path, emulator_server: Emulators, gateway: StartGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    replicas = [await emulator_server(*FLAGS), await emulator_server(*FLAGS)]
    gw = await gateway([r.url for r in replicas], admin_key="k")
    args = parser().parse_args(
        [*map(str, _write(tmp_path)), "--gateway", gw.url, "--admin-key", "k", "--batch", "3"]
    )
    jobs = await warm(args)
    assert len(jobs) == 2  # four documents in batches of three
    docs = [d for j in jobs for d in j["documents"]]
    assert [d["status"] for d in docs] == ["warm"] * 4
    assert {r["replica"] for d in docs for r in d["replicas"]} == {r.url for r in replicas}  # spread
    text = table(jobs)
    assert text.count("| warm |") == 4 and "a.md" in text and "gpu" in text
    assert "4/4 documents" in capsys.readouterr().err  # the progress line


def test_an_unreachable_gateway_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.txt").write_text("x")
    assert main([str(tmp_path / "a.txt"), "--gateway", "http://127.0.0.1:9"]) == 1
    assert capsys.readouterr().err.startswith("kvroute warm: cannot connect")


def test_help_is_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "``" not in text and "kvroute warm docs/*.md --gateway" in text  # no RST; an example
    assert "system  the document is the system message" in text and ".jsonl" in text
    assert max(len(line) for line in text.splitlines()) <= 110
