"""What the Training panel's row of controls offers in each state of the shown run, and its state line.

Plain functions of the lifecycle (app/models/lifecycle.py), so the rules are read in one place: a
command to the engine needs a run folder and a live engine that reads its control file (running or
paused); Stop also reaches our own engine before it has a folder (SIGTERM); a request already sent
(pausing, resuming) is not offered twice until the engine confirms it.
"""
from __future__ import annotations

from app.models.lifecycle import LIVE


def enabled_controls(state: str, has_run_dir: bool, engine_running: bool, pending: str,
                     start_allowed: bool) -> dict[str, bool]:
    """Button key (app/widgets/run_controls.py BUTTONS, Continue aside) -> enabled."""
    commands = has_run_dir and state in ("running", "paused")
    return {"start": start_allowed and state not in LIVE,
            "pause": commands and state == "running" and pending != "pausing",
            "resume": commands and state == "paused" and pending != "resuming",
            "stop": commands or (state == "starting" and engine_running),
            "sample": commands, "sample_prompt": commands, "checkpoint": commands}


def state_line(state: str, pending: str, phase: str, new_run_folder: str, starting_in: str,
               has_run_dir: bool) -> str:
    """"running (pausing) - teacher-samples 3/10"; while nothing is shown, where Start would put a
    new run, and while one starts, where it goes (its name is the engine's, known once it has begun)."""
    where = ""
    if state == "idle" and new_run_folder:
        where = f" - Start makes a new run in {new_run_folder}"
    elif state == "starting" and not has_run_dir and starting_in:
        where = f" - new run in {starting_in}"
    return (state + (f" ({pending})" if pending else "") + (f" - {phase}" if phase and state == "running" else "")
            + where)
