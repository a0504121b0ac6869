"""The Samples panel on the recorded demo run (tests/app/fixtures/demo_run: teacher, iter_60,
iter_120, 10 prompts each): the grid, keyboard navigation, provenance from meta.json, the
thumbnail cache, A/B from the grid and Render again (with a stand-in for `dmad sample`). No torch.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QImage

from app.models.sample_index import checkpoint_of, checkpoint_order, is_checkpoint_folder, scan_samples
from app.widgets.samples_grid import STATE_ROLE
from app.panels.samples import SamplesPanel
from app.screenshots import RECORDED_RUN, prepare_recorded_run
from app.models.thumbs import ThumbCache

COLUMNS = ["teacher", "iter_60", "iter_120"]


@pytest.fixture
def recorded_run(tmp_path) -> Path:
    return prepare_recorded_run(RECORDED_RUN, tmp_path / "runs")


def _panel(qtbot, tmp_path, **kw) -> SamplesPanel:
    panel = SamplesPanel(cache=ThumbCache(tmp_path / "thumbs"), prompt_set_dir=tmp_path / "prompt_sets", **kw)
    qtbot.addWidget(panel)
    panel.show()
    return panel


def _open(qtbot, panel: SamplesPanel, run: Path) -> None:
    with qtbot.waitSignal(panel.grid_filled, timeout=20_000):
        panel.set_run(run)
    qtbot.waitUntil(lambda: not panel.busy(), timeout=10_000)


def _png(path: Path, colour: str, px: int = 8) -> None:
    img = QImage(px, px, QImage.Format_RGB32)
    img.fill(QColor(colour))
    path.parent.mkdir(parents=True, exist_ok=True)
    assert img.save(str(path))


def test_the_grid_shows_every_prompt_x_checkpoint_teacher_first(qtbot, tmp_path, recorded_run):
    panel = _panel(qtbot, tmp_path)
    _open(qtbot, panel, recorded_run)
    m = panel.model
    ids = [it["id"] for it in json.loads((recorded_run / "prompt_set.json").read_text())["items"]]
    assert [m.headerData(c, Qt.Horizontal) for c in range(m.columnCount())] == COLUMNS
    assert [m.headerData(r, Qt.Vertical) for r in range(m.rowCount())] == ids  # prompt-set order
    assert all(m.data(m.index(r, c), STATE_ROLE) == "ok" for r in range(10) for c in range(3))
    assert m.data(m.index(0, 0), Qt.DecorationRole).width() == 64  # the 64 px render, not enlarged
    assert "10 prompts x 3 checkpoints (30 images)" in panel.header.text()


def _live(run: Path) -> None:
    """status.json of a running engine (this process stands in for it): folders without meta.json
    are being rendered, not left behind by a render that stopped."""
    (run / "status.json").write_text(json.dumps({"state": "running", "pid": os.getpid(), "host": socket.gethostname(),
                                                 "heartbeat": time.time()}))


def test_new_checkpoints_and_missing_images_fill_in_live(qtbot, tmp_path):
    run = tmp_path / "run"
    (run).mkdir()
    _live(run)
    (run / "prompt_set.json").write_text(json.dumps({"items": [{"id": "b"}, {"id": "a"}]}))
    _png(run / "samples" / "teacher" / "a.png", "red")
    _png(run / "samples" / "teacher" / "b.png", "red")
    _png(run / "samples" / "iter_10" / "a.png", "blue")
    panel = _panel(qtbot, tmp_path)
    _open(qtbot, panel, run)
    m = panel.model
    assert (m.rowCount(), m.columnCount()) == (2, 2)
    assert m.data(m.index(0, 1), STATE_ROLE) == "rendering"  # iter_10 has no b yet: the run renders it
    _png(run / "samples" / "iter_2" / "a.png", "green")
    _png(run / "samples" / "iter_2" / "c.png", "green")  # an id the prompt set does not list: last row
    with qtbot.waitSignal(panel.grid_filled, timeout=20_000):
        panel.refresh()
    assert [m.headerData(c, Qt.Horizontal) for c in range(3)] == ["teacher", "iter_2", "iter_10"]  # numeric
    assert [m.headerData(r, Qt.Vertical) for r in range(3)] == ["b", "a", "c"]
    # The usual live case, a later checkpoint: its column is appended without a model reset, so the
    # current cell (and the scroll position) stay where the user left them
    panel.grid.set_current_cell(2, 1)
    resets = []
    m.modelAboutToBeReset.connect(lambda: resets.append(1))
    for name in ("a", "b", "c"):
        _png(run / "samples" / "iter_30" / f"{name}.png", "white")
    with qtbot.waitSignal(m.columnsInserted, timeout=20_000):
        panel.refresh()
    qtbot.waitUntil(m.filled, timeout=20_000)
    assert resets == [] and m.headerData(3, Qt.Horizontal) == "iter_30" and panel.grid.current_cell() == (2, 1)


def test_arrow_keys_move_up_down_along_prompts_and_left_right_along_checkpoints(qtbot, tmp_path, recorded_run):
    panel = _panel(qtbot, tmp_path)
    _open(qtbot, panel, recorded_run)
    grid = panel.grid
    grid.setFocus()
    grid.set_current_cell(0, 0)
    moves = [(Qt.Key_Down, (1, 0)), (Qt.Key_Down, (2, 0)), (Qt.Key_Right, (2, 1)), (Qt.Key_Right, (2, 2)),
             (Qt.Key_Up, (1, 2)), (Qt.Key_Left, (1, 1))]
    for key, cell in moves:
        qtbot.keyClick(grid, key)
        assert grid.current_cell() == cell
    assert panel.model.key(1, 1) == ("shape-triangle", "iter_60")
    assert "prompt id: shape-triangle" in panel.provenance_text()


def test_provenance_comes_from_the_folders_meta_json(qtbot, tmp_path, recorded_run):
    panel = _panel(qtbot, tmp_path)
    _open(qtbot, panel, recorded_run)
    meta = json.loads((recorded_run / "samples" / "iter_60" / "meta.json").read_text())
    panel.grid.set_current_cell(3, 1)  # colour-purple at iter_60
    text = panel.provenance_text()
    item = meta["items"]["colour-purple"]
    assert f"prompt: {item['prompt']}" in text and f"seed: {item['seed']}" in text
    assert "checkpoint: iter_60 (student)" in text and "prompt set: demo v1" in text
    assert "student timesteps [999, 749, 499, 249] (4 steps)" in text and "resolution: 64x64 px" in text
    assert panel.model.data(panel.model.index(3, 1), Qt.ToolTipRole) == text  # the tooltip says the same
    panel.grid.set_current_cell(3, 0)
    assert "sampling: ddim, 50 steps, CFG 3.0" in panel.provenance_text()


def test_missing_or_corrupt_meta_json_is_a_note_not_a_crash(qtbot, tmp_path, recorded_run):
    (recorded_run / "samples" / "iter_60" / "meta.json").write_text("{ torn", encoding="utf-8")
    (recorded_run / "samples" / "teacher" / "meta.json").unlink()
    panel = _panel(qtbot, tmp_path)
    _open(qtbot, panel, recorded_run)
    panel.grid.set_current_cell(0, 1)
    text = panel.provenance_text()
    assert "meta.json: samples/iter_60: meta.json is not valid JSON (line 1, column 3" in text and "provenance unknown" in text
    assert "(from the run's prompt_set.json)" in text
    panel.grid.set_current_cell(0, 0)
    assert "samples/teacher: no meta.json (a render that stopped" in panel.provenance_text()
    assert "provenance unknown" in panel.provenance_text()
    assert panel.model.data(panel.model.index(0, 0), STATE_ROLE) == "ok"  # the images still show


def test_thumbnails_are_cached_on_disk_and_reopening_decodes_nothing(qtbot, tmp_path, recorded_run):
    first = _panel(qtbot, tmp_path)
    _open(qtbot, first, recorded_run)
    assert (first.thumbs.cache.decodes, first.thumbs.cache.hits) == (30, 0)
    assert len(list((tmp_path / "thumbs").rglob("*.rgb"))) == 30
    assert not list((tmp_path / "thumbs").rglob("*.tmp*"))  # written temp-then-rename
    second = _panel(qtbot, tmp_path)  # a new panel and cache object: only the files are shared
    _open(qtbot, second, recorded_run)
    assert (second.thumbs.cache.decodes, second.thumbs.cache.hits) == (0, 30)
    # A re-rendered image (new bytes, new mtime) gets a new thumbnail; the others stay cached
    target = recorded_run / "samples" / "iter_120" / "shape-circle.png"
    _png(target, "white", 64)
    os.utime(target, ns=(target.stat().st_atime_ns, target.stat().st_mtime_ns + 10**9))
    with qtbot.waitSignal(second.grid_filled, timeout=20_000):
        second.refresh()
    assert (second.thumbs.cache.decodes, second.thumbs.cache.hits) == (1, 30)
    r, c = second.model.cell_of("shape-circle", "iter_120")
    assert second.model.data(second.model.index(r, c), Qt.DecorationRole).toImage().pixelColor(5, 5) == QColor("white")


def test_compare_two_marked_images_and_the_same_image(qtbot, tmp_path, recorded_run):
    panel = _panel(qtbot, tmp_path)
    _open(qtbot, panel, recorded_run)
    assert not panel.compare()  # nothing chosen yet
    panel.grid.set_current_cell(0, 0)
    qtbot.keyClick(panel.grid, Qt.Key_A)
    panel.grid.set_current_cell(0, 2)
    qtbot.keyClick(panel.grid, Qt.Key_B)
    a, b = panel.model.mark("A"), panel.model.mark("B")
    assert (a.run_dir, a.prompt_id, a.checkpoint) == (recorded_run, "shape-circle", "teacher")
    assert (b.prompt_id, b.checkpoint, b.path.name) == ("shape-circle", "iter_120", "shape-circle.png")
    with qtbot.waitSignal(panel.ab.compared, timeout=10_000) as sig:
        assert panel.compare()
    diff = sig.args[0]
    assert diff.max > 0 and diff.mean > 0
    assert "teacher / shape-circle" in panel.ab.title.text()
    panel.mark("A")  # A and B on the same image
    with qtbot.waitSignal(panel.ab.compared, timeout=10_000) as sig:
        panel.compare()
    assert (sig.args[0].max, sig.args[0].mean) == (0, 0.0)
    assert "identical pixels" in panel.ab.stats.text()


def test_ctrl_click_two_cells_compares_them(qtbot, tmp_path, recorded_run):
    panel = _panel(qtbot, tmp_path)
    _open(qtbot, panel, recorded_run)
    grid, m = panel.grid, panel.model
    for cell, mod in (((1, 0), Qt.NoModifier), ((4, 1), Qt.ControlModifier)):
        rect = grid.visualRect(m.index(*cell))
        if not rect.isValid() or not grid.viewport().rect().contains(rect.center()):
            grid.scrollTo(m.index(*cell))
            rect = grid.visualRect(m.index(*cell))
        qtbot.mouseClick(grid.viewport(), Qt.LeftButton, mod, rect.center())
    assert grid.selected_cells() == [(1, 0), (4, 1)]
    with qtbot.waitSignal(panel.ab.compared, timeout=10_000):
        assert panel.compare()
    assert panel.ab.labels() == ("A: teacher / shape-triangle", "B: iter_60 / position-bottom-left")


def test_render_again_runs_dmad_sample_and_shows_the_new_column(qtbot, tmp_path, recorded_run):
    # A stand-in for `dmad sample`: records its arguments, "renders" iter_60 again into the next free
    # folder iter_60-r2 (byte-identical, as on a CPU) and prints the samples event, as the engine does.
    log = tmp_path / "argv.json"
    script = tmp_path / "fake_dmad.py"
    script.write_text(
        "import json, shutil, sys, time\n"
        f"open({str(log)!r}, 'w').write(json.dumps(sys.argv[1:]))\n"
        "run = sys.argv[sys.argv.index('--run') + 1]\n"
        "dest = run + '/samples/iter_60-r2'\n"
        "shutil.copytree(run + '/samples/iter_60', dest)\n"
        "print(json.dumps({'v': 1, 't': time.time(), 'kind': 'samples', 'iter': 60, "
        "'data': {'folder': dest, 'paths': []}}), flush=True)\n")
    panel = _panel(qtbot, tmp_path, render_command=[sys.executable, str(script)])
    _open(qtbot, panel, recorded_run)
    panel.grid.set_current_cell(2, 1)
    assert panel.buttons["render"].isEnabled() and "--checkpoint 60" in panel.buttons["render"].toolTip()
    with qtbot.waitSignal(panel.render_finished, timeout=30_000) as sig:
        panel.buttons["render"].click()
    assert sig.args == [0, "done"]
    assert json.loads(log.read_text()) == ["sample", "--run", str(recorded_run), "--checkpoint", "60"]
    m = panel.model
    qtbot.waitUntil(lambda: m.columnCount() == 4 and m.filled(), timeout=20_000)
    assert [m.headerData(c, Qt.Horizontal) for c in range(4)] == ["teacher", "iter_60", "iter_60-r2", "iter_120"]
    assert panel.grid.current_cell() == (2, 2)  # the re-render of the same prompt
    assert "checkpoint: iter_60-r2 (student)" in panel.provenance_text()
    panel.mark("B")
    panel.grid.set_current_cell(2, 1)
    panel.mark("A")
    with qtbot.waitSignal(panel.ab.compared, timeout=10_000) as sig:
        panel.compare()
    assert sig.args[0].max == 0  # rendered again: the same pixels
    panel.grid.set_current_cell(2, 2)
    assert "--checkpoint 60" in panel.buttons["render"].toolTip()  # a re-render renders its checkpoint


def test_folder_order_and_checkpoint_of():
    names = ["iter_120", "iter_60-r2", "teacher-r2", "iter_60", "teacher", "iter_60-r10", "iter_7"]
    assert sorted(names, key=checkpoint_order) == ["teacher", "teacher-r2", "iter_7", "iter_60", "iter_60-r2",
                                                   "iter_60-r10", "iter_120"]
    assert [checkpoint_of(n) for n in ("teacher", "teacher-r3", "iter_7", "iter_60-r2")] == ["teacher", "teacher",
                                                                                            "7", "60"]
    assert not is_checkpoint_folder("grid") and not is_checkpoint_folder("iter_x")
    with pytest.raises(ValueError):
        checkpoint_of("sweep")


def test_render_again_failure_shows_the_engines_line(qtbot, tmp_path, recorded_run):
    script = tmp_path / "fake_dmad.py"
    script.write_text("import sys\nprint('dmad: error: checkpoint iter_60 not found', file=sys.stderr)\nsys.exit(2)\n")
    panel = _panel(qtbot, tmp_path, render_command=[sys.executable, str(script)])
    _open(qtbot, panel, recorded_run)
    panel.grid.set_current_cell(0, 1)
    with qtbot.waitSignal(panel.render_finished, timeout=30_000) as sig:
        panel.render_again()
    assert sig.args == [2, "dmad: error: checkpoint iter_60 not found"]
    assert panel.render_status.text().endswith("checkpoint iter_60 not found")
    assert panel.buttons["render"].isEnabled()


def test_a_run_without_samples_says_so(qtbot, tmp_path):
    panel = _panel(qtbot, tmp_path)
    panel.set_run(tmp_path)
    qtbot.waitUntil(lambda: "no samples yet" in panel.header.text(), timeout=10_000)
    assert scan_samples(tmp_path).columns == ()
    panel.set_run(None)
    assert panel.header.text() == "No run open." and panel.model.rowCount() == 0
