"""The Data panel: `dmad check-data` run from the app, its progress, cancel and errors, the problems
table and its filters, thumbnails, the usable-vs-batch note and the warning before Start.

The command is a stand-in written by each test (a small Python script that speaks the check-data
command line: `progress <done> <total>` on stderr, the report at --json, exit 0/1/2), so these tests
need neither the engine's checks nor torch. Reports follow docs/check-data.md (report_version 1).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings, Qt, QThreadPool
from PySide6.QtGui import QColor, QImage
from PySide6.QtWidgets import QMessageBox

from app.panels import data as data_panel_module
from app import window as window_module
from app.panels.data import DataPanel, data_dir_of
from app.models.data_report import COLUMNS, PATH_COLUMN, load_report
from app.models.thumbs import ThumbCache
from app.window import MainWindow

CATEGORIES = {  # the engine's ids and severities (docs/check-data.md)
    "image_without_caption": "error", "caption_without_image": "warning", "empty_caption": "error",
    "caption_not_utf8": "error", "caption_multiline": "warning", "image_corrupt": "error",
    "image_too_small": "error", "image_near_constant": "warning", "duplicate_exact": "warning",
    "duplicate_near": "warning", "stem_two_images": "error", "unusual_mode": "warning",
    "pixel_limit_exceeded": "error", "file_unreadable": "error", "broken_symlink": "error",
    "symlink_loop": "error",
}


def make_report(folder: Path, usable: int = 5, images: int = 20, per_category: dict | None = None) -> dict:
    per_category = per_category if per_category is not None else {c: 1 for c in CATEGORIES}
    problems = [{"category": c, "severity": CATEGORIES[c], "path": str(folder / f"{c}-{i}.png"),
                 "dataset": "main", "detail": f"{c} number {i}", "related": []}
                for c, n in per_category.items() for i in range(n)]
    errors = sum(1 for p in problems if p["severity"] == "error")
    return {"report_version": 1, "source": str(folder), "created": "2026-11-30T12:00:00Z", "min_size": 64,
            "resolution": 64, "batch": 8, "max_pixels": 178956970,
            "datasets": [{"id": "main", "root": str(folder), "images": images, "usable": usable, "captions": 18}],
            "problems": problems, "counts": {c: per_category.get(c, 0) for c in CATEGORIES},
            "summary": {"images": images, "usable": usable, "errors": errors, "warnings": len(problems) - errors,
                        "caption_words": None,
                        "buckets": [{"width": 64, "height": 64, "images": 12, "usable": 4, "full_batches": 0},
                                    {"width": 64, "height": 128, "images": 8, "usable": 1, "full_batches": 0}]},
            "clean": not problems}


STAND_IN = '''
import json, os, pathlib, sys, time
args = sys.argv[1:]
here = pathlib.Path(__file__).parent
(here / "argv.json").write_text(json.dumps({"args": args, "pid": os.getpid()}))
mode = (here / "mode").read_text().strip()
if mode == "usage":
    print("dmad: error: not a folder or a dataset list: " + args[1], file=sys.stderr, flush=True)
    sys.exit(2)
report = pathlib.Path(args[args.index("--json") + 1])
if mode == "hang":  # the half report before the progress line the test waits for (a race under load)
    report.with_name(report.name + ".tmp").write_text("{half a rep")
print("progress 3 10", file=sys.stderr, flush=True)
if mode == "hang":
    while True:
        time.sleep(0.05)
while mode == "wait" and not (here / "go").exists():
    time.sleep(0.02)
print("progress 10 10", file=sys.stderr, flush=True)
report.write_text((here / "report.json").read_text())
sys.exit(1)
'''


class StandIn:
    def __init__(self, folder: Path, mode: str = "run", report: dict | None = None):
        self.dir = folder
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "standin.py").write_text(STAND_IN, encoding="utf-8")
        self.set(mode, report)

    def set(self, mode: str, report: dict | None = None) -> None:
        (self.dir / "mode").write_text(mode)
        if report is not None:
            (self.dir / "report.json").write_text(json.dumps(report))

    @property
    def command(self) -> list[str]:
        return [sys.executable, str(self.dir / "standin.py")]

    def argv(self) -> dict:
        return json.loads((self.dir / "argv.json").read_text())


@pytest.fixture(autouse=True)
def _workers_done(qtbot):
    """The pool's jobs (the panel's and its image browser's thumbnails, the browser's listing) end
    before the test's widgets are deleted: a worker answering an object being deleted is a race."""
    yield
    QThreadPool.globalInstance().waitForDone(30_000)


@pytest.fixture
def data(tmp_path) -> Path:
    folder = tmp_path / "cfg" / "data"
    folder.mkdir(parents=True)
    return folder


def panel_for(qtbot, tmp_path, stand_in: StandIn, data: Path, batch=(4, 2)) -> DataPanel:
    panel = DataPanel(command=stand_in.command, cache=ThumbCache(tmp_path / "thumbs", px=48))
    qtbot.addWidget(panel)
    panel.set_config({"identity": {"train_data_dir": "data"},
                      "resources": {"resolution": 64, "train_batch_size": batch[0],
                                    "gradient_accumulation_steps": batch[1]}}, data.parent)
    return panel


def run_check(qtbot, panel: DataPanel) -> list:
    with qtbot.waitSignal(panel.check_finished, timeout=60_000) as blocker:
        panel.check()
    return blocker.args


def shown_categories(panel: DataPanel) -> list[str]:
    return [panel.proxy.index(r, 0).data() for r in range(panel.proxy.rowCount())]


def test_every_category_is_in_the_table_and_the_filter_shows_only_one(qtbot, tmp_path, data):
    stand_in = StandIn(tmp_path / "standin", report=make_report(data))
    panel = panel_for(qtbot, tmp_path, stand_in, data)
    assert run_check(qtbot, panel) == [1, panel.status.text()]
    assert [panel.model.headerData(i, Qt.Horizontal) for i in range(4)] == list(COLUMNS)
    assert sorted(shown_categories(panel)) == sorted(CATEGORIES)
    n_errors = list(CATEGORIES.values()).count("error")
    assert [panel.proxy.index(r, 1).data() for r in range(16)] == ["error"] * n_errors + ["warning"] * (16 - n_errors)
    assert panel.category.count() == len(CATEGORIES) + 1  # "all categories" first
    for i in range(1, panel.category.count()):
        panel.category.setCurrentIndex(i)
        name = panel.category.currentData()
        assert panel.category.currentText() == f"{name} (1)"
        assert shown_categories(panel) == [name]
    panel.category.setCurrentIndex(0)
    panel.severity.setCurrentIndex(panel.severity.findData("error"))
    severities = {panel.proxy.index(r, 1).data() for r in range(panel.proxy.rowCount())}
    assert severities == {"error"} and panel.proxy.rowCount() == list(CATEGORIES.values()).count("error")
    errors = panel.report().errors
    assert panel.status.text() == f"{errors} errors and {16 - errors} warnings in 20 images (5 usable)."
    assert "main" in panel.datasets.text() and "20 images, 5 usable, 18 captions" in panel.datasets.text()
    assert panel.buckets.labels() == ["64x64", "64x128"]
    assert list(panel.buckets.images_bars.opts["height"]) == [12, 8]
    assert list(panel.buckets.usable_bars.opts["height"]) == [4, 1]


def test_the_command_carries_the_config_resolution_and_effective_batch(qtbot, tmp_path, data):
    stand_in = StandIn(tmp_path / "standin", report=make_report(data))
    panel = panel_for(qtbot, tmp_path, stand_in, data, batch=(3, 2))
    panel.min_size.setValue(96)
    run_check(qtbot, panel)
    args = stand_in.argv()["args"]
    assert args[:2] == ["check-data", str(data)] and "--progress" in args
    assert args[args.index("--resolution") + 1] == "64" and args[args.index("--batch") + 1] == "6"
    assert args[args.index("--min-size") + 1] == "96"
    assert not Path(args[args.index("--json") + 1]).parent.exists()  # the report folder is removed once read


def test_the_progress_bar_follows_the_progress_lines(qtbot, tmp_path, data):
    stand_in = StandIn(tmp_path / "standin", "wait", make_report(data))
    panel = panel_for(qtbot, tmp_path, stand_in, data)
    panel.check()
    assert panel.is_checking() and not panel.buttons["check"].isEnabled() and panel.buttons["cancel"].isEnabled()
    qtbot.waitUntil(lambda: (panel.progress.value(), panel.progress.maximum()) == (3, 10), timeout=60_000)
    with qtbot.waitSignal(panel.check_finished, timeout=60_000):
        (stand_in.dir / "go").write_text("")
    assert (panel.progress.value(), panel.progress.maximum()) == (1, 1)  # done: the bar is full
    assert not panel.is_checking() and panel.buttons["check"].isEnabled()


def test_cancel_kills_the_check_and_leaves_no_report(qtbot, tmp_path, data):
    stand_in = StandIn(tmp_path / "standin", "hang", make_report(data))
    panel = panel_for(qtbot, tmp_path, stand_in, data)
    panel.check()
    qtbot.waitUntil(lambda: panel.progress.value() == 3, timeout=60_000)
    report_dir = Path(stand_in.argv()["args"][stand_in.argv()["args"].index("--json") + 1]).parent
    assert any(report_dir.iterdir())  # the half-written report the command left
    with qtbot.waitSignal(panel.check_finished, timeout=60_000) as blocker:
        panel.cancel()
    assert blocker.args == [-1, "Check cancelled."] and "cancelled" in panel.status.text()
    with pytest.raises(ProcessLookupError):
        os.kill(stand_in.argv()["pid"], 0)
    assert not report_dir.exists() and panel.report() is None and panel.model.rowCount() == 0


def test_a_usage_error_shows_the_engines_line(qtbot, tmp_path, data):
    stand_in = StandIn(tmp_path / "standin", "usage")
    panel = panel_for(qtbot, tmp_path, stand_in, data)
    code, line = run_check(qtbot, panel)
    assert code == 2 and line == f"dmad: error: not a folder or a dataset list: {data}"
    assert panel.status.text() == line and "c0392b" in panel.status.styleSheet()


def test_a_report_that_cannot_be_read_is_one_red_line(qtbot, tmp_path, data):
    stand_in = StandIn(tmp_path / "standin")
    (stand_in.dir / "report.json").write_text("{not json")
    panel = panel_for(qtbot, tmp_path, stand_in, data)
    code, line = run_check(qtbot, panel)
    assert code == 1 and line.startswith("cannot read the data check report") and "\n" not in line
    assert panel.status.text() == line and "c0392b" in panel.status.styleSheet() and panel.report() is None


def test_a_command_that_cannot_start_says_so(qtbot, tmp_path, data):
    panel = DataPanel(command=[str(tmp_path / "no-such-program")])
    qtbot.addWidget(panel)
    panel.set_config({"identity": {"train_data_dir": str(data)}}, None)
    code, line = run_check(qtbot, panel)
    assert code == -1 and line.startswith("could not start dmad check-data")


def test_fewer_usable_images_than_the_batch_shows_the_red_note(qtbot, tmp_path, data):
    stand_in = StandIn(tmp_path / "standin", report=make_report(data, usable=5))
    panel = panel_for(qtbot, tmp_path, stand_in, data, batch=(4, 2))
    run_check(qtbot, panel)
    assert "Usable images 5 (of 20) against the effective batch 8" in panel.summary.text()
    assert not panel.batch_note.isHidden() and "(5)" in panel.batch_note.text() and "(8)" in panel.batch_note.text()
    assert "c0392b" in panel.batch_note.styleSheet()
    panel.set_config({"identity": {"train_data_dir": "data"}, "resources": {"train_batch_size": 5}}, data.parent)
    assert panel.batch_note.isHidden() and "effective batch 5" in panel.summary.text()


def _png(path: Path, colour: str, px: int = 8) -> None:
    img = QImage(px, px, QImage.Format_RGB32)
    img.fill(QColor(colour))
    assert img.save(str(path))


def test_thumbnails_of_visible_rows_and_a_placeholder_for_broken_images(qtbot, tmp_path, data):
    report = make_report(data, per_category={"duplicate_exact": 1, "unusual_mode": 1, "image_corrupt": 1,
                                             "caption_without_image": 1})
    report["problems"][3]["path"] = str(data / "lonely.txt")
    _png(data / "duplicate_exact-0.png", "red")
    (data / "unusual_mode-0.png").write_bytes(b"\x89PNG not really")  # fails to decode in the worker
    stand_in = StandIn(tmp_path / "standin", report=report)
    panel = panel_for(qtbot, tmp_path, stand_in, data)
    panel.resize(1000, 700)
    panel.show()
    run_check(qtbot, panel)
    icon = lambda row: panel.model.data(panel.model.index(row, PATH_COLUMN), Qt.DecorationRole)  # noqa: E731
    assert icon(2) is not None  # image_corrupt: the placeholder at once, never decoded
    qtbot.waitUntil(lambda: icon(0) is not None and icon(1) is not None, timeout=60_000)
    assert icon(0).pixmap(48, 48).toImage().pixelColor(2, 2) == QColor("red")
    assert icon(1).cacheKey() != icon(0).cacheKey() and icon(3) is None  # a caption has no thumbnail
    assert panel.thumbs.cache.decodes == 2


def test_only_the_rows_on_screen_are_decoded(qtbot, tmp_path, data):
    report = make_report(data, per_category={"duplicate_exact": 100})
    for i in range(100):
        _png(data / f"duplicate_exact-{i}.png", "blue")
    stand_in = StandIn(tmp_path / "standin", report=report)
    panel = panel_for(qtbot, tmp_path, stand_in, data)
    panel.resize(900, 500)
    panel.show()
    run_check(qtbot, panel)
    icon = lambda row: panel.model.data(panel.model.index(row, PATH_COLUMN), Qt.DecorationRole)  # noqa: E731
    qtbot.waitUntil(lambda: icon(0) is not None and not panel.thumbs.busy(), timeout=60_000)
    assert 0 < panel.thumbs.cache.decodes < 50 and icon(99) is None
    panel.table.scrollToBottom()
    qtbot.waitUntil(lambda: icon(99) is not None, timeout=60_000)


def test_show_in_folder_opens_the_parent_folder(qtbot, tmp_path, data, monkeypatch):
    stand_in = StandIn(tmp_path / "standin", report=make_report(data))
    panel = panel_for(qtbot, tmp_path, stand_in, data)
    opened = []
    monkeypatch.setattr(data_panel_module.QDesktopServices, "openUrl", lambda url: opened.append(url) or True)
    run_check(qtbot, panel)
    assert not panel.show_in_folder()  # nothing selected
    panel.table.setCurrentIndex(panel.proxy.index(0, 0))
    assert panel.buttons["reveal"].isEnabled() and panel.show_in_folder()
    assert [Path(u.toLocalFile()) for u in opened] == [data]


def test_a_report_that_is_not_one_is_refused_in_one_line(tmp_path):
    bad = tmp_path / "r.json"
    bad.write_text('{"report_version": 2}')
    with pytest.raises(ValueError, match="not a check-data report of version 1"):
        load_report(bad)
    bad.write_text('{"report_version": 1, "summary": {}}')
    with pytest.raises(ValueError, match="malformed check-data report"):
        load_report(bad)


def test_the_source_follows_the_config_until_the_user_picks_another(qtbot, tmp_path):
    assert data_dir_of({"identity": {"train_data_dir": "d"}}, tmp_path) == (tmp_path / "d").resolve()
    assert data_dir_of({"identity": {}}, tmp_path) is None
    panel = DataPanel(command=["unused"])
    qtbot.addWidget(panel)
    panel.set_config({"identity": {"train_data_dir": "a"}}, tmp_path)
    assert panel.source() == tmp_path / "a" and panel.effective_batch() == 1
    panel.set_config({"identity": {"train_data_dir": "b"}}, tmp_path)
    assert panel.source() == tmp_path / "b"
    panel.source_edit.setText(str(tmp_path / "mine.json"))
    panel.set_config({"identity": {"train_data_dir": "c"}}, tmp_path)
    assert panel.source() == tmp_path / "mine.json"
    panel.source_edit.setText("")
    assert not panel.buttons["check"].isEnabled()


def real_panel(qtbot, tmp_path) -> tuple[DataPanel, dict]:
    """A panel on the engine's own command line, set to the generated corpus (every category)."""
    from tests.engine.corpus import build_corpus

    expected = build_corpus(tmp_path / "data")
    panel = DataPanel(cache=ThumbCache(tmp_path / "thumbs", px=48))
    qtbot.addWidget(panel)
    panel.set_config({"identity": {"train_data_dir": "data"}, "resources": {"resolution": 64}}, tmp_path)
    panel.min_size.setValue(64)
    return panel, expected


def test_the_real_check_data_fills_the_table_with_every_category(qtbot, tmp_path):
    panel, expected = real_panel(qtbot, tmp_path)
    panel.resize(1000, 2000)
    panel.show()
    code, line = run_check(qtbot, panel)
    assert code == 1, line
    assert set(shown_categories(panel)) == set(expected.values())
    rows = {Path(panel.model.problem(r).path).name: r for r in range(panel.model.rowCount())}
    assert panel.model.data(panel.model.index(rows["bomb.png"], PATH_COLUMN), Qt.DecorationRole) is not None
    solid = panel.model.index(rows["solid.png"], PATH_COLUMN)  # decoded in a worker once on screen
    qtbot.waitUntil(lambda: panel.model.data(solid, Qt.DecorationRole) is not None, timeout=60_000)


def test_the_fast_check_says_which_checks_it_skipped(qtbot, tmp_path):
    panel, expected = real_panel(qtbot, tmp_path)
    panel.fast.setChecked(True)
    assert panel.check_command(tmp_path / "r.json")[-1] == "--fast"
    code, line = run_check(qtbot, panel)
    assert code == 1, line
    assert panel.report().skipped_checks == ("image_near_constant", "duplicate_near")
    assert "Fast check: image_near_constant, duplicate_near not checked." in panel.status.text()
    shown = set(shown_categories(panel))
    assert "image_near_constant" not in shown and "duplicate_near" not in shown
    assert shown <= set(expected.values()) and "image_corrupt" in shown


# ---------------------------------------------------------------- the warning before Start

@pytest.fixture
def stand_in_window(qtbot, tmp_path, data, monkeypatch):
    """The window as the app builds it, with its Data panel running a stand-in for check-data."""
    stand_in = StandIn(tmp_path / "standin", report=make_report(data, usable=5))
    monkeypatch.setattr(window_module, "DataPanel",
                        lambda: DataPanel(command=stand_in.command, cache=ThumbCache(tmp_path / "thumbs", px=48)))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.IniFormat)
    w = MainWindow(settings, runs_root=tmp_path / "runs", load_nvml=lambda: (_ for _ in ()).throw(ImportError()),
                   unsaved_dir=tmp_path / "unsaved")
    qtbot.addWidget(w)
    yield w
    w.training._clear()


def test_start_asks_when_the_last_check_of_the_configs_data_found_errors(stand_in_window, qtbot, tmp_path, data,
                                                                         monkeypatch):
    window = stand_in_window
    panel = window.data
    raw = window.config.config()
    raw["identity"]["train_data_dir"] = str(data)
    window.config.set_config(raw, window.config.base_dir())
    started, asked = [], []
    monkeypatch.setattr(window.training, "start", lambda *a: started.append(a))
    answer = [QMessageBox.No]
    monkeypatch.setattr(window_module.QMessageBox, "question", lambda _w, _t, text, *_a: asked.append(text) or answer[0])
    window._start()
    assert asked == [] and len(started) == 1  # never checked: nothing to warn about
    run_check(qtbot, panel)
    errors = panel.report().errors
    window._start()
    assert len(asked) == 1 and asked[0].startswith(f"The data check found {errors} errors in {data}")
    assert "Start anyway?" in asked[0] and len(started) == 1  # "No": nothing started
    answer[0] = QMessageBox.Yes
    window._start()
    assert len(asked) == 2 and len(started) == 2
    raw["identity"]["train_data_dir"] = str(tmp_path / "other")  # the check was of another folder
    window.config.set_config(raw, window.config.base_dir())
    assert panel.start_warning() is None
