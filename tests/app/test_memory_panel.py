"""Memory in the app: the Config panel's live "Memory estimate" (dmad ledger --json), the Memory tab's
probe (dmad probe: run, progress, cancel, the trade-off table, curves, recommendation and Apply) and
the OOM advice in the Training panel's failure banner.

The engine is a stand-in written by each test (a small script that speaks the `ledger` and `probe`
command lines as docs/memory.md describes them), so these tests need neither torch nor a GPU; the
probe.json and ledger fixtures are in tests/app/fixtures/probe/ (ledger_sd3_offload.json is what the
real `dmad ledger --json` printed for a configs-only SD3-medium folder with an int8 teacher offloaded
to CPU and separate LoRA copies: the SD3-medium 24 GB preset's settings before the shared frozen
base). Slow tests run the real CLI (the probe one when `dmad probe` exists).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings

from app.engine.command import DmadCommand
from app.panels.config import ConfigPanel
from app.engine.process import failure_report
from app.panels.probe import COLUMNS, SCOPE_AXIS, ProbePanel
from app.models.probe_result import load_probe, parse_int_list
from app.panels.training import TrainingPanel
from app.window import MainWindow
from tests.app.test_training_panel import _event, write_run
from tests.conftest import gone
from dmad.contract.memory import parse_ledger
from dmad.memory.ledger import CONTEXT_GIB
from dmad.contract.paths import engine_argv

FIXTURES = Path(__file__).parent / "fixtures" / "probe"
WAIT_MS = 60_000  # generous: the machine is shared; nothing here is a timing test

STAND_IN = r'''
import json, os, pathlib, subprocess, sys, time
here = pathlib.Path(__file__).parent
args = sys.argv[1:]
with open(here / "calls.jsonl", "a") as f:
    f.write(json.dumps({"args": args, "pid": os.getpid()}) + "\n")
mode = (here / "mode").read_text().strip()
fixtures = pathlib.Path(FIXTURES)
if args[0] == "ledger":
    config = json.loads(pathlib.Path(args[args.index("--config") + 1]).read_text())
    res = config.get("resources", {}).get("resolution", 512)
    if mode == "error":
        print("Traceback (most recent call last): ...", file=sys.stderr)
        print("dmad: error: teacher config not found: /nowhere/unet/config.json", file=sys.stderr)
        sys.exit(2)
    if mode == "slow:%d" % res:
        time.sleep(600)
    if mode == "sd3-offload":  # the real engine's answer for SD3-medium with teacher_cpu_offload, as captured
        print((fixtures / "ledger_sd3_offload.json").read_text())
        sys.exit(0)
    ledger = json.loads((fixtures / "ledger.json").read_text())
    ledger["total_gib"] = res / 8.0
    ledger["inputs"]["resolution"] = res
    print(json.dumps(ledger))
    sys.exit(0)
assert args[0] == "probe"
out = pathlib.Path(args[args.index("--out") + 1])
if mode == "usage":
    print("dmad: error: --batch: expected whole numbers, got 'x'", file=sys.stderr, flush=True)
    sys.exit(2)
print("progress 1 4", file=sys.stderr, flush=True)
if mode == "hang":
    child = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"])
    (here / "child.pid").write_text(str(child.pid))
    while True:
        time.sleep(0.05)
while mode == "wait" and not (here / "go").exists():
    time.sleep(0.02)
out.mkdir(parents=True, exist_ok=True)
probe = json.loads((fixtures / "probe.json").read_text())
if mode == "fail":
    probe["points"] = probe["points"][:2]
    (out / "probe.json").write_text(json.dumps(probe))
    print("dmad: error: point 2 failed: the point's process was killed (signal 9)", file=sys.stderr, flush=True)
    sys.exit(1)
print("progress 4 4", file=sys.stderr, flush=True)
(out / "probe.json").write_text(json.dumps(probe))
'''


class StandIn:
    def __init__(self, folder: Path, mode: str = "run"):
        self.dir = folder
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "standin.py").write_text(f"FIXTURES = {str(FIXTURES)!r}\n" + STAND_IN, encoding="utf-8")
        self.set(mode)

    def set(self, mode: str) -> None:
        (self.dir / "mode").write_text(mode)

    @property
    def command(self) -> list[str]:
        return [sys.executable, str(self.dir / "standin.py")]

    def calls(self, sub: str) -> list[dict]:
        path = self.dir / "calls.jsonl"
        lines = path.read_text().splitlines() if path.is_file() else []
        return [c for c in map(json.loads, lines) if c["args"][0] == sub]


# ---------------------------------------------------------------- Config panel: the memory estimate

@pytest.fixture
def config_panel(qtbot, tmp_path):
    def make(mode: str = "run") -> tuple[ConfigPanel, StandIn]:
        stand_in = StandIn(tmp_path / "standin", mode)
        p = ConfigPanel(unsaved_dir=tmp_path / "unsaved", engine_command=stand_in.command)
        qtbot.addWidget(p)
        p.resize(1200, 700)
        p.show()
        return p, stand_in
    return make


def resolution_field(panel: ConfigPanel):
    return panel.form.rows[("resources", "resolution")].editor.control()


def shown_ledger(panel: ConfigPanel) -> dict:
    t = panel.ledger_view.table
    return {t.item(i, 0).text(): (t.item(i, 1).text(), t.item(i, 2).text()) for i in range(t.rowCount())}


def test_the_memory_estimate_follows_the_form(qtbot, config_panel):
    panel, stand_in = config_panel()
    assert stand_in.calls("ledger") == []  # nothing runs while the tab is hidden
    with qtbot.waitSignal(panel.ledger_view.ledger_shown, timeout=WAIT_MS) as first:
        panel.side.setCurrentWidget(panel.ledger_view)
    res = panel.config()["resources"]["resolution"]
    assert first.args[0].inputs["resolution"] == res
    fixture = json.loads((FIXTURES / "ledger.json").read_text())
    assert shown_ledger(panel) == {x["name"]: (f"{x['gib']:.2f}", x["assumption"]) for x in fixture["lines"]}
    assert [panel.ledger_view.table.horizontalHeaderItem(i).text() for i in range(3)] == ["component", "GiB",
                                                                                          "assumption"]
    assert f"{res / 8:.2f} GiB estimated" in panel.ledger_view.total_text()
    call = stand_in.calls("ledger")[0]["args"]
    assert call[0] == "ledger" and call[-3:] == ["--json", "--processes", "1"]
    config = Path(call[call.index("--config") + 1])
    assert json.loads(config.read_text())["resources"]["resolution"] == res  # the form, materialized

    with qtbot.waitSignal(panel.ledger_view.ledger_shown, timeout=WAIT_MS) as second:
        for value in ("48", "72", "96"):  # three quick edits: one engine run, for the last
            resolution_field(panel).setText(value)
    assert second.args[0].inputs["resolution"] == 96 and "12.00 GiB estimated" in panel.ledger_view.total_text()
    assert len(stand_in.calls("ledger")) == 2


def test_an_invalid_config_is_not_estimated(qtbot, config_panel):
    panel, stand_in = config_panel()
    with qtbot.waitSignal(panel.ledger_view.ledger_shown, timeout=WAIT_MS):
        panel.side.setCurrentWidget(panel.ledger_view)
    resolution_field(panel).setText("100")  # not a multiple of 8
    assert not panel.is_valid() and not panel.ledger_view.is_pending()
    assert panel.ledger_view.status.text().startswith("Not estimated: the config is not valid")
    assert "resources.resolution" in panel.ledger_view.status.text()
    assert len(stand_in.calls("ledger")) == 1  # and nothing pending (no debounce timer) can start one later


def test_a_newer_request_supersedes_a_slow_stale_one(qtbot, config_panel):
    panel, stand_in = config_panel("slow:96")
    with qtbot.waitSignal(panel.ledger_view.ledger_shown, timeout=WAIT_MS):
        panel.side.setCurrentWidget(panel.ledger_view)
    resolution_field(panel).setText("96")  # this one never answers
    qtbot.waitUntil(lambda: len(stand_in.calls("ledger")) == 2, timeout=WAIT_MS)
    slow_pid = stand_in.calls("ledger")[1]["pid"]
    shown = []
    panel.ledger_view.ledger_shown.connect(shown.append)
    with qtbot.waitSignal(panel.ledger_view.ledger_shown, timeout=WAIT_MS):
        resolution_field(panel).setText("128")
    assert [s.inputs["resolution"] for s in shown] == [128]
    qtbot.waitUntil(lambda: gone(slow_pid), timeout=WAIT_MS)  # the stale request was killed
    # and both commands are deleted: nothing is left that could still deliver an answer
    qtbot.waitUntil(lambda: not panel.ledger_view.findChildren(DmadCommand), timeout=WAIT_MS)
    assert [s.inputs["resolution"] for s in shown] == [128] and panel.ledger_view.ledger().total_gib == 16.0


def test_a_ledger_error_is_one_red_line(qtbot, config_panel):
    panel, stand_in = config_panel("error")
    with qtbot.waitSignal(panel.ledger_view.failed, timeout=WAIT_MS) as blocker:
        panel.side.setCurrentWidget(panel.ledger_view)
    line = "dmad: error: teacher config not found: /nowhere/unet/config.json"
    assert blocker.args == [line] and panel.ledger_view.status.text() == line
    assert "c0392b" in panel.ledger_view.status.styleSheet() and panel.ledger_view.table.rowCount() == 0


def test_the_estimate_is_shown_against_the_gpus_device_wide_total(qtbot, config_panel):
    panel, _ = config_panel()
    with qtbot.waitSignal(panel.ledger_view.ledger_shown, timeout=WAIT_MS):
        panel.side.setCurrentWidget(panel.ledger_view)
    panel.set_device("NVIDIA GeForce RTX 4090", 23.99)
    text = panel.ledger_view.total_text()
    assert "GiB estimated</b> (framework scope)" in text
    assert "of <b>24.0 GiB on NVIDIA GeForce RTX 4090</b> (device-wide total, NVML)" in text


def test_apply_changes_edits_the_form_as_one_change(qtbot, config_panel):
    panel, _ = config_panel()
    with qtbot.waitSignal(panel.config_edited):
        panel.apply_changes({"resources.train_batch_size": 2, "resources.gradient_checkpointing": True})
    res = panel.config()["resources"]
    assert res["train_batch_size"] == 2 and res["gradient_checkpointing"] is True
    assert panel.form.rows[("resources", "train_batch_size")].editor.control().text() == "2"
    assert panel.doc.is_modified() and '"train_batch_size": 2' in panel.json.edit.toPlainText()


# ---------------------------------------------------------------- the Memory tab's probe

@pytest.fixture
def probe_panel(qtbot, tmp_path):
    def make(mode: str = "run") -> tuple[ProbePanel, StandIn]:
        stand_in = StandIn(tmp_path / "standin", mode)
        config = tmp_path / "config.json"
        config.write_text("{}")
        p = ProbePanel(lambda: config, stand_in.command, probes_dir=tmp_path / "probes")
        qtbot.addWidget(p)
        p.resize(1200, 800)
        return p, stand_in
    return make


def cells(panel: ProbePanel, row: int) -> list[str]:
    return [panel.table.item(row, j).text() for j in range(panel.table.columnCount())]


def curve_xy(curve) -> tuple[list, list]:
    x, y = curve.getData()
    return ([] if x is None else [float(v) for v in x]), ([] if y is None else [round(float(v), 3) for v in y])


def test_a_probe_folder_renders_table_curves_and_recommendation(qtbot, probe_panel):
    panel, _ = probe_panel()
    with qtbot.waitSignal(panel.result_shown, timeout=WAIT_MS):
        panel.open_probe(FIXTURES)
    headers = [panel.table.horizontalHeaderItem(j).text() for j in range(panel.table.columnCount())]
    assert headers == list(COLUMNS)
    flat = [" ".join(h.split()) for h in headers]
    assert "framework peak GiB (torch allocator)" in flat and "device peak GiB (NVML, all processes)" in flat
    assert "process peak RSS GiB (host RAM)" in flat and "ledger estimate GiB (framework)" in flat
    assert panel.table.rowCount() == 6
    assert cells(panel, 0)[:9] == ["0", "baseline", "1", "1", "1", "512", "bf16", "off", "ok"]
    assert cells(panel, 2)[9:] == ["18.90", "20.40", "7.20", "1.610", "0.070", "1.540", "18.30"]
    assert cells(panel, 3)[8] == "OOM in first-backward" and cells(panel, 5)[8] == "OOM in first-forward"
    assert cells(panel, 5)[9:12] == ["", "", ""]  # never measured: blank, not zero
    assert panel.mem_plot.getPlotItem().getAxis("left").labelText == SCOPE_AXIS["framework"]
    assert sorted(panel.mem_curves) == [512, 768] and sorted(panel.time_curves) == [512, 768]
    assert curve_xy(panel.mem_curves[512]) == ([1.0, 2.0], [14.6, 18.9])  # ok train points; baseline not drawn
    assert curve_xy(panel.mem_curves[768]) == ([1.0], [19.7])
    assert curve_xy(panel.time_curves[512]) == ([1.0, 2.0], [0.92, 1.61])
    assert curve_xy(panel.mem_oom) == ([4.0, 2.0], [23.1, 28.9])  # measured before failing, else the estimate
    assert curve_xy(panel.time_oom)[0] == [4.0, 2.0]
    text = panel.recommendation.text()
    assert "Turn on gradient checkpointing" in text and "768 px does not fit" in text
    assert "NVIDIA GeForce RTX 4090" in text and "resources.gradient_accumulation_steps = 2" in text
    assert panel.apply_button.isEnabled()
    with qtbot.waitSignal(panel.apply_requested) as blocker:
        panel.apply_button.click()
    assert blocker.args == [json.loads((FIXTURES / "probe.json").read_text())["recommendation"]["config_changes"]]


def test_a_cpu_probe_charts_process_rss_and_says_so(qtbot, probe_panel, tmp_path):
    probe = json.loads((FIXTURES / "probe.json").read_text())
    for p in probe["points"]:
        p["framework_peak_gb"] = p["device_peak_gb"] = None
    probe["machine"] = {"device": "cpu", "device_total_gb": None}
    probe["recommendation"]["config_changes"] = {}
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "probe.json").write_text(json.dumps(probe))
    panel, _ = probe_panel()
    with qtbot.waitSignal(panel.result_shown, timeout=WAIT_MS):
        panel.open_probe(tmp_path / "cpu")
    assert panel.mem_plot.getPlotItem().getAxis("left").labelText == SCOPE_AXIS["process"]
    assert curve_xy(panel.mem_curves[512]) == ([1.0, 2.0], [7.1, 7.2])
    assert curve_xy(panel.mem_oom) == ([4.0, 2.0], [7.3, 28.9])
    assert not panel.apply_button.isEnabled()  # nothing to apply


def test_a_folder_that_is_not_a_probe_is_one_red_line(qtbot, probe_panel, tmp_path):
    panel, _ = probe_panel()
    (tmp_path / "empty").mkdir()
    panel.open_probe(tmp_path / "empty")
    qtbot.waitUntil(lambda: "no probe.json" in panel.status.text(), timeout=WAIT_MS)
    assert "c0392b" in panel.status.styleSheet() and "\n" not in panel.status.text()
    (tmp_path / "empty" / "probe.json").write_text('{"version": 2}')
    panel.open_probe(tmp_path / "empty")
    qtbot.waitUntil(lambda: "not a probe result of version 1" in panel.status.text(), timeout=WAIT_MS)


def test_run_probe_passes_the_inputs_and_fills_the_table(qtbot, probe_panel, tmp_path):
    panel, stand_in = probe_panel("wait")
    panel.set_config({"resources": {"train_batch_size": 2, "resolution": 768}})
    assert (panel.batch_edit.text(), panel.resolution_edit.text()) == ("2", "768")  # the config's defaults
    panel.batch_edit.setText("1, 2,4")
    panel.resolution_edit.setText("512,768")
    panel.steps.setValue(5)
    panel.warmup.setValue(2)
    panel.set_config({"resources": {"train_batch_size": 3, "resolution": 512}})
    assert panel.batch_edit.text() == "1, 2,4"  # the user's choice stays
    assert panel.run() and panel.is_running() and panel.buttons["cancel"].isEnabled()
    assert not panel.buttons["run"].isEnabled()
    qtbot.waitUntil(lambda: (panel.progress.value(), panel.progress.maximum()) == (1, 4), timeout=WAIT_MS)
    with qtbot.waitSignal(panel.probe_finished, timeout=WAIT_MS) as blocker:
        (stand_in.dir / "go").write_text("")
    assert blocker.args[0] == 0 and panel.table.rowCount() == 6
    args = stand_in.calls("probe")[0]["args"]
    assert args[:3] == ["probe", "--config", str(tmp_path / "config.json")] and "--progress" in args
    opt = lambda name: args[args.index(name) + 1]  # noqa: E731
    assert (opt("--batch"), opt("--resolution"), opt("--steps"), opt("--warmup")) == ("1,2,4", "512,768", "5", "2")
    out = Path(opt("--out"))
    assert out.parent == tmp_path / "probes" and out.name.startswith("probe-") and panel.out_dir() == out
    assert (panel.progress.value(), panel.progress.maximum()) == (1, 1) and panel.buttons["run"].isEnabled()


def test_bad_inputs_start_nothing(qtbot, probe_panel):
    panel, stand_in = probe_panel()
    panel.batch_edit.setText("1,two")
    assert not panel.run()
    assert panel.status.text() == "Probe not started: batch: whole numbers separated by commas, got '1,two'"
    assert stand_in.calls("probe") == []
    with pytest.raises(ValueError):
        parse_int_list("0", "batch")


def test_cancel_kills_the_probe_and_the_point_it_runs(qtbot, probe_panel):
    panel, stand_in = probe_panel("hang")
    panel.run()
    qtbot.waitUntil(lambda: (stand_in.dir / "child.pid").is_file() and panel.progress.value() == 1,
                    timeout=WAIT_MS)
    engine_pid, child_pid = stand_in.calls("probe")[0]["pid"], int((stand_in.dir / "child.pid").read_text())
    assert not gone(child_pid)
    with qtbot.waitSignal(panel.probe_finished, timeout=WAIT_MS) as blocker:
        panel.buttons["cancel"].click()
    assert blocker.args == [-1, "Probe cancelled."] and not panel.is_running()
    qtbot.waitUntil(lambda: gone(engine_pid) and gone(child_pid), timeout=WAIT_MS)


def test_a_usage_error_is_the_engines_line(qtbot, probe_panel):
    panel, _ = probe_panel("usage")
    with qtbot.waitSignal(panel.probe_finished, timeout=WAIT_MS) as blocker:
        panel.run()
    assert blocker.args == [2, "dmad: error: --batch: expected whole numbers, got 'x'"]
    assert panel.status.text() == blocker.args[1] and "c0392b" in panel.status.styleSheet()


def test_a_failed_probe_still_shows_the_points_it_measured(qtbot, probe_panel):
    panel, _ = probe_panel("fail")
    with qtbot.waitSignal(panel.probe_finished, timeout=WAIT_MS) as blocker:
        panel.run()
    code, line = blocker.args
    assert code == 1 and panel.table.rowCount() == 2
    assert line.startswith("dmad: error: point 2 failed") and "(showing the 2 points measured)" in line


# ---------------------------------------------------------------- the window's wiring

@pytest.fixture
def window(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat)
    w = MainWindow(settings, runs_root=tmp_path / "runs", load_nvml=lambda: (_ for _ in ()).throw(ImportError()),
                   unsaved_dir=tmp_path / "unsaved", probes_dir=tmp_path / "probes")
    qtbot.addWidget(w)
    yield w
    w.training._clear()


def test_apply_in_the_memory_tab_edits_the_config_form(qtbot, window):
    raw = window.config.config()
    assert window.memory.probe.batch_edit.text() == str(raw["resources"].get("train_batch_size", 1))
    with qtbot.waitSignal(window.memory.probe.result_shown, timeout=WAIT_MS):
        window.memory.open_probe(FIXTURES)
    window.memory.probe.apply_button.click()
    res = window.config.config()["resources"]
    assert (res["train_batch_size"], res["resolution"], res["gradient_accumulation_steps"]) == (2, 512, 2)
    assert res["gradient_checkpointing"] is True and window.config.doc.is_modified()
    assert window.tabs.currentWidget() is window.config
    assert window.memory.probe.batch_edit.text() == "2"  # the probe's defaults follow the config


def test_the_gpu_total_reaches_the_memory_estimate(window):
    from app.widgets.gpu_status import GpuReading

    window.gpu.readings_received.emit([GpuReading(0, "NVIDIA H200", 1.0, 139.8, 0)])
    window.config.ledger_view._ledger = load_ledger_fixture()
    window.config.ledger_view._show_total()
    assert "of <b>139.8 GiB on NVIDIA H200</b>" in window.config.ledger_view.total_text()


def load_ledger_fixture():
    return parse_ledger((FIXTURES / "ledger.json").read_text())


def test_parse_ledger_keeps_scopes_and_family():
    sd3 = parse_ledger((FIXTURES / "ledger_sd3_offload.json").read_text())
    assert sd3.family == "sd3" and [x.name for x in sd3.cpu_lines] == ["teacher transformer + text encoders (CPU RAM)"]
    assert sd3.total_gib == pytest.approx(sum(x.gib for x in sd3.gpu_lines), abs=1e-3)  # GPU lines only
    assert sd3.cpu_gib == pytest.approx(12.289)
    old = parse_ledger((FIXTURES / "ledger.json").read_text())  # no family, no scopes: every line on the GPU
    assert old.family is None and not old.cpu_lines and len(old.gpu_lines) == len(old.lines)
    bad = json.loads((FIXTURES / "ledger_sd3_offload.json").read_text())
    bad["lines"][0]["scope"] = "disk"
    with pytest.raises(ValueError, match="malformed ledger: .*scope 'disk'"):
        parse_ledger(json.dumps(bad))


def assert_sd3_offload_shown(panel: ConfigPanel, ledger) -> None:
    """The family in the status; GPU lines, then the CPU RAM heading and its line; the total is the
    engine's GPU total, with the CPU RAM stated apart."""
    from app.widgets.ledger_view import CPU_HEADING

    view, t = panel.ledger_view, panel.ledger_view.table
    assert "SD3 (sd3)" in view.status.text() and "host RAM is listed apart" in view.status.text()
    gpu, cpu = ledger.gpu_lines, ledger.cpu_lines
    assert len(cpu) == 1 and t.rowCount() == len(gpu) + 2
    assert [t.item(i, 0).text() for i in range(len(gpu))] == [x.name for x in gpu]
    assert t.item(len(gpu), 0).text() == CPU_HEADING and t.columnSpan(len(gpu), 0) == 3
    row = len(gpu) + 1
    assert (t.item(row, 0).text(), t.item(row, 1).text()) == (cpu[0].name, f"{cpu[0].gib:.2f}")
    text = view.total_text()
    assert f"<b>{ledger.total_gib:.2f} GiB estimated</b> (framework scope)" in text
    assert f"<b>{cpu[0].gib:.2f} GiB of CPU RAM</b>" in text and "not in the GPU total" in text and cpu[0].name in text
    assert f"{ledger.total_gib + cpu[0].gib:.2f}" not in text  # never added into the GPU figure
    shown_gpu = sum(float(t.item(i, 1).text()) for i in range(len(gpu)))
    assert shown_gpu == pytest.approx(ledger.total_gib, abs=0.01 * len(gpu))


def test_an_offloaded_teacher_is_shown_apart_from_the_gpu_total(qtbot, config_panel):
    panel, _ = config_panel("sd3-offload")
    with qtbot.waitSignal(panel.ledger_view.ledger_shown, timeout=WAIT_MS) as blocker:
        panel.side.setCurrentWidget(panel.ledger_view)
    ledger = blocker.args[0]
    assert ledger.total_gib == 21.2942 and ledger.inputs["teacher_cpu_offload"] is True
    assert_sd3_offload_shown(panel, ledger)
    panel.set_device("NVIDIA GeForce RTX 4090", 23.99)
    assert "of <b>24.0 GiB on NVIDIA GeForce RTX 4090</b>" in panel.ledger_view.total_text()
    assert "12.29 GiB of CPU RAM" in panel.ledger_view.total_text()


# ---------------------------------------------------------------- the OOM advice in the failure banner

ADVICE = "Turn on resources.gradient_checkpointing (saves ~40% of activations); then halve train_batch_size"


def test_failure_report_adds_the_advice_after_the_cause():
    error = {"reason": "out of memory during first-backward: CUDA out of memory", "exit_code": 3,
             "cause": "out_of_memory", "phase": "first-backward", "advice": ADVICE, "last_checkpoint": None}
    title, lines = failure_report(3, "", error, {})
    assert title == "Training failed - exit code 3 (out of memory)"
    assert lines == ["out of memory during first-backward: CUDA out of memory",
                     "Cause: out of memory during first-backward", f"Advice: {ADVICE}"]
    assert failure_report(3, "", {}, {"failure_reason": "oom", "advice": ADVICE})[1] == ["oom", f"Advice: {ADVICE}"]
    assert not any(line.startswith("Advice") for line in failure_report(1, "x", {"cause": "exception"}, {})[1])


def test_the_banner_shows_the_oom_advice(qtbot, tmp_path, open_and_wait):
    panel = TrainingPanel()
    qtbot.addWidget(panel)
    err = _event("error", 1, reason="out of memory during first-backward: CUDA out of memory", exit_code=3,
                 cause="out_of_memory", phase="first-backward", advice=ADVICE, last_checkpoint=None)
    run = write_run(tmp_path, "oom", iters=range(1, 2), state="failed", tail=err,
                    failure_reason="out of memory during first-backward", exit_code=3, advice=ADVICE)
    open_and_wait(panel, run.path)
    qtbot.waitUntil(lambda: not panel.banner.isHidden(), timeout=WAIT_MS)
    text = panel.banner.text()
    assert "Cause: out of memory during first-backward" in text and f"Advice: {ADVICE}" in text
    assert text.index("Cause:") < text.index("Advice:")


# ---------------------------------------------------------------- the real engine

def _has_probe_cli() -> bool:
    return subprocess.run(engine_argv("probe", "--help"), capture_output=True).returncode == 0


@pytest.mark.slow
def test_the_real_ledger_fills_the_memory_estimate(qtbot, tmp_path):
    panel = ConfigPanel(unsaved_dir=tmp_path / "unsaved")  # the CPU demo preset, the engine's own command line
    qtbot.addWidget(panel)
    panel.show()
    with qtbot.waitSignal(panel.ledger_view.ledger_shown, timeout=600_000) as blocker:
        panel.side.setCurrentWidget(panel.ledger_view)
    ledger = blocker.args[0]
    assert ledger.inputs["resolution"] == panel.config()["resources"]["resolution"] and ledger.total_gib > 0
    assert panel.ledger_view.table.rowCount() == len(ledger.lines) > 3
    assert "GiB estimated" in panel.ledger_view.total_text()


@pytest.mark.slow
def test_the_real_ledger_of_an_offloaded_sd3_teacher(qtbot, tmp_path):
    """The real `dmad ledger` on a configs-only SD3-medium folder (the SD3-medium 24 GB preset with an
    int8 teacher offloaded and separate LoRA copies, the fixture's settings): the family and the CPU
    RAM line reach the view, apart from the GPU total."""
    from app.models.presets import presets
    from tests.engine.real_configs import write_real_config_folder

    teacher = write_real_config_folder(tmp_path / "sd3-medium", "sd3-medium")
    preset = next(p for p in presets() if p.name.startswith("SD3-medium \u2014 24 GB"))
    raw = preset.load_raw()
    raw["identity"].update(pretrained_model_name_or_path=str(teacher), output_dir=str(tmp_path / "runs"),
                           train_data_dir=str(tmp_path / "data"))
    raw["observation"].pop("prompt_set", None)
    raw["resources"].update(teacher_precision="int8", teacher_cpu_offload=True, share_frozen_base=False)
    config = tmp_path / "sd3.json"
    config.write_text(json.dumps(raw), encoding="utf-8")
    panel = ConfigPanel(unsaved_dir=tmp_path / "unsaved")
    qtbot.addWidget(panel)
    panel.show()
    assert panel.load_file(config)
    with qtbot.waitSignal(panel.ledger_view.ledger_shown, timeout=600_000) as blocker:
        panel.side.setCurrentWidget(panel.ledger_view)
    ledger = blocker.args[0]
    assert_sd3_offload_shown(panel, ledger)
    captured = json.loads((FIXTURES / "ledger_sd3_offload.json").read_text())
    # captured on a GPU machine: where the engine sees no CUDA device it sizes a CPU run, whose
    # margin has no CUDA context (dmad.memory.ledger.margin_line)
    context = CONTEXT_GIB if ledger.inputs["device"] == "cpu" else 0.0
    assert ledger.total_gib == pytest.approx(captured["total_gib"] - context, abs=1e-4)
    assert ledger.family == captured["family"]
    assert [(x.name, x.scope) for x in ledger.lines] == [(x["name"], x["scope"]) for x in captured["lines"]]
    assert [x.gib for x in ledger.lines] == pytest.approx(
        [x["gib"] - (context if x["name"] == "margin" else 0.0) for x in captured["lines"]], abs=1e-4)


@pytest.mark.slow
def test_the_real_probe_fills_the_table(qtbot, tmp_path, write_config):
    if not _has_probe_cli():
        pytest.skip("`dmad probe` is not in this engine yet")
    config = write_config()
    panel = ProbePanel(lambda: config, probes_dir=tmp_path / "probes")
    qtbot.addWidget(panel)
    panel.batch_edit.setText("1")
    panel.resolution_edit.setText("32")
    panel.steps.setValue(2)
    panel.warmup.setValue(1)
    with qtbot.waitSignal(panel.probe_finished, timeout=600_000) as blocker:
        assert panel.run()
    assert blocker.args[0] == 0, blocker.args[1]
    result = load_probe(panel.out_dir())
    assert panel.table.rowCount() == len(result.points) >= 2  # the baseline and the train point
    assert {p.kind for p in result.points} == {"baseline", "train"}
    assert [panel.table.item(r, 8).text() for r in range(panel.table.rowCount())] == [p.status_text()
                                                                                       for p in result.points]
    assert panel.mem_plot.getPlotItem().getAxis("left").labelText == SCOPE_AXIS[result.memory_scope()]
    trained = [p for p in result.points if p.kind == "train" and p.status == "ok"]
    assert len(curve_xy(panel.time_curves[32])[0]) == len(trained)
