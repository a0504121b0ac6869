"""The bundle's one executable (packaging/entry.py) and `dmad-studio --self-test`, checked from the
source checkout; bench/package.py builds the real bundle and runs the same self-test in it."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, dmad_env


def _run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(dmad_env(), QT_QPA_PLATFORM="offscreen")
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_the_entry_answers_the_engine_and_the_app_command_lines():
    engine = _run(str(REPO / "packaging" / "entry.py"), "train", "--help")
    assert engine.returncode == 0 and engine.stdout.startswith("usage: dmad train")
    assert "--num-processes" in engine.stdout
    app = _run(str(REPO / "packaging" / "entry.py"), "--help")
    assert app.returncode == 0 and app.stdout.startswith("usage: dmad-studio") and "--self-test" in app.stdout
    launcher = _run(str(REPO / "packaging" / "entry.py"), "accelerate-launch", "--help")
    assert launcher.returncode == 0 and "--num_processes" in launcher.stdout


@pytest.mark.slow
def test_self_test_dry_runs_the_demo_through_the_engine_and_builds_the_window():
    r = _run("-m", "app", "--self-test", timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("self-test engine: ok: engine dry run of the demo config")
    assert lines[1].startswith("self-test app: ok: main window built (8 panels")
    assert lines[-1] == "self-test: passed"


def test_self_test_reports_a_broken_engine_in_one_line(tmp_path, monkeypatch):
    from app import selftest

    monkeypatch.setattr(selftest, "engine_argv", lambda *args: [sys.executable, "-c", "import sys; "
                                                                "print('dmad: error: broken', file=sys.stderr); "
                                                                "sys.exit(2)", *args])
    ok, what = selftest.check_engine()
    assert not ok and what == "engine dry run of the demo config exited 2: dmad: error: broken"
    assert os.environ.get("QT_QPA_PLATFORM")  # the suite runs off screen
