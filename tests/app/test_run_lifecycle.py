"""RunLifecycle (app/models/lifecycle.py): what the engine's events, its exit code and status.json make
of the shown run, without Qt: no QApplication, no widget, no timer. Each test feeds the model what the
Training panel's RunSource would, in the order it would, and reads what the model decided and asked."""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from app.models.lifecycle import KILLED, Failure, RunLifecycle

IN_USE = "dmad: error: run folder /runs/busy is in use by engine pid 4242 on this machine"


def ev(kind: str, it=None, t: float = 1000.0, **data) -> dict:
    return {"v": 1, "t": t, "kind": kind, "iter": it, "data": data}


def alive(state: str, **more) -> dict:
    """status.json of an engine that runs on this machine (this very process: its pid is alive)."""
    return {"state": state, "pid": os.getpid(), "host": socket.gethostname(), "heartbeat": time.time(), **more}


def gone(state: str, **more) -> dict:
    """status.json of an engine on another machine whose heartbeat stopped an hour ago."""
    return {"state": state, "pid": 4242, "host": "gpu-7", "heartbeat": time.time() - 3600, **more}


class Seen:
    """What a RunLifecycle emitted, in order: ("state", s), "changed", Failure, ("noted", line),
    ("refused", run_dir, line), "status?" (read status.json), "file end?" (finish reading events.jsonl)."""

    def __init__(self, lc: RunLifecycle):
        self.items: list = []
        lc.state_changed.connect(lambda s: self.items.append(("state", s)))
        lc.changed.connect(lambda: self.items.append("changed"))
        lc.failed.connect(lambda failure: self.items.append(failure))
        lc.noted.connect(lambda line: self.items.append(("noted", line)))
        lc.refused.connect(lambda run_dir, line: self.items.append(("refused", run_dir, line)))
        lc.status_wanted.connect(lambda: self.items.append("status?"))
        lc.file_end_wanted.connect(lambda: self.items.append("file end?"))

    def take(self) -> list:
        items, self.items = self.items, []
        return items

    def take_without_changed(self) -> list:
        return [item for item in self.take() if item != "changed"]


@pytest.fixture
def lc() -> RunLifecycle:
    return RunLifecycle()


@pytest.fixture
def run(tmp_path) -> Path:
    return tmp_path / "run"


def opened(lc: RunLifecycle, run: Path, status: dict, history=()) -> Seen:
    """`run` opened from its folder, its events.jsonl replayed to the end; what it emitted since."""
    lc.open(run, status)
    for e in history:
        lc.file_event(e)
    seen = Seen(lc)
    lc.file_caught_up()
    return seen


# ---------------------------------------------------------------- a run this app starts

def test_a_new_lifecycle_is_idle_and_wants_nothing(lc):
    assert (lc.state, lc.run_dir, lc.iteration, lc.max_steps, lc.exit_code, lc.message) == (
        "idle", None, None, None, None, "")
    assert not lc.is_live() and not lc.is_ended() and not lc.wants_status() and lc.elapsed(5.0) is None


def test_our_new_run_from_start_to_stopped(lc, run):
    seen = Seen(lc)
    lc.start("/runs", now=100.0)
    assert (lc.state, lc.run_dir, lc.starting_in, lc.is_live()) == ("starting", None, "/runs", True)
    assert seen.take() == [("state", "starting"), "changed"]
    lc.set_run_dir(run)  # the engine's started event names the folder
    assert seen.take() == ["changed"] and lc.run_dir == run
    lc.engine_event(ev("started", None, t=101.0, run_dir=str(run), max_train_steps=100))
    for i in (1, 2):
        lc.engine_event(ev("metric", i, t=101.0 + i, loss_dm=1.0, step_time_s=0.5, max_train_steps=100))
    assert (lc.state, lc.iteration, lc.max_steps, lc.step_time_s) == ("running", 2, 100, 0.5)
    assert lc.started_t == 100.0 and lc.elapsed(now=110.0) == 9.0  # from its started event, until now while live
    assert not lc.wants_status()  # our engine says how the run ends
    lc.stop_requested()
    lc.engine_event(ev("stopped", 2, t=104.0, last_checkpoint=2))
    assert [s for s in seen.take() if s != "changed"] == [("state", "running"), ("state", "stopping"),
                                                          ("state", "stopped")]
    lc.engine_finished(0, "stopped at iteration 2\n(checkpoint iter_2)", (), killed=False)
    assert (lc.state, lc.exit_code, lc.message) == ("stopped", 0, "stopped at iteration 2 (checkpoint iter_2)")
    assert seen.take_without_changed() == [("noted", "stopped at iteration 2\n(checkpoint iter_2)")]
    assert lc.is_ended() and not lc.is_live() and lc.elapsed(now=999.0) == 3.0  # once over: to its ending event
    reopened = RunLifecycle()  # the same run opened from its folder says the same
    opened(reopened, run, {"state": "stopped"}, [ev("started", None, t=101.0), ev("metric", 1, t=102.0),
                                                 ev("stopped", 2, t=104.0)])
    assert reopened.elapsed(now=999.0) == 3.0


def test_elapsed_counts_each_session_never_the_hours_between_a_stop_and_a_continue(lc, run):
    history = [ev("started", None, t=100.0), ev("metric", 1, t=150.0), ev("stopped", 1, t=200.0),  # 100 s
               ev("started", None, t=5000.0), ev("metric", 2, t=5010.0),  # killed: no ending event (10 s)
               ev("started", None, t=9000.0), ev("finished", 3, t=9040.0)]  # 40 s
    opened(lc, run, {"state": "finished"}, history)
    assert lc.elapsed(now=99999.0) == 150.0
    lc2 = RunLifecycle()
    lc2.continue_run(run, now=20000.0)  # our engine continues it: its history first, then its own session
    for e in history[:5]:
        lc2.file_event(e)
    lc2.file_caught_up()
    assert lc2.elapsed(now=20001.0) == 110.0  # before the new session's started event: the earlier ones
    lc2.file_event(ev("started", None, t=20005.0))
    assert lc2.elapsed(now=20030.0) == 135.0


def test_a_failing_engine_keeps_the_error_events_reason_and_its_exit_code(lc, run):
    lc.start("", now=0.0)
    lc.set_run_dir(run)
    lc.engine_event(ev("started", None))
    seen = Seen(lc)
    reason = "out of memory during first-forward: CUDA out of memory. Tried to allocate 2.00 GiB"
    lc.engine_event(ev("error", 5, reason=reason, exit_code=3, cause="out_of_memory", phase="first-forward"))
    state, first = seen.take_without_changed()
    assert state == ("state", "failed") and (lc.exit_code, lc.message) == (3, reason)
    assert first.log_lines is None  # the engine still runs: the panel's own log tail
    lc.engine_finished(3, "out of memory during first-forward", ("INFO dmad: step 5", "dmad: error: oom"), False)
    (report,) = seen.take_without_changed()  # a report with the exit's log lines; the state moved once
    assert "exit code 3" in report.title and report.details[:2] == (reason, "Cause: out of memory during first-forward")
    assert report.log_lines == ("INFO dmad: step 5", "dmad: error: oom")  # the engine's own last lines
    assert (lc.state, lc.exit_code, lc.message) == ("failed", 3, reason)


def test_an_exit_0_without_a_final_event_ends_as_status_json_says(lc, run, tmp_path):
    lc.start("", now=0.0)
    lc.set_run_dir(run)
    lc.engine_event(ev("started", None))
    seen = Seen(lc)
    lc.engine_finished(0, "the engine exited normally", (), False)
    assert seen.take() == ["status?"] and lc.state == "running"
    lc.status_read(tmp_path / "another", {"state": "failed"}, False)  # another run's answer: dropped
    assert lc.state == "running" and seen.take() == []
    lc.status_read(run, {"state": "finished"}, False)
    assert (lc.state, lc.exit_code, lc.message) == ("finished", 0, "the engine exited normally")
    assert seen.take_without_changed() == [("state", "finished"), ("noted", "the engine exited normally")]


def test_a_stop_before_the_run_folder_exists_keeps_nothing(lc):
    lc.start("/runs", now=0.0)
    lc.stop_requested()  # SIGTERM: the engine has no folder yet
    seen = Seen(lc)
    lc.engine_finished(130, "interrupted", (), False)
    assert (lc.state, lc.exit_code, lc.message, lc.run_dir) == ("stopped", 130, "stopped before the run began", None)
    assert seen.take_without_changed() == [("state", "stopped"), ("noted", "stopped before the run began")]


def test_a_kill_fails_the_run_with_the_engines_last_lines(lc, run):
    lc.start("", now=0.0)
    lc.set_run_dir(run)
    lc.engine_event(ev("started", None))
    lc.stop_requested()
    seen = Seen(lc)
    lc.engine_finished(-1, "the engine crashed", ("INFO dmad: step 9",), killed=True)
    (report,) = [s for s in seen.take() if isinstance(s, Failure)]
    assert (lc.state, lc.message) == ("failed", KILLED) and report.details[0] == KILLED
    assert report.log_lines == ("INFO dmad: step 9",)


def test_a_refused_continue_changes_nothing_and_asks_for_the_folder_as_it_is(lc, run):
    opened(lc, run, {"state": "stopped"}, [ev("started", None), ev("metric", 10), ev("stopped", 10)])
    lc.file_ended()
    lc.continue_run(run, now=5.0)
    assert (lc.state, lc.run_dir, lc.iteration) == ("starting", run, None) and lc.replaying
    assert not lc.wants_status()  # the engine says what happens
    seen = Seen(lc)
    lc.engine_finished(2, IN_USE, (), False)
    assert seen.take() == ["file end?", ("refused", run, IN_USE)]
    assert lc.exit_code is None and not lc.is_ended()


# ---------------------------------------------------------------- a run opened from its folder

def test_history_never_moves_an_opened_run_and_what_follows_does(lc, run):
    history = [ev("started", None, max_train_steps=10)] + [ev("metric", i) for i in (1, 2, 3)] + [ev("stopped", 3)]
    seen = opened(lc, run, alive("running"), history)  # a "stopped" kept before a resume
    assert (lc.state, lc.iteration, lc.max_steps) == ("running", 3, 10) and not lc.replaying
    assert seen.take() == ["status?"]  # a state change hidden in the history: status.json says
    for kind, state in (("paused", "paused"), ("resumed", "running")):
        lc.file_event(ev(kind, 3))
        assert lc.state == state
    lc.file_event(ev("finished", 3))
    assert seen.take_without_changed() == [("state", "paused"), ("state", "running"), ("state", "finished"),
                                           "file end?",  # read what it wrote last, then stop
                                           ("noted", "finished 3 iterations")]  # no engine of ours to say it
    lc.file_ended()
    assert not lc.following and seen.take() == ["status?"]
    lc.status_read(run, alive("running"), False)  # not rewritten yet: a final event is never undone
    assert lc.state == "finished" and seen.take() == []


def test_a_followed_run_stopped_from_here_says_where_it_stopped(lc, run):
    """A run this app did not start (left running, opened again): its stopped event is the only word."""
    seen = opened(lc, run, alive("running"), [ev("started", None, max_train_steps=1600), ev("metric", 140)])
    lc.command_sent("stop")
    lc.file_event(ev("stopped", 155, last_checkpoint=155, checkpoint_saved=True))
    assert lc.state == "stopped"
    assert ("noted", "stopped at iteration 155 (checkpoint iter_155)") in seen.take_without_changed()


def test_a_stop_is_not_undone_by_a_status_json_that_still_says_running(lc, run):
    opened(lc, run, alive("running"))
    seen = Seen(lc)
    lc.command_sent("stop")
    for state in ("running", "paused", "stopping"):
        lc.status_read(run, alive(state), False)
        assert lc.state == "stopping"
    assert seen.take_without_changed() == [("state", "stopping")]
    lc.status_read(run, gone("running"), killed=True)  # the engine was killed: its heartbeat stopped
    assert seen.take() == ["file end?"] and lc.state == "stopping"  # its last events first
    lc.file_ended()
    assert seen.take() == ["status?"]
    lc.status_read(run, gone("running"), killed=True)
    assert (lc.state, lc.message) == ("failed", KILLED)
    (report,) = [s for s in seen.take() if isinstance(s, Failure)]
    assert report.log_lines is None  # the panel's own log tail


def test_a_run_that_died_without_a_word_shows_as_failed_with_its_pid(lc, run):
    lc.open(run, gone("running"))
    assert lc.state == "failed" and not lc.is_live()
    seen = Seen(lc)
    lc.file_event(ev("metric", 7))
    lc.file_caught_up()
    (report,) = [s for s in seen.take() if isinstance(s, Failure)]
    assert "pid 4242" in report.details[0] and "killed or crashed" in report.details[0]
    assert lc.message == report.details[0] and lc.exit_code is None and lc.iteration == 7


def test_a_failed_run_reopened_says_what_its_error_event_and_status_json_recorded(lc, run):
    err = ev("error", 12, reason="loss_dm is NaN at iteration 12", exit_code=1, cause="non_finite_loss",
             last_checkpoint=10)
    seen = opened(lc, run, {"state": "failed", "failure_reason": "loss_dm is NaN", "exit_code": 1}, [err])
    (report,) = [s for s in seen.take() if isinstance(s, Failure)]
    assert "exit code 1" in report.title and "Last checkpoint: iter_10" in report.details
    assert (lc.state, lc.exit_code, lc.message) == ("failed", 1, "loss_dm is NaN at iteration 12")


def test_a_continued_runs_file_is_plotted_but_only_its_engine_moves_it(lc, run):
    opened(lc, run, {"state": "stopped"}, [ev("metric", 20), ev("stopped", 20)])
    lc.file_ended()
    lc.continue_run(run, now=5.0)
    seen = Seen(lc)
    lc.engine_event(ev("started", None, max_train_steps=100))
    assert lc.state == "running" and lc.max_steps is None  # the file records it, not stdout
    lc.file_event(ev("metric", 20))
    lc.file_event(ev("stopped", 20))  # the old file, before the resume cut it back
    assert (lc.state, lc.iteration) == ("running", 20)
    lc.file_rewound()
    assert lc.iteration is None and lc.replaying
    for e in (ev("started", None, max_train_steps=100), ev("metric", 10), ev("metric", 11)):
        lc.file_event(e)
    lc.file_caught_up()
    lc.file_event(ev("stopped", 11))  # what the engine wrote: its stdout says it too
    assert (lc.state, lc.iteration, lc.max_steps) == ("running", 11, 100)
    assert "status?" not in seen.items  # a continued run is its engine's to say
    seen.take()
    lc.engine_event(ev("stopped", 11, last_checkpoint=11))
    assert seen.take_without_changed() == [("state", "stopped"), "file end?"]


# ---------------------------------------------------------------- commands, progress, replacing

def test_a_command_is_pending_until_the_engine_answers(lc, run):
    opened(lc, run, alive("running"))
    lc.command_sent("pause")
    assert lc.pending == "pausing"
    lc.file_event(ev("paused", 5))
    assert (lc.state, lc.pending) == ("paused", "")
    lc.command_sent("sample_now")
    lc.file_event(ev("checkpoint", 5, path="x"))  # not what was asked
    assert lc.pending == "sampling requested"
    lc.file_event(ev("samples", 5, folder="x", paths=[]))
    assert lc.pending == ""
    lc.command_sent("checkpoint_now")
    lc.file_event(ev("checkpoint", 6, path="y"))
    assert (lc.pending, lc.iteration) == ("", 6)
    lc.command_sent("stop")
    lc.command_sent("stop_now")
    assert (lc.state, lc.pending) == ("stopping", "stopping now, no checkpoint")
    lc.file_event(ev("stopped", 6, last_checkpoint=3, checkpoint_saved=False))
    assert (lc.state, lc.pending) == ("stopped", "")


def test_progress_phase_and_what_does_not_count(lc, run):
    lc.start("", now=100.0)
    lc.set_run_dir(run)
    lc.engine_event(ev("started", None, t=101.0, max_train_steps=50))
    lc.engine_event(ev("phase", None, t=102.0, phase="teacher-samples", done=3, total=10))
    assert (lc.phase, lc.iteration) == ("teacher-samples 3/10", None)
    lc.engine_event(ev("metric", 10, t=110.0, step_time_s=0.5, max_train_steps=50))
    lc.engine_event(ev("metric", 99, t=120.0, source="sampler", scope="device_nvml", mem_used_gb=3.0))
    assert (lc.iteration, lc.step_time_s, lc.last_t) == (10, 0.5, 120.0)  # a memory reading is no iteration
    lc.engine_event(ev("checkpoint", 12, t=121.0, path="x"))
    lc.engine_event(ev("warning", 11, t=122.0, message="slow data"))
    assert lc.iteration == 12  # any event moves the iteration forward, never back


def test_opening_replaces_everything_and_a_live_run_is_never_replaced_by_a_start(lc, tmp_path):
    seen = opened(lc, tmp_path / "a", {"state": "failed", "exit_code": 1, "failure_reason": "a loss became NaN"})
    assert (lc.exit_code, lc.message) == (1, "a loss became NaN")
    seen.take()
    lc.open(tmp_path / "b", alive("running"))  # a reattach
    assert seen.take() == [("state", "running"), "changed"]
    assert (lc.run_dir, lc.exit_code, lc.message, lc.is_live()) == (tmp_path / "b", None, "", True)
    lc.open(tmp_path / "b", alive("running"))  # opened again: a new start for whoever shows it
    assert seen.take() == ["changed"]
    with pytest.raises(RuntimeError, match="already running"):
        lc.start("", now=0.0)
    with pytest.raises(RuntimeError, match="cannot be forgotten"):
        lc.clear()
    lc.open(tmp_path / "c", {"state": "finished"})
    lc.clear()
    assert (lc.state, lc.run_dir) == ("idle", None)


def test_nothing_changed_signals_nothing_and_unwanted_reads_are_dropped(lc, run):
    opened(lc, run, alive("running"), [ev("metric", 5, max_train_steps=10)])
    seen = Seen(lc)
    lc.file_event(ev("resumed", None))  # already running
    lc.set_run_dir(run)
    assert seen.take() == []
    ours = RunLifecycle()
    ours.start("", now=0.0)
    ours.set_run_dir(run)
    ours.status_read(run, {"state": "failed"}, False)  # our engine is running: it says, not status.json
    assert ours.state == "starting"


def test_how_a_run_ended_says_what_this_session_did():
    from app.engine.process import final_summary

    fresh = {"kind": "finished", "iter": 20, "data": {"elapsed_s": 30.2, "start_iter": 0}}
    assert final_summary(fresh) == "finished 20 iterations in 30 s"
    continued = {"kind": "finished", "iter": 20, "data": {"elapsed_s": 9.0, "start_iter": 14}}
    assert final_summary(continued) == "finished at iteration 20: 6 iterations in 9 s after continuing from 14"
    assert final_summary({"kind": "finished", "iter": 20, "data": {}}) == "finished 20 iterations"  # an older engine
