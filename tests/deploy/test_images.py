"""deploy/Dockerfile (no engine here to build it: its instructions are read and checked) and
deploy/sglang/launch.sh (run with DRY_RUN=1 for each env file; its argv parsed as SGLang flags).
"""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
import tomllib

import pytest

from emulator.config import parse_args
from tests.deploy.manifests import DEPLOY, LAUNCH, ROOT, caching_flags, env_file, launch_argv

ENV_FILES = sorted(p.name for p in (DEPLOY / "sglang").glob("*.env"))


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def final_stage() -> list[tuple[str, str]]:
    steps = instructions()
    last = max(i for i, (op, _) in enumerate(steps) if op == "FROM")
    return steps[last:]


def included(path: str) -> bool:
    """Whether deploy/Dockerfile.dockerignore lets ``path`` into the build context (last match wins)."""
    keep = True
    for raw in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines():
        rule = raw.strip()
        if not rule or rule.startswith("#"):
            continue
        negated, pattern = rule.startswith("!"), rule.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/"):
            keep = negated
    return keep


def test_the_image_runs_as_a_non_root_user_with_a_health_check_on_health() -> None:
    final = dict((op, arg) for op, arg in final_stage() if op in {"USER", "HEALTHCHECK", "ENTRYPOINT", "ENV"})
    user = final["USER"].split(":")[0]
    assert user.isdigit() and int(user) > 0
    assert json.loads(final["ENTRYPOINT"]) == ["kvroute"]
    health = json.loads(final["HEALTHCHECK"].split("CMD", 1)[1])
    copies = {
        arg.split()[-1]: arg.split()[-2] for op, arg in final_stage() if op == "COPY" and "--from" not in arg
    }
    assert health[1] in copies and (ROOT / copies[health[1]]).is_file()  # the script the test runs
    assert "KVROUTE_HOST=0.0.0.0" in final["ENV"]


def test_the_build_copies_every_package_and_the_context_lets_them_in() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    sources = [
        w for op, arg in instructions() if op == "COPY" and "--from" not in arg for w in arg.split()[:-1]
    ]
    assert packages | {"pyproject.toml", "README.md"} <= set(sources)
    for source in sources:
        assert (ROOT / source).exists() and included(source), source
    assert included("emulator/model/tokenizer.json") and not included(".venv/bin/python")
    assert not included("tests/conftest.py")


@pytest.mark.parametrize("name", ENV_FILES)
def test_every_env_file_launches_write_back_with_cache_reports_and_metrics(name: str) -> None:
    env = env_file(name)
    argv = launch_argv(env)
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    cfg = parse_args(argv[3:])  # the emulator takes SGLang's flags, with SGLang's names and meaning
    assert cfg.enable_cache_report and cfg.enable_metrics and cfg.chunked_prefill_size > 0
    if env.get("DISAGGREGATION_MODE") == "decode":  # SGLang refuses HiCache on a decode server (docs/pd.md)
        assert not cfg.hicache and cfg.pd.mode == "decode"
        return
    assert (cfg.hicache, cfg.hicache_write_policy) == (True, "write_back")
    flags = caching_flags(argv)
    assert ("--hicache-size" in flags) != ("--hicache-ratio" in flags)  # exactly one sizes the host pool


def test_the_host_pool_size_overrides_the_ratio_and_a_storage_dir_turns_on_the_file_backend() -> None:
    flags = caching_flags(launch_argv({"MODEL_PATH": "m", "HICACHE_SIZE_GB": "40", "HICACHE_RATIO": "3"}))
    assert flags["--hicache-size"] == "40" and "--hicache-ratio" not in flags
    assert "--hicache-storage-backend" not in flags
    flags = caching_flags(launch_argv({"MODEL_PATH": "m", "HICACHE_STORAGE_DIR": "/tmp/l3"}))
    assert flags["--hicache-ratio"] == "2" and flags["--hicache-storage-backend"] == "file"


def test_launch_refuses_to_start_without_a_model() -> None:
    done = subprocess.run(
        ["bash", str(LAUNCH)], env={"DRY_RUN": "1"}, capture_output=True, text=True, timeout=30
    )
    assert done.returncode != 0 and "set MODEL_PATH" in done.stderr
