"""Processes that die with their parent (dmad.train.children), without torch: an "engine" starts a
"launcher" as the engine starts `accelerate launch`, which starts a "rank" in a session of its own
as torch's launcher does. A SIGKILL to the engine alone (no group: what no Kill of the app or a
terminal can pass on) ends the launcher and the rank."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from tests.conftest import dmad_env, gone

pytestmark = pytest.mark.skipif(os.name != "posix", reason="signals and sessions are POSIX")

ENGINE = textwrap.dedent("""
    import os, subprocess, sys
    from dmad.train.children import ENGINE_PID_ENV, die_with_parent_preexec
    env = dict(os.environ, **{ENGINE_PID_ENV: str(os.getpid())})
    launcher = subprocess.Popen([sys.executable, "-c", sys.argv[1], *sys.argv[2:]], env=env,
                                preexec_fn=die_with_parent_preexec(os.getpid()))
    launcher.wait()
""")
LAUNCHER = textwrap.dedent("""
    import subprocess, sys
    subprocess.Popen([sys.executable, "-c", sys.argv[1], *sys.argv[2:]], start_new_session=True).wait()
""")
RANK = textwrap.dedent("""
    import os, sys, time
    from dmad.train import children
    if sys.argv[2] == "watch":  # the fallback of systems without prctl
        children._prctl_pdeathsig = lambda sig: False
    children.rank_dies_with_launcher()
    open(sys.argv[1] + ".tmp", "w").write(str(os.getpid()))
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    time.sleep(600)
""")


@pytest.mark.parametrize("how", ["prctl", "watch"])
def test_a_killed_engine_takes_its_launcher_and_ranks(how, tmp_path):
    ready = tmp_path / "rank.pid"
    engine = subprocess.Popen([sys.executable, "-c", ENGINE, LAUNCHER, RANK, str(ready), how], env=dmad_env())
    kids: list = []
    try:
        deadline = time.monotonic() + 60  # hang guards, not performance targets
        while not ready.exists() and engine.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), "the rank never started"
        kids = psutil.Process(engine.pid).children(recursive=True)
        assert int(ready.read_text()) in [k.pid for k in kids] and len(kids) == 2
        engine.send_signal(signal.SIGKILL)
        engine.wait()
        deadline = time.monotonic() + 60
        while not all(gone(k.pid) for k in kids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [k.pid for k in kids if not gone(k.pid)] == [], "a child outlived the engine"
    finally:  # after a failure only
        for p in [engine, *kids]:
            try:
                p.kill()
            except (OSError, psutil.Error):
                pass


def test_engine_entry_points_skip_the_last_collection_and_keep_the_exit_code():
    """`dmad` / `python -m dmad` (dmad.cli.entry) and the multi-process launcher
    (dmad.train.accelerate_launch) freeze the garbage collector once their work is done, so the
    interpreter's shutdown does not walk torch's objects again; the exit code is main()'s. In a
    process of its own: tests/app/conftest.py keeps its own freeze in this one."""
    from dmad.train.launch import accelerate_command

    probe = ("import gc, sys; from dmad.cli import entry; "
             "code = entry(['train', '--config', '/nonexistent/dmad-config.json']); "
             "print(code, gc.get_freeze_count() > 0)")
    out = subprocess.run([sys.executable, "-c", probe], env=dmad_env(), capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["2", "True"], out.stderr[-2000:]
    assert "/nonexistent/dmad-config.json" in out.stderr
    assert accelerate_command(["--config", "c.json"], 2)[:3] == [sys.executable, "-m", "dmad.train.accelerate_launch"]
