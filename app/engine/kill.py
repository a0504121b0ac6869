"""Killing an engine this app did not start (a reattached run): by the pid its status.json names.

The app's own engine is killed through its DmadCommand (the whole process group, SIGTERM then SIGKILL).
A reattached engine was started by an earlier app (own_session: it leads its own process group) or
from a terminal (it may share a group with its shell): the group is signalled only when the engine
leads it, so a kill never reaches the shell or anything else in the terminal's job.
"""
from __future__ import annotations

import os
import signal
import socket


def kill_problem(status: dict) -> str:
    """Why the process status.json names cannot be killed from here ("" when it can)."""
    pid, host = status.get("pid"), status.get("host")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return "status.json names no engine process"
    if host not in (None, socket.gethostname()):
        return f"the engine runs on {host}, not on this machine"
    if os.name != "posix":
        return "killing a reattached engine needs a POSIX system"
    return ""


def kill_engine(status: dict) -> str:
    """SIGKILL to the engine of status.json (and its group when it leads one); "" or what went wrong."""
    problem = kill_problem(status)
    if problem:
        return problem
    pid = status["pid"]
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)  # its workers (accelerate, data loaders) go with it
        else:
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return ""  # gone already: what Kill wanted
    except PermissionError as e:
        return f"not allowed to kill pid {pid}: {e.strerror or e}"
    return ""
