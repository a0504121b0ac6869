"""DmadCommand: one `dmad` command line in a QProcess, the runner under every place the app starts the
engine. The real `python -m dmad` for the exit codes (answered before torch is imported); tiny
`python -c` programs (the `program` override) for what the engine rarely does on purpose: a last line
without its newline, a child process, a crash, a program that does not exist. No torch here."""
from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest

from app.engine.command import DmadCommand, keep_error_line, progress_of
from dmad import __version__
from dmad.contract.events import make_event
from tests.conftest import gone

WAIT_MS = 60_000  # generous: the machine is shared; nothing here is a timing test


def python(code: str) -> list[str]:
    """A program prefix that runs `code` (start()'s arguments follow it, in sys.argv[1:])."""
    return [sys.executable, "-c", textwrap.dedent(code)]


def collect(cmd: DmadCommand) -> dict[str, list]:
    got: dict[str, list] = {"out": [], "err": [], "events": [], "progress": []}
    cmd.stdout_line.connect(got["out"].append)
    cmd.stderr_line.connect(got["err"].append)
    cmd.event_received.connect(got["events"].append)
    cmd.progress.connect(lambda done, total: got["progress"].append((done, total)))
    return got


def run(qtbot, cmd: DmadCommand, args: list[str], timeout: int = WAIT_MS) -> list:
    with qtbot.waitSignal(cmd.finished, timeout=timeout) as done:
        cmd.start(args)
    assert not cmd.is_running()
    return done.args


# ---------------------------------------------------------------- the real `python -m dmad`

def test_real_cli_invalid_input_exits_2_with_the_engines_one_line(qtbot):
    cmd = DmadCommand()
    got = collect(cmd)
    code, line = run(qtbot, cmd, ["train", "--config", "/nonexistent.json"], timeout=120_000)
    assert code == 2 and line.startswith("dmad: error:") and "/nonexistent.json" in line and "\n" not in line
    assert line in got["err"] and cmd.start_error() == ""


def test_real_cli_version_exits_0_on_stdout(qtbot):
    cmd = DmadCommand()
    got = collect(cmd)
    assert run(qtbot, cmd, ["--version"], timeout=120_000) == [0, ""]
    assert got["out"] == [f"dmad {__version__}"]
    assert cmd.label() == "dmad --version" and cmd.program() == [sys.executable, "-m", "dmad"]


# ---------------------------------------------------------------- lines and events

def test_the_last_partial_lines_are_delivered_at_exit(qtbot):
    cmd = DmadCommand(program=python("""
        import sys
        sys.stdout.write("first\\nno newline on stdout")
        sys.stderr.write("INFO chatter\\ndmad: error: no newline on stderr")
        sys.exit(3)
    """))
    got = collect(cmd)
    assert run(qtbot, cmd, []) == [3, "dmad: error: no newline on stderr"]
    assert got["out"] == ["first", "no newline on stdout"]
    assert got["err"] == ["INFO chatter", "dmad: error: no newline on stderr"]


def test_events_are_parsed_and_progress_lines_are_not_the_error_line(qtbot):
    event = make_event("samples", 60, folder="/run/samples/iter_60-r2", paths=[]).to_line()
    cmd = DmadCommand(program=python(f"""
        import sys
        print({event!r})
        print("a stray print")
        print("progress 3 10", file=sys.stderr)
        print("a library warning", file=sys.stderr)
        print("progress 10 10", file=sys.stderr)
        sys.exit(int(sys.argv[1]))
    """), parse_events=True)
    got = collect(cmd)
    assert run(qtbot, cmd, ["4"]) == [4, "a library warning"]
    assert [(e.kind, e.iter, e.data["folder"]) for e in got["events"]] == [("samples", 60, "/run/samples/iter_60-r2")]
    assert got["out"] == ["a stray print"]  # events are not stdout lines
    assert got["progress"] == [(3, 10), (10, 10)]
    plain = DmadCommand(program=cmd.program())  # without parse_events an event is just a line
    got = collect(plain)
    assert run(qtbot, plain, ["0"]) == [0, ""]
    assert got["out"][0] == event and got["events"] == []


def test_a_failure_without_an_error_line_says_what_happened(qtbot):
    cmd = DmadCommand(program=python("import sys; sys.exit(5)"))
    assert run(qtbot, cmd, ["check-data", "x"]) == [5, "dmad check-data exited with code 5"]
    crash = DmadCommand(program=python("import os, signal; os.kill(os.getpid(), signal.SIGKILL)"),
                        label="the test program")
    assert run(qtbot, crash, []) == [-1, "the test program crashed"]


def test_the_engines_own_line_wins_over_chatter_after_it():
    line = keep_error_line("", "Traceback (most recent call last): ...")
    line = keep_error_line(line, "dmad: error: teacher not found")
    assert keep_error_line(line, "  warnings.warn(...)") == "dmad: error: teacher not found"
    assert progress_of("progress 2 7") == (2, 7) and progress_of("progress two") is None


# ---------------------------------------------------------------- start and stop

def test_a_program_that_cannot_start_is_one_line(qtbot, tmp_path):
    cmd = DmadCommand(program=[str(tmp_path / "no-such-program")])
    code, line = run(qtbot, cmd, ["ledger", "--json"])
    assert code == -1 and line.startswith("could not start dmad ledger: ") and "\n" not in line
    assert cmd.start_error() == line


def test_start_twice_while_running_is_refused(qtbot):
    cmd = DmadCommand(program=python("import time; time.sleep(60)"))
    cmd.start([])
    with pytest.raises(RuntimeError, match="already running"):
        cmd.start([])
    with qtbot.waitSignal(cmd.finished, timeout=WAIT_MS):
        cmd.kill()


SPAWNS_A_CHILD = """
    import pathlib, signal, subprocess, sys, time
    here = pathlib.Path(sys.argv[1])
    if sys.argv[2] == "ignore-sigterm":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(0.05)"])
    (here / "pids.tmp").write_text(f"[{child.pid}, {os.getpid()}]")
    os.replace(here / "pids.tmp", here / "pids.json")  # whole or absent: the test reads it as soon as it exists
    while True:
        time.sleep(0.05)
"""


@pytest.mark.skipif(os.name != "posix", reason="process groups are POSIX")
@pytest.mark.parametrize("mode", ["plain", "ignore-sigterm"])
def test_kill_ends_the_command_and_its_process_group(qtbot, tmp_path, mode):
    cmd = DmadCommand(program=python("import os\n" + textwrap.dedent(SPAWNS_A_CHILD)))
    cmd.start([str(tmp_path), mode])
    qtbot.waitUntil(lambda: (tmp_path / "pids.json").is_file(), timeout=WAIT_MS)
    child, leader = json.loads((tmp_path / "pids.json").read_text())
    assert cmd.is_running() and cmd.process_id() == leader and os.getpgid(child) == leader  # its own group
    with qtbot.waitSignal(cmd.finished, timeout=WAIT_MS) as done:
        cmd.kill(grace_ms=200)  # a command that ignores SIGTERM gets SIGKILL after the grace period
    assert done.args[0] == -1 and not cmd.is_running() and cmd.process_id() is None
    qtbot.waitUntil(lambda: gone(leader) and gone(child), timeout=WAIT_MS)


def test_a_discarded_command_is_killed_and_says_nothing(qtbot, tmp_path):
    cmd = DmadCommand(program=python("""
        import os, pathlib, signal, sys, time
        signal.signal(signal.SIGTERM, lambda *a: print("a stale answer", flush=True))  # then SIGKILL ends it
        pathlib.Path(sys.argv[1]).write_text(str(os.getpid()))
        while True:
            time.sleep(0.05)
    """))
    got, ends = collect(cmd), []
    cmd.finished.connect(lambda *a: ends.append(a))
    cmd.start([str(tmp_path / "pid")])
    qtbot.waitUntil(lambda: (tmp_path / "pid").is_file(), timeout=WAIT_MS)
    pid = int((tmp_path / "pid").read_text())
    with qtbot.waitSignal(cmd.destroyed, timeout=WAIT_MS):  # it deletes itself once it has ended
        cmd.discard()
    assert gone(pid) and ends == [] and got["out"] == []
