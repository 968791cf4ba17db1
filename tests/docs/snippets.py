"""The fenced code blocks of README.md and docs/*.md, and the commands of the shell ones.

A block is three backticks, a language word (``python``, ``bash``, ``toml``, ...), the code, and three
backticks again. Words after the language on the opening line are ignored (Markdown ignores them too).
A shell block holds commands exactly as typed: one per line, ``\\`` joins a line to the next, and ``#``
starts a comment (a line that is only a comment is no command).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHELL = ("bash", "sh", "shell")
FENCE = re.compile(r"^(?P<indent> {0,3})```(?P<info>[^`]*)$")


@dataclass(frozen=True, slots=True)
class Snippet:
    """One fenced block: where it is, its language (``""`` when none is given) and its text."""

    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def pages() -> list[Path]:
    """README.md and every page of docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def snippets(path: Path) -> list[Snippet]:
    """The fenced blocks of one Markdown file, in order; an unclosed fence is an error."""
    found: list[Snippet] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        end = _closing(lines, i, path)
        lang = m["info"].split()[0].lower() if m["info"].split() else ""
        body = [line[len(m["indent"]) :] for line in lines[i + 1 : end]]
        found.append(Snippet(path, i + 1, lang, "\n".join(body) + "\n"))
        i = end + 1
    return found


def _closing(lines: list[str], start: int, path: Path) -> int:
    for j in range(start + 1, len(lines)):
        if lines[j].strip() == "```":
            return j
    raise ValueError(f"{path.name}:{start + 1}: a fenced block that is never closed")


def commands(text: str) -> list[str]:
    """A shell block's commands: continuation lines joined, comment lines and blank lines left out."""
    out: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = pending + raw.strip()
        if line.endswith("\\"):
            pending = line[:-1].rstrip() + " "
            continue
        pending = ""
        if line and shlex.split(line, comments=True):
            out.append(line)
    if pending:
        raise ValueError(f"a command ends with a line continuation: {pending!r}")
    return out


def words(command: str) -> list[str]:
    """The command's words as the shell would split them, comments dropped (no expansion)."""
    return shlex.split(command, comments=True)
