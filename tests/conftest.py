"""Shared fixtures. Nothing here imports torch at collection time: tests/app must run without it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import pytest

REPO = Path(__file__).resolve().parent.parent
# Caches (latents, check-data fingerprints) never go to the user's home from a test; subprocesses
# inherit this through dmad_env().
os.environ["DMAD_CACHE_DIR"] = tempfile.mkdtemp(prefix="dmad-test-cache-")
# The suite runs in pytest-xdist workers, one per core (pyproject addopts). Each worker and the
# engine processes it starts get one OpenMP thread: two processes with two threads each on two
# cores spin against each other and run many times slower, not twice.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
# As the CLI does (dmad.cli): MKL results independent of memory alignment, for the tests that run
# the loop in process and compare bits (set before torch loads MKL).
os.environ.setdefault("MKL_CBWR", "AUTO")


def _deep_update(base: dict, extra: dict) -> dict:
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _deep_update(base[k], v)
        else:
            base[k] = v
    return base


def dmad_env() -> dict[str, str]:
    """Environment for a `python -m dmad` subprocess: the checkout on the path, no network."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONIOENCODING="utf-8")
    return env


def dmad_in_process(*args: str) -> int:
    """The CLI's main() in this process: the whole command (preflight, exit codes, one-line errors on
    stderr) but the process around it, for tests where the process boundary is not what is tested.
    A CLI start costs ~7 s of imports (torch, diffusers, transformers) on these 2 cores. A run
    leaves no accelerate state behind (dmad.train.run_open), so runs of any precision can follow
    each other in one process."""
    from dmad.cli import main

    return main(list(args))


def dmad_captured(capsys, *args: str) -> tuple[int, str, str]:
    """dmad_in_process with what the command wrote: (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = dmad_in_process(*args)
    out, err = capsys.readouterr()
    return code, out, err


def run_dmad(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """The real CLI, as a user's script would start it."""
    from dmad.contract.paths import engine_argv

    return subprocess.run(engine_argv(*args), cwd=cwd, env=dmad_env(), capture_output=True, text=True,
                          timeout=timeout)


def gone(pid: int) -> bool:
    """The process is dead: no longer in /proc, or a zombie nobody reaped yet."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


@pytest.fixture(scope="session")
def tiny_teacher(tmp_path_factory) -> Path:
    """A tiny random SD-layout diffusers pipeline folder, built once per session (~1 s + torch import)."""
    from dmad.testing.tiny import make_tiny_sd_pipeline

    path = tmp_path_factory.mktemp("tiny_teacher") / "tiny-sd"
    make_tiny_sd_pipeline(path)
    return path


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """8 captioned 32 px images (coloured squares)."""
    from dmad.testing.tiny import make_caption_folder

    return make_caption_folder(tmp_path_factory.mktemp("tiny_data") / "squares", n=8, size=32)


@pytest.fixture(scope="session")
def tiny_prompt_set(tmp_path_factory) -> Path:
    """Two prompts at 32 px, so tests do not depend on the built-in demo set."""
    path = tmp_path_factory.mktemp("prompts") / "tiny_v1.json"
    path.write_text(json.dumps({
        "prompt_set": "tiny", "version": "v1", "resolution": [32, 32], "seed": 0, "steps": 2,
        "items": [{"id": "red", "topic": "colour", "prompt": "a red square on a black background"},
                  {"id": "blue", "topic": "colour", "prompt": "a blue square on a black background"}],
    }), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def health_prompt_set(tmp_path_factory) -> Path:
    """tiny_prompt_set's prompts with 2 health seeds each (health signals on)."""
    path = tmp_path_factory.mktemp("health_prompts") / "tiny_v2.json"
    path.write_text(json.dumps({
        "prompt_set": "tiny", "version": "v2", "resolution": [32, 32], "seed": 0, "steps": 2, "health_seeds": 2,
        "items": [{"id": "red", "topic": "colour", "prompt": "a red square on a black background"},
                  {"id": "blue", "topic": "colour", "prompt": "a blue square on a black background"}],
    }), encoding="utf-8")
    return path


def tiny_config_dict(teacher: Path, data: Path, prompt_set: Path, output_dir: Path) -> dict[str, Any]:
    return {
        "config_version": 1,
        "identity": {"pretrained_model_name_or_path": str(teacher), "train_data_dir": str(data),
                     "output_dir": str(output_dir), "run_name": "tiny"},
        "resources": {"resolution": 32, "train_batch_size": 1},
        "optimization": {"max_train_steps": 2},
        "observation": {"prompt_set": str(prompt_set), "checkpointing_steps": 2},
    }



def train_tiny_run(base: Path, teacher: Path, data: Path, prompt_set: Path, steps: int) -> tuple[Path, Path]:
    """(config, run folder) of a finished tiny run of `steps` iterations under `base`, a checkpoint
    every 2, trained in process through the command line."""
    from dmad.cli import main

    cfg = tiny_config_dict(teacher, data, prompt_set, base / "runs")
    cfg["optimization"]["max_train_steps"] = steps
    config = base / "config.json"
    config.write_text(json.dumps(cfg))
    assert main(["train", "--config", str(config), "--run-dir", str(base / "run")]) == 0
    return config, base / "run"

@pytest.fixture
def write_config(tmp_path, tiny_teacher, tiny_data, tiny_prompt_set) -> Callable[..., Path]:
    """write_config(extra=None, name="config.json") -> path of a valid tiny config in tmp_path,
    with `extra` deep-merged over it (runs go to tmp_path/runs/tiny)."""
    def write(extra: dict | None = None, name: str = "config.json") -> Path:
        cfg = tiny_config_dict(tiny_teacher, tiny_data, tiny_prompt_set, tmp_path / "runs")
        path = tmp_path / name
        path.write_text(json.dumps(_deep_update(cfg, extra or {}), indent=2), encoding="utf-8")
        return path
    return write


@pytest.fixture
def dmad_cli(tmp_path) -> Callable[..., subprocess.CompletedProcess]:
    """dmad_cli("train", "--config", ...) runs the real CLI in tmp_path."""
    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return run_dmad(*args, cwd=tmp_path, timeout=timeout)
    return run


@pytest.fixture
def run_python(tmp_path) -> Callable[..., subprocess.CompletedProcess]:
    """run_python(code) runs `python -c code` in tmp_path with the checkout importable."""
    def run(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=dmad_env(),
                              capture_output=True, text=True, timeout=timeout)
    return run


@pytest.fixture(autouse=True)
def _no_leaked_processes_or_threads():
    """A test that leaves a child process (an engine, a probe point, a process pool) or a Python
    thread of its own running fails, after a grace period for ones that are already ending; what
    is left is killed so the next test starts clean."""
    import threading

    import psutil

    me = psutil.Process()
    procs_before = {p.pid for p in me.children(recursive=True)}
    threads_before = set(threading.enumerate())
    yield
    new = [p for p in me.children(recursive=True) if p.pid not in procs_before]
    _, alive = psutil.wait_procs(new, timeout=15)
    alive = [p for p in alive if _running(p)]
    for p in alive:
        p.kill()
    threads = [t for t in threading.enumerate() if t not in threads_before and not t.daemon]
    for t in threads:
        t.join(timeout=15)
    threads = [t.name for t in threads if t.is_alive()]
    assert not alive, f"the test left processes running: {[' '.join(_cmdline(p))[:200] for p in alive]}"
    assert not threads, f"the test left threads running: {threads}"


def _running(p) -> bool:
    import psutil

    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _cmdline(p) -> list[str]:
    import psutil

    try:
        return p.cmdline()
    except psutil.Error:
        return [str(p.pid)]


# The heaviest test files first (measured: seconds per file on 2 cores, `pytest --durations=0`).
# With --dist loadfile a file runs whole on one worker; a long file that started last would keep
# one worker busy while the other idles, so the long ones go first and the short ones fill in.
# pytest-xdist reorders files by their number of tests unless told not to (--no-loadscope-reorder in
# pyproject's addopts): without it this order was ignored and the 3-test multiprocess file, the
# heaviest, ran last (the suite's last ~2 minutes on one worker).
HEAVY_FIRST = ["tests/e2e/test_multiprocess.py", "tests/e2e/test_train.py", "tests/e2e/test_train_variants.py",
               "tests/e2e/test_demo.py", "tests/engine/test_memory.py", "tests/e2e/test_export.py",
               "tests/engine/test_probe.py", "tests/app/test_memory_panel.py", "tests/e2e/test_train_families.py",
               "tests/e2e/test_sample.py", "tests/e2e/test_app_e2e.py", "tests/engine/test_bad_input.py"]


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: file order kept
