"""Processes that must not outlive the process that started them. Torch-free.

`dmad demo` and the engine of a multi-process run wait for a child (the engine, `accelerate
launch`) and pass a stop on to it (stops_passed_on).

A multi-process run is three generations: the engine (`dmad train --num-processes N`, the
launcher the app or a terminal started), `accelerate launch` (its child) and the ranks
(accelerate's children). The app's Stop and Kill reach the engine's process group; accelerate
stays in that group, but torch's launcher puts every rank in a session of its own, which no
signal to the engine's group reaches. So each generation dies with its parent:

- On Linux the kernel does it: PR_SET_PDEATHSIG(SIGKILL) (prctl), set in accelerate's process by
  the engine before exec (Popen's preexec_fn) and by each rank at its start. It fires however the
  parent ends (Kill, the OOM killer, a crash), needs no thread and also ends a rank that hangs in a
  collective or holds the GIL. A parent that ended before the setting took effect is caught by
  checking the parent afterwards. (It fires when the parent's *thread* that started the child
  ends: the engine waits for accelerate in the thread that started it, and torch's launcher
  starts and watches its ranks from its main thread.)
- Elsewhere (POSIX without prctl) a daemon thread polls every POLL_S whether the parent changed
  (this process was re-parented) or the engine is gone, and then kills this process.

SIGKILL, not SIGTERM: with its launcher gone nobody reports the run's end anyway (status.json
names rank 0's pid, so a reader sees a dead engine, dmad.contract.runs.effective_state), a
graceful stop needs every rank in step, and a rank stuck in a collective would never see SIGTERM.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Iterator, Optional

ENGINE_PID_ENV = "DMAD_ENGINE_PID"  # the launcher's pid, for its ranks
PR_SET_PDEATHSIG = 1
POLL_S = 1.0


def _prctl_pdeathsig(sig: int) -> bool:
    """This process gets `sig` when its parent (thread) ends; False where there is no prctl."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def die_with_parent_preexec(parent: int) -> Optional[Callable[[], None]]:
    """Popen's preexec_fn for a child that must die with this process (`parent`, its pid) on Linux;
    None elsewhere. It runs in the child between fork and exec; the setting survives the exec."""
    if not sys.platform.startswith("linux"):
        return None

    def preexec() -> None:
        if _prctl_pdeathsig(signal.SIGKILL) and os.getppid() != parent:  # the parent ended before
            _kill_self()
    return preexec


@contextlib.contextmanager
def stops_passed_on(proc: subprocess.Popen) -> Iterator[list[int]]:
    """While in the block, a SIGINT or SIGTERM to this process reaches `proc` as SIGTERM (a dmad
    engine's graceful stop at the next boundary, with a checkpoint) instead of ending this process
    and orphaning `proc`: the caller goes on waiting for it. SIGTERM for either, since a Ctrl+C in a
    terminal reaches `proc` too when it shares this process group, and a second SIGINT means
    "interrupt at once" to the engine; any number of SIGTERMs ask one graceful stop. Yields the
    signals received. Outside the main thread (no signal handlers there) it passes nothing on."""
    received: list[int] = []

    def pass_on(signum, _frame):
        received.append(signum)
        proc.send_signal(signal.SIGTERM)  # nothing once proc is reaped (its pid may be another's by then)

    main = threading.current_thread() is threading.main_thread()
    old = {s: signal.signal(s, pass_on) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        yield received
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def rank_dies_with_launcher() -> None:
    """In a rank of a multi-process run, at its start: die when accelerate's launcher (the
    parent) ends, which itself dies with the engine (ENGINE_PID_ENV)."""
    try:
        engine: Optional[int] = int(os.environ[ENGINE_PID_ENV])
    except (KeyError, ValueError):
        engine = None
    parent = os.getppid()
    if _prctl_pdeathsig(signal.SIGKILL):
        if not _launched_by(engine):  # the launcher ended before the setting took effect
            _kill_self()
        return
    threading.Thread(target=_watch, args=(parent, engine), name="dmad-parent-watch", daemon=True).start()


def _launched_by(engine: Optional[int]) -> bool:
    """This process's parent is alive and was started by `engine` (when known): it is still the
    `accelerate launch` of that engine, not whoever adopted this process after it ended."""
    import psutil

    try:
        return os.getppid() != 1 and (engine is None or psutil.Process(os.getppid()).ppid() == engine)
    except psutil.Error:
        return False


def _watch(parent: int, engine: Optional[int]) -> None:
    from dmad.contract.runs import pid_alive

    while os.getppid() == parent and (engine is None or pid_alive(engine)):
        time.sleep(POLL_S)
    _kill_self()
