"""The engine bridge: EngineProcess (QProcess around `dmad train`), EventFollower (tail of
events.jsonl) and the metric series. The engine is replaced by small scripts that print what the
real one prints (dmad.contract.events lines, "dmad: error:" lines, exit codes); one test runs the real CLI
on a missing config (answered before torch is imported). No torch here."""
from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from app.engine.command import DmadCommand, LineBuffer
from app.engine.process import EngineProcess
from app.engine.follow import EventFollower
from app.models.series import Series, SeriesStore
from dmad.contract.events import make_event
from dmad.contract.runlog import append_control
from dmad.contract.runs import RunFolder

WAIT_MS = 30_000  # generous: the machine is shared; nothing here is a timing test

FAKE_ENGINE = textwrap.dedent(r'''
    import json, os, signal, sys, time
    from pathlib import Path
    from dmad.contract.events import make_event

    scenario, argv = sys.argv[1], sys.argv[2:]
    # temp + rename: the test waits for argv.json to exist, then reads it; a plain write could be seen empty
    Path(__file__).with_name("argv.json.tmp").write_text(json.dumps(argv))
    os.replace(Path(__file__).with_name("argv.json.tmp"), Path(__file__).with_name("argv.json"))
    out = sys.stdout.buffer

    def arg(name):
        return argv[argv.index(name) + 1] if name in argv else None

    def emit(kind, it=None, split=None, **data):
        line = (make_event(kind, it, **data).to_line() + "\n").encode("utf-8")
        if split == "half":
            split = len(line) // 2
        with open(run / "events.jsonl", "ab") as f:
            f.write(line)
        parts = [line[:split], line[split:]] if split else [line]
        for part in parts:  # a split write: the reader gets the line in two pipe chunks
            out.write(part)
            out.flush()
            time.sleep(0.05)

    if scenario == "invalid":
        print("dmad: error: cfg.json: optimization.max_train_steps: Input should be >= 1", file=sys.stderr)
        sys.exit(2)
    if scenario == "dry":
        print("Resolved config:\n{}\nMemory ledger (estimate, framework peak per device):")
        sys.exit(0)
    if scenario == "detach":  # log a lot until stopped, like a long run whose app went away
        run = Path(arg("--run-dir"))
        run.mkdir(parents=True)
        (run / "events.jsonl").write_text(make_event("started", None, run_dir=str(run)).to_line() + "\n")
        print("engine started", file=sys.stderr, flush=True)
        echo, it = True, 0
        while not ((run / "control.jsonl").exists() and "stop" in (run / "control.jsonl").read_text()):
            it += 1
            try:  # what dmad.contract.events.EventWriter does when the reader is gone
                if echo:
                    out.write(b"x" * 4096 + b"\n")
                    out.flush()
            except BrokenPipeError:
                echo = False
            if it % 50 == 0:
                (run / "written").write_text(str(it))  # how many lines it has got through: the test's marker
            time.sleep(0.002)
        with open(run / "events.jsonl", "a") as f:
            f.write(make_event("stopped", it).to_line() + "\n")
        sys.exit(0)
    if scenario == "sigterm":
        signal.signal(signal.SIGTERM, lambda *a: (print("got SIGTERM", file=sys.stderr, flush=True), sys.exit(0)))
        print("waiting", file=sys.stderr, flush=True)
        time.sleep(60)
        sys.exit(5)
    run = Path(arg("--run-dir") or (Path(__file__).parent / "auto-run"))
    run.mkdir(parents=True, exist_ok=True)
    emit("started", None, split="half", run_dir=str(run), max_train_steps=3)
    out.write("a stray print on stdout: é".encode("utf-8")[:-1])  # cut inside the two bytes of "é"
    out.flush()
    time.sleep(0.05)
    out.write("é".encode("utf-8")[1:] + b"\n")
    out.flush()
    print("INFO dmad: loading the teacher", file=sys.stderr, flush=True)
    for it in (1, 2, 3):
        emit("metric", it, split=40, loss_dm=1.0 / it, step_time_s=0.5, max_train_steps=3, eta_s=3 - it)
    if scenario == "oom":
        print("dmad: error: out of memory during first-forward: CUDA out of memory", file=sys.stderr, flush=True)
        emit("error", 3, reason="out of memory during first-forward: CUDA out of memory", exit_code=3,
             last_checkpoint=None, cause="out_of_memory", phase="first-forward")
        sys.exit(3)
    control = run / "control.jsonl"
    for _ in range(600):  # up to 30 s: wait for the app's "stop"
        if control.exists() and '"stop"' in control.read_text():
            break
        time.sleep(0.05)
    emit("stopped", 3, last_checkpoint=3)
''')


@pytest.fixture
def fake(tmp_path):
    script = tmp_path / "fake_engine.py"
    script.write_text(FAKE_ENGINE, encoding="utf-8")
    return lambda scenario: [sys.executable, str(script), scenario]


def _argv(tmp_path: Path) -> list[str]:
    return json.loads((tmp_path / "argv.json").read_text())


def test_the_app_starts_the_dmad_module_or_the_bundle_itself(qtbot, monkeypatch):
    assert DmadCommand().program() == EngineProcess()._command == [sys.executable, "-m", "dmad"]
    monkeypatch.setattr(sys, "frozen", True, raising=False)  # PyInstaller: packaging/entry.py routes `train`
    assert DmadCommand().program() == EngineProcess()._command == [sys.executable]


def test_line_buffer_reassembles_chunks_and_multibyte_characters():
    buf = LineBuffer()
    data = "first\r\nsécond\nthird".encode("utf-8")
    cut = data.index("é".encode("utf-8")) + 1  # inside the two-byte character
    assert buf.feed(data[:cut]) == ["first"]
    assert buf.feed(data[cut:]) == ["sécond"]
    assert buf.flush() == ["third"]
    assert buf.flush() == []


def test_events_logs_run_dir_and_graceful_stop(qtbot, tmp_path, fake):
    eng = EngineProcess(command=fake("events"))
    events, logs, found = [], [], []
    eng.event_received.connect(events.append)
    eng.log_received.connect(logs.append)
    eng.run_dir_found.connect(found.append)
    run = tmp_path / "runs" / "réun"
    eng.start_train(tmp_path / "cfg.json", run_dir=run, resume="latest", overrides=["resources.train_batch_size=2"])
    qtbot.waitUntil(lambda: len(events) == 4, timeout=WAIT_MS)
    assert _argv(tmp_path) == ["train", "--config", str(tmp_path / "cfg.json"), "--run-dir", str(run.resolve()),
                               "--resume", "latest", "--set", "resources.train_batch_size=2"]
    assert [e["kind"] for e in events] == ["started", "metric", "metric", "metric"]
    assert events[0]["data"]["run_dir"] == str(run)
    assert [e["iter"] for e in events[1:]] == [1, 2, 3]
    assert set(events[1]) == {"v", "t", "kind", "iter", "data"}
    assert found == [run.resolve()] and eng.run_dir() == run.resolve()
    assert "a stray print on stdout: é" in logs and "INFO dmad: loading the teacher" in logs
    assert eng.is_running()
    with qtbot.waitSignal(eng.finished, timeout=WAIT_MS) as done:
        eng.terminate_gracefully()
    assert done.args == [0, "stopped at iteration 3 (checkpoint iter_3)"]
    assert [json.loads(line)["cmd"] for line in (run / "control.jsonl").read_text().splitlines()] == ["stop"]
    assert events[-1]["kind"] == "stopped" and not eng.is_running()


def test_run_dir_comes_from_the_started_event_and_controls_go_there(qtbot, tmp_path, fake):
    eng = EngineProcess(command=fake("events"))
    assert not eng.send_control("pause")  # no run folder yet: nothing written anywhere
    with qtbot.waitSignal(eng.run_dir_found, timeout=WAIT_MS) as found:
        eng.start_train(tmp_path / "cfg.json")
    run = tmp_path / "auto-run"
    assert found.args == [run]
    assert eng.send_control("sample_now") and eng.send_control("checkpoint_now")
    with qtbot.waitSignal(eng.finished, timeout=WAIT_MS):
        eng.terminate_gracefully()
    cmds = [json.loads(line)["cmd"] for line in (run / "control.jsonl").read_text().splitlines()]
    assert cmds == ["sample_now", "checkpoint_now", "stop"]


def test_invalid_input_summary_is_the_engines_error_line(qtbot, tmp_path, fake):
    eng = EngineProcess(command=fake("invalid"))
    with qtbot.waitSignal(eng.finished, timeout=WAIT_MS) as done:
        eng.start_train(tmp_path / "cfg.json")
    assert done.args == [2, "dmad: error: cfg.json: optimization.max_train_steps: Input should be >= 1"]


def test_out_of_memory_summary_is_the_error_events_reason(qtbot, tmp_path, fake):
    eng = EngineProcess(command=fake("oom"))
    events = []
    eng.event_received.connect(events.append)
    with qtbot.waitSignal(eng.finished, timeout=WAIT_MS) as done:
        eng.start_train(tmp_path / "cfg.json", run_dir=tmp_path / "run")
    assert done.args == [3, "out of memory during first-forward: CUDA out of memory"]
    assert events[-1]["kind"] == "error" and events[-1]["data"]["cause"] == "out_of_memory"
    assert eng.last_log_lines(1) == ["dmad: error: out of memory during first-forward: CUDA out of memory"]


@pytest.mark.skipif(os.name != "posix", reason="SIGTERM is POSIX")
def test_stop_before_the_run_folder_exists_sends_sigterm(qtbot, tmp_path, fake):
    eng = EngineProcess(command=fake("sigterm"))
    logs = []
    eng.log_received.connect(logs.append)
    eng.start_train(tmp_path / "cfg.json")
    qtbot.waitUntil(lambda: "waiting" in logs, timeout=WAIT_MS)
    with qtbot.waitSignal(eng.finished, timeout=WAIT_MS) as done:
        eng.terminate_gracefully()
    assert done.args[0] == 0 and "got SIGTERM" in logs


def test_detached_engine_outlives_its_owner_and_never_blocks_on_a_full_pipe(qtbot, tmp_path, fake):
    eng = EngineProcess(command=fake("detach"))
    logs = []
    eng.log_received.connect(logs.append)
    run = tmp_path / "run"
    eng.start_train(tmp_path / "cfg.json", run_dir=run)
    qtbot.waitUntil(lambda: "engine started" in logs, timeout=WAIT_MS)
    eng.detach()
    assert not eng.is_running() and eng.process_id() is None
    eng.deleteLater()  # the app's side is gone; the engine is not
    # 300 lines of 4 KiB (1.2 MB, far past a 64 KiB pipe) into a pipe nobody reads: it must not block
    qtbot.waitUntil(lambda: (run / "written").is_file() and int((run / "written").read_text() or 0) >= 300,
                    timeout=WAIT_MS)
    append_control(run, "stop")
    qtbot.waitUntil(lambda: '"stopped"' in (run / "events.jsonl").read_text(), timeout=WAIT_MS)
    stopped = json.loads((run / "events.jsonl").read_text().splitlines()[-1])
    assert stopped["kind"] == "stopped" and stopped["iter"] > 200  # it kept writing after detach


def test_dry_run_report_and_failure(qtbot, tmp_path, fake):
    eng = EngineProcess(command=fake("dry"))
    with qtbot.waitSignal(eng.dry_run_finished, timeout=WAIT_MS) as done:
        eng.start_dry_run(tmp_path / "cfg.json")
    assert _argv(tmp_path) == ["train", "--config", str(tmp_path / "cfg.json"), "--dry-run"]
    assert done.args[0] == 0 and done.args[1].startswith("Resolved config:") and "Memory ledger" in done.args[1]
    bad = EngineProcess(command=fake("invalid"))
    with qtbot.waitSignal(bad.dry_run_finished, timeout=WAIT_MS) as done:
        bad.start_dry_run(tmp_path / "cfg.json")
    assert done.args == [2, "dmad: error: cfg.json: optimization.max_train_steps: Input should be >= 1"]


def test_an_engine_that_cannot_start_is_reported(qtbot, tmp_path):
    eng = EngineProcess(command=[str(tmp_path / "no-such-python")])
    with qtbot.waitSignal(eng.finished, timeout=WAIT_MS) as done:
        eng.start_train(tmp_path / "cfg.json")
    assert done.args[0] == -1 and done.args[1].startswith("could not start the engine")


def test_real_cli_missing_config_exits_2_with_one_line(qtbot, tmp_path):
    eng = EngineProcess()  # the real `python -m dmad`
    with qtbot.waitSignal(eng.finished, timeout=120_000) as done:
        eng.start_train(tmp_path / "missing.json")
    code, summary = done.args
    assert code == 2 and summary.startswith("dmad: error:") and "missing.json" in summary


# ---------------------------------------------------------------- EventFollower


def _line(kind: str, it, **data) -> bytes:
    return (make_event(kind, it, **data).to_line() + "\n").encode("utf-8")


def _collect(follower: EventFollower) -> list:
    got: list = []
    follower.events_received.connect(got.extend)
    return got


def test_follower_waits_for_the_file_and_for_a_torn_last_line(qtbot, tmp_path):
    path = tmp_path / "events.jsonl"
    f = EventFollower(path, poll_ms=20)
    got = _collect(f)
    with qtbot.waitSignal(f.caught_up, timeout=WAIT_MS):  # it has read to the end of what is there
        f.start(live=True)
    f.poll()
    assert got == []  # the file does not exist yet: nothing, no error
    first, second = _line("metric", 1, loss_dm=1.0), _line("metric", 2, loss_dm=0.5)
    path.write_bytes(first + second[:20])
    qtbot.waitUntil(lambda: len(got) == 1, timeout=WAIT_MS)
    f.poll()
    f.poll()  # two more reads of the same bytes
    assert [e["iter"] for e in got] == [1]  # the torn line is not an event yet
    with open(path, "ab") as out:
        out.write(second[20:] + b"not json\n")
    qtbot.waitUntil(lambda: len(got) == 2, timeout=WAIT_MS)
    assert got[1]["iter"] == 2 and got[1]["data"] == {"loss_dm": 0.5}
    f.stop()


def test_follower_rewinds_when_the_file_is_cut_back_or_replaced(qtbot, tmp_path):
    run = RunFolder(tmp_path)
    run.events_jsonl.write_bytes(b"".join(_line("metric", i, loss_dm=float(i)) for i in range(1, 11)))
    f = EventFollower(run.events_jsonl, poll_ms=20)
    got = _collect(f)
    rewinds = []
    f.rewound.connect(lambda: rewinds.append(len(got)))
    f.start(live=True)
    qtbot.waitUntil(lambda: len(got) == 10, timeout=WAIT_MS)
    run.truncate_after(4)  # what a resume does: an atomic replace with the events up to iter 4
    with open(run.events_jsonl, "ab") as out:  # the resumed engine writes on: the file outgrows the old one
        out.write(b"".join(_line("metric", i, loss_dm=-float(i)) for i in range(5, 16)))
    qtbot.waitUntil(lambda: len(got) == 10 + 15, timeout=WAIT_MS)
    assert rewinds == [10]
    assert [e["iter"] for e in got[10:]] == list(range(1, 16))
    assert got[-1]["data"]["loss_dm"] == -15.0
    run.events_jsonl.write_bytes(_line("metric", 1, loss_dm=9.0))  # cut back in place, shorter
    qtbot.waitUntil(lambda: len(rewinds) == 2 and len(got) == 26, timeout=WAIT_MS)
    f.stop()


def test_follower_of_a_finished_run_reads_to_the_end_and_stops(qtbot, tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(_line("metric", i, loss_dm=1.0) for i in range(1, 6000)))  # > one read slice
    f = EventFollower(path)
    got = _collect(f)
    with qtbot.waitSignal(f.ended, timeout=WAIT_MS):
        f.start(live=False)
    assert [e["iter"] for e in got] == list(range(1, 6000))
    assert not f.is_active()


def test_follower_stop_when_caught_up_reads_the_rest_first(qtbot, tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_bytes(_line("metric", 1, loss_dm=1.0))
    f = EventFollower(path, poll_ms=20)
    got = _collect(f)
    f.start(live=True)
    qtbot.waitUntil(lambda: len(got) == 1, timeout=WAIT_MS)
    with open(path, "ab") as out:
        out.write(_line("finished", 1, elapsed_s=1.0))
    with qtbot.waitSignal(f.ended, timeout=WAIT_MS):
        f.stop_when_caught_up()
    assert [e["kind"] for e in got] == ["metric", "finished"]


# ---------------------------------------------------------------- series


def test_series_grows_and_ignores_iterations_it_has_seen():
    s = Series(capacity=4)
    for i in range(1, 3001):
        assert s.append(i, i * 0.5)
    assert not s.append(3000, 1.0) and not s.append(10, 1.0)
    x, y = s.view()
    assert len(s) == 3000 and x[0] == 1 and x[-1] == 3000 and y[-1] == 1500.0
    assert np.all(np.diff(x) > 0)


def test_store_keeps_numeric_fields_and_dedupes_until_reset():
    store = SeriesStore()
    data = {"loss_dm": 0.5, "mem_peak_alloc_gb": None, "flag": True, "name": "x", "max_train_steps": 9, "eta_s": 3.0}
    assert store.add_metric(2, data) == ["loss_dm"]
    assert store.take_dirty() == {"loss_dm"} and store.take_dirty() == set()
    assert store.add_metric(2, {"loss_dm": 0.7}) == []  # a re-read event
    assert store.add_metric(None, {"loss_dm": 0.7}) == []
    assert store.names() == ["loss_dm"]
    store.reset()
    assert store.add_metric(1, {"loss_dm": 0.9}) == ["loss_dm"]
    assert store.get("loss_dm").view()[1].tolist() == [0.9]


def test_start_with_several_processes_asks_the_engine_to_launch_them(qtbot, tmp_path, fake):
    eng = EngineProcess(command=fake("events"))
    eng.start_train(tmp_path / "cfg.json", num_processes=4)
    try:
        qtbot.waitUntil(lambda: (tmp_path / "argv.json").exists(), timeout=WAIT_MS)
        assert _argv(tmp_path)[:5] == ["train", "--config", str(tmp_path / "cfg.json"), "--num-processes", "4"]
    finally:
        eng.terminate_gracefully()


def test_start_over_several_machines_passes_the_launch_options(qtbot, tmp_path, fake):
    from app.engine.process import LaunchMachines
    from app.dialogs.launch import LaunchDialog, problem

    machines = LaunchMachines(count=2, rank=1, main_ip="10.0.0.1", port=29511)
    assert problem(machines, 8) == ""
    assert problem(LaunchMachines(2, 0, "", 29500), 8) == "several machines need the address of machine 0"
    assert problem(LaunchMachines(3, 0, "h", 29500), 8) == "8 processes in all do not split evenly over 3 machines"
    assert problem(LaunchMachines(2, 2, "h", 29500), 8) == "this machine's rank must be 0 .. 1"
    dialog = LaunchDialog(LaunchMachines(), 8)
    qtbot.addWidget(dialog)
    dialog.count.setValue(2)
    assert not dialog.buttons.button(dialog.buttons.StandardButton.Ok).isEnabled()  # no address yet
    dialog.ip.setText("10.0.0.1")
    assert dialog.buttons.button(dialog.buttons.StandardButton.Ok).isEnabled()
    eng = EngineProcess(command=fake("events"))
    eng.start_train(tmp_path / "cfg.json", num_processes=8, machines=machines)
    try:
        qtbot.waitUntil(lambda: (tmp_path / "argv.json").exists(), timeout=WAIT_MS)
        assert _argv(tmp_path)[3:] == ["--num-processes", "8", "--num-machines", "2", "--machine-rank", "1",
                                       "--main-process-ip", "10.0.0.1", "--main-process-port", "29511"]
    finally:
        eng.terminate_gracefully()
