"""Control commands from the app (control.jsonl: stop, stop_now, pause, resume, sample_now,
checkpoint_now), applied in one place: before training (dmad.train.run_open, at each boundary while
loading and rendering the teacher's samples) and at each iteration boundary (dmad.train.loop). The
callers say what a pause, a resume and a sample or checkpoint mean where they are.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

POLL_S = 0.2  # while paused


def handle_control(poll: Callable[[], tuple[list[dict], Optional[str]]], announce: Callable[[str, str], None],
                   run: Callable[[dict], None]) -> Optional[str]:
    """Applies the commands `poll()` returns until the run may go on: "stop" or "stop_now" when it
    must stop (stop_now wins), None otherwise. A pause blocks here, polling every POLL_S, until a
    resume or a stop (the models stay loaded; the monitor thread keeps the heartbeat fresh).

    poll() -> (commands, "stop" when the process's stop flag is set, else None);
    announce(state, event): status.json's state and the event of a pause ("paused", "paused") or a
    resume ("running", "resumed"); run(command): a sample_now or checkpoint_now."""
    paused = False
    while True:
        commands, stopping = poll()
        for c in commands:
            cmd = c.get("cmd")
            if cmd in ("stop", "stop_now"):
                stopping = "stop_now" if "stop_now" in (cmd, stopping) else "stop"
            elif cmd == "pause" and not paused:
                paused = True
                announce("paused", "paused")
            elif cmd == "resume" and paused:
                paused = False
                announce("running", "resumed")
            elif cmd in ("sample_now", "checkpoint_now"):
                run(c)
        if stopping or not paused:
            return stopping
        time.sleep(POLL_S)
