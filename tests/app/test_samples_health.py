"""Issue 39, app side: each checkpoint's health figures under its Samples column header, ordering the
columns / picking the best checkpoint by a signal, alerted checkpoints marked; health.csv as a hostile
user leaves it (bad numbers, 1e999, missing columns, a FIFO) is one line, never a raise or a hang."""
from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from app.models.health import AlertTracker, read_health_csv
from app.panels.samples import SamplesPanel
from app.screenshots import RECORDED_RUN, prepare_recorded_run
from app.widgets.samples_grid import RED, scan_grid
from tests.app.health_fixtures import alert, csv_row, signals, write_health_csv
from tests.app.test_samples_grid import _copy_folder, _open, _panel

HANG_S = 60  # only a real hang fails


@pytest.fixture
def run(tmp_path) -> Path:
    run = prepare_recorded_run(RECORDED_RUN, tmp_path / "runs")  # teacher, iter_60, iter_120
    _copy_folder(run, "iter_120", "iter_180")
    write_health_csv(run, [csv_row(60, signals(0.82, 1.05, 0.93), "iter_60"),
                           csv_row(90, signals(0.7, 1.1, 0.9)),  # a validation between checkpoints
                           csv_row(120, signals(0.41, 1.30, 0.80, 0.3), "iter_120", alerts=("diversity",)),
                           csv_row(180, signals(0.97, 0.98, 1.1, 0.2), "iter_180")])
    return run


def _shown_headers(panel: SamplesPanel) -> list[str]:
    return [panel.model.headerData(c, Qt.Horizontal) for c in panel.grid.column_order()]


def _names(panel: SamplesPanel) -> list[str]:
    return [h.split("\n")[0].lstrip("\u26a0 ") for h in _shown_headers(panel)]


def test_figures_under_headers_order_and_best(qtbot, tmp_path, run):
    panel = _panel(qtbot, tmp_path)
    _open(qtbot, panel, run)
    assert _shown_headers(panel) == ["teacher\nreference", "iter_60\ndiv 82% · sat 105%\ndetail 93%",
                                     "\u26a0 iter_120\ndiv 41% · sat 130%\ndetail 80%",
                                     "iter_180\ndiv 97% · sat 98%\ndetail 110%"]
    model = panel.model
    alerted = [c for c in range(model.columnCount()) if model.headerData(c, Qt.Horizontal, Qt.ForegroundRole) == RED]
    assert [model.index_.columns[c].name for c in alerted] == ["iter_120"]
    assert "Diversity: 41% (alert)" in model.headerData(alerted[0], Qt.Horizontal, Qt.ToolTipRole)

    panel.order_by.setCurrentIndex(panel.order_by.findData("detail"))  # |1 - v|: 0.07, 0.2, 0.1
    assert _names(panel) == ["teacher", "iter_60", "iter_180", "iter_120"]
    panel.order_by.setCurrentIndex(panel.order_by.findData("teacher_distance"))  # lowest first: 0.1, 0.2, 0.3
    assert _names(panel) == ["teacher", "iter_60", "iter_180", "iter_120"]
    assert "dist 0.10" in _shown_headers(panel)[1]  # the signal sorted by is among the figures
    panel.order_by.setCurrentIndex(panel.order_by.findData("diversity"))
    assert _names(panel) == ["teacher", "iter_180", "iter_60", "iter_120"]
    assert panel.go_to_best() == "iter_180"
    assert model.key(*panel.grid.current_cell())[1] == "iter_180"
    assert "Best by diversity: iter_180 (97%)" in panel.render_status.text()
    panel.order_by.setCurrentIndex(0)  # back to checkpoint order
    assert _names(panel) == ["teacher", "iter_60", "iter_120", "iter_180"]


def test_header_figures_take_as_many_a_line_as_the_column_holds(qtbot, tmp_path, run):
    """Narrow thumbnails: one figure a line, then none (the tooltip keeps them); never a figure line
    wider than its column, which Qt would clip on both sides."""
    from app.widgets.samples_grid import CELL_RANGE

    panel = _panel(qtbot, tmp_path)
    _open(qtbot, panel, run)
    fm = panel.grid.horizontalHeader().fontMetrics()
    pair, single = fm.horizontalAdvance("div 82% · sat 105%"), fm.horizontalAdvance("detail 110%")
    panel.grid.set_cell_px(max(single, fm.horizontalAdvance("div 97%"), fm.horizontalAdvance("sat 130%")) + 4)
    assert single + 4 < pair + 2  # the width chosen holds one figure and not two
    assert _shown_headers(panel)[1] == "iter_60\ndiv 82%\nsat 105%\ndetail 93%"
    panel.grid.set_cell_px(CELL_RANGE[0])
    assert _shown_headers(panel) == ["teacher", "iter_60", "\u26a0 iter_120", "iter_180"]
    assert "Diversity: 82%" in panel.model.headerData(1, Qt.Horizontal, Qt.ToolTipRole)
    for px in (CELL_RANGE[0], 80, 120, CELL_RANGE[1]):
        panel.grid.set_cell_px(px)
        for header in _shown_headers(panel):
            assert all(fm.horizontalAdvance(line) <= px - 2 for line in header.split("\n")[1:])
    panel.grid.set_cell_px(CELL_RANGE[1])
    assert _shown_headers(panel)[1] == "iter_60\ndiv 82% · sat 105%\ndetail 93%"


def test_a_run_without_health_shows_plain_headers(qtbot, tmp_path):
    run = prepare_recorded_run(RECORDED_RUN, tmp_path / "runs")
    panel = _panel(qtbot, tmp_path)
    _open(qtbot, panel, run)
    assert _shown_headers(panel) == ["teacher", "iter_60", "iter_120"]
    assert panel.go_to_best() is None and "No checkpoint has a diversity figure" in panel.render_status.text()


def _read_in_thread(run: Path):
    out = {}
    worker = threading.Thread(target=lambda: out.update(table=read_health_csv(run)), daemon=True)
    worker.start()
    worker.join(HANG_S)
    assert not worker.is_alive(), "read_health_csv hung"
    return out["table"]


def test_a_fifo_health_csv_is_one_line_and_never_blocks(qtbot, tmp_path):
    run = prepare_recorded_run(RECORDED_RUN, tmp_path / "runs")
    os.mkfifo(run / "health.csv")  # no writer: a plain open() or read_bytes() would wait forever
    table = _read_in_thread(run)
    assert table.rows == () and table.problem == "health.csv is not a regular file: not read"
    listing = scan_grid(run)  # the Samples panel's worker: the grid still shows, with the one line
    assert [c.name for c in listing.index.columns] == ["teacher", "iter_60", "iter_120"]
    assert listing.health == () and listing.health_note == table.problem
    panel = _panel(qtbot, tmp_path)
    _open(qtbot, panel, run)
    assert "health: health.csv is not a regular file" in panel.header.text()


@pytest.mark.parametrize("text, rows, problem", [
    ("iter,checkpoint,diversity\n60,iter_60,1e999\n120,iter_120,0.5\n", [(60, ()), (120, (("diversity", 0.5),))],
     "no column saturation, brightness, contrast, colourfulness, detail, teacher_distance"),
    ("iter,diversity,alerts\n-5,0.5,\n1.5,0.5,\n,0.5,\n7,nan,diversity\n", [(7, ())], "3 row(s) without a valid iter"),
    ("checkpoint,diversity\niter_60,0.5\n", [], "health.csv has no iter column: not read"),
    ("\x00\xff\xfe garbage \x00\n", [], "health.csv has no iter column: not read"),
    ("", [], ""),
])
def test_hostile_health_csv_rows(tmp_path, text, rows, problem):
    (tmp_path / "health.csv").write_bytes(text.encode("utf-8", errors="surrogateescape"))
    table = _read_in_thread(tmp_path)
    assert [(r.iter, r.values) for r in table.rows] == rows
    assert problem in table.problem and (problem == "") == (table.problem == "")


def test_an_alert_is_new_once_until_a_row_without_it():
    tracker = AlertTracker()
    div, sat = alert("diversity", 0.4, 1), alert("saturation", 1.6, 1)
    assert tracker.new_alerts(100, [div]) == [div]
    assert tracker.new_alerts(200, [div]) == []
    assert tracker.new_alerts(200, [div, sat]) == []  # the same row again (history and events)
    assert tracker.new_alerts(300, [div, sat]) == [sat]
    assert tracker.new_alerts(400, []) == []
    assert tracker.new_alerts(500, [div]) == [div]


def test_health_seed_images_are_not_rows_of_the_grid(run):
    """<id>~s<k>.png are a validation's extra seeds for the health signals: the grid still shows one
    row per prompt (its seed-0 image)."""
    import shutil

    from app.models.sample_index import scan_samples

    rows = scan_samples(run).rows
    for folder in ("teacher", "iter_60", "iter_120"):
        for pid in rows:
            for k in (1, 2, 3):
                shutil.copy(run / "samples" / folder / f"{pid}.png", run / "samples" / folder / f"{pid}~s{k}.png")
    assert scan_samples(run).rows == rows and len(rows) > 1
