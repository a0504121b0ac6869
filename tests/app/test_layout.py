"""The main window fits a 1280x800 and a 1024x700 screen with every panel usable, and no message can widen it.

The same geometry walk as `dmad-studio --check-layout` (app/selftest.py), off screen: every panel
and every page of the tab widgets inside it is shown, and any widget that extends past the window
or clips its text is a problem. bench/real_window.py runs it in a real X server with a window
manager (not in CI: no X server there).
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QLabel, QPushButton

from app.screenshots import RECORDED_RUN, no_nvml, prepare_recorded_run
from app.selftest import LAYOUT_SIZE, LAYOUT_SIZES, SMALL_SIZE, settle, show_for_check, walk_panels, widget_problems, window_problems
from app.widgets.gpu_status import GpuReading
from app.widgets.ledger_view import LedgerView
from app.window import PANELS, MainWindow

# A library warning as "Render again" showed it: one line, long, with unbreakable parts
STDERR_LINE = ("/usr/lib/python3/dist-packages/diffusers/models/attention_processor.py:1234: FutureWarning: "
               + "the_deprecated_option_was_renamed_" * 40 + " " + "/very/long/path" * 60)


def _window(qtbot, tmp_path: Path) -> MainWindow:
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat)
    w = MainWindow(settings, runs_root=tmp_path / "runs", load_nvml=no_nvml, unsaved_dir=tmp_path / "unsaved",
                   probes_dir=tmp_path / "probes")
    qtbot.addWidget(w)
    show_for_check(w, LAYOUT_SIZE)
    return w


def _with_run(qtbot, tmp_path: Path) -> MainWindow:
    w = _window(qtbot, tmp_path)
    w.open_run(prepare_recorded_run(RECORDED_RUN, tmp_path / "runs"))
    qtbot.waitUntil(lambda: w.samples.model.columnCount() == 3 and w.samples.model.filled()
                    and w.training.opening() is None, timeout=20_000)  # every panel reads the run in a worker
    return w


def test_every_panel_fits_1280x800_and_1024x700_with_a_run_open(qtbot, tmp_path):
    w = _with_run(qtbot, tmp_path)
    for size in LAYOUT_SIZES:
        w.resize(*size)
        settle()
        assert window_problems(w, size, on_screen=False) == [], size
        assert walk_panels(w, PANELS, settle_ms=100) == [], size
        assert (w.width(), w.height()) == size


def test_the_run_controls_wrap_on_a_narrow_window(qtbot, tmp_path):
    # One line of controls at 1280 px; at 1024 px two, and nothing clipped (the walk above)
    w = _window(qtbot, tmp_path)
    w.show_panel("Training")
    controls = w.training.controls
    settle()
    assert controls.flow.lines(controls.width()) == 1
    w.resize(*SMALL_SIZE)
    settle()
    assert controls.flow.lines(controls.width()) == 2
    assert controls.height() >= 2 * w.training.buttons["start"].height()
    start, machines = w.training.buttons["start"], controls.machines_button
    assert machines.mapTo(w, machines.rect().topLeft()).y() > start.mapTo(w, start.rect().bottomLeft()).y()


def test_no_message_line_widens_the_window(qtbot, tmp_path):
    w = _with_run(qtbot, tmp_path)
    samples, memory = w.samples, w.memory
    for label in (samples.header, samples.render_status, w.data.status, memory.estimate_status, memory.run_label,
                  memory.probe.status, w.config.json.error, w.config.findChild(LedgerView).status):
        label.setText(STDERR_LINE)
    w.config.json.error.show()
    w.config.form.mark_errors({("identity", "pretrained_model_name_or_path"): STDERR_LINE})
    w.gpu.setText("   ".join(GpuReading(i, "NVIDIA H200 NVL", 17.5, 139.8, 97).text() for i in range(8)))
    w.gpu.show()
    samples.grid.set_current_cell(0, 1)
    settle()
    for name in PANELS:
        w.show_panel(name)
        settle(100)
        assert w.minimumSizeHint().width() <= LAYOUT_SIZE[0], name
        assert w.width() == LAYOUT_SIZE[0], name
    assert walk_panels(w, PANELS, settle_ms=100) == []
    assert samples.render_status.toolTip() == " ".join(STDERR_LINE.split())  # the whole line is still there


def test_the_walk_reports_a_widget_that_does_not_fit(qtbot, tmp_path):
    # The check itself can fail: a plain label with the same line, and a button narrower than its text
    w = _window(qtbot, tmp_path)
    w.show_panel("Data")
    w.data.layout().addWidget(QLabel(STDERR_LINE))
    squeezed = QPushButton("Check the whole dataset again")
    squeezed.setFixedWidth(40)
    w.data.layout().addWidget(squeezed)
    settle()
    assert any("minimum size" in p for p in window_problems(w, LAYOUT_SIZE, on_screen=False))
    problems = widget_problems(w, "Data")
    assert any("QPushButton 'Check the whole dataset again' is clipped" in p for p in problems), problems
