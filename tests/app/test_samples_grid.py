"""The Samples panel's layout and columns on copies of the recorded demo run: a long provenance line
wraps and the splitter moves, thumbnail size, re-render columns beside their checkpoint, a render
that stopped half way, "rendering…" until meta.json lands, a checkpoint without samples, Export,
and A/B across two runs in a window placed beside the main window. No torch: stand-ins play `dmad`.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication

from app.models.thumbs import ThumbCache
from app.panels.samples import SamplesPanel
from app.screenshots import RECORDED_RUN, prepare_recorded_run
from app.widgets.samples_grid import STATE_ROLE

SHA = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08" * 2  # one unbroken 128-char word


@pytest.fixture
def run(tmp_path) -> Path:
    return prepare_recorded_run(RECORDED_RUN, tmp_path / "runs")


def _panel(qtbot, tmp_path, **kw) -> SamplesPanel:
    panel = SamplesPanel(cache=ThumbCache(tmp_path / "thumbs"), prompt_set_dir=tmp_path / "prompt_sets", **kw)
    qtbot.addWidget(panel)
    panel.resize(1200, 700)
    panel.show()
    return panel


def _open(qtbot, panel: SamplesPanel, run: Path) -> None:
    with qtbot.waitSignal(panel.grid_filled, timeout=20_000):
        panel.set_run(run)
    qtbot.waitUntil(lambda: not panel.busy(), timeout=10_000)


def _headers(panel: SamplesPanel) -> list[str]:
    m = panel.model
    return [m.headerData(c, Qt.Horizontal) for c in range(m.columnCount())]


def _copy_folder(run: Path, src: str, dst: str, keep: int = 99, meta: bool = True) -> Path:
    folder = run / "samples" / dst
    folder.mkdir()
    for png in sorted((run / "samples" / src).glob("*.png"))[:keep]:
        shutil.copy(png, folder / png.name)
    if meta:
        shutil.copy(run / "samples" / src / "meta.json", folder / "meta.json")
    return folder


def _script(tmp_path: Path, name: str, body: str) -> list[str]:
    path = tmp_path / name
    path.write_text("import json, os, shutil, sys, time\n" + body)
    return [sys.executable, str(path)]


def test_a_long_sha256_line_wraps_and_the_splitter_moves(qtbot, tmp_path, run):
    meta_path = run / "samples" / "iter_60" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "weights_sha256": SHA}))
    panel = _panel(qtbot, tmp_path)
    _open(qtbot, panel, run)
    panel.grid.set_current_cell(0, 1)
    assert f"weights sha256: {SHA}" in panel.provenance_text()
    # The side column follows the splitter: dragged narrow, it is narrow, sha256 and preview included
    panel.splitter.setSizes([1000, 180])
    qtbot.waitUntil(lambda: panel.splitter.sizes()[1] <= 200, timeout=5_000)
    side = panel.splitter.widget(1)
    assert side.width() <= 200 and panel.details.width() <= 200
    panel.splitter.setSizes([500, 680])
    qtbot.waitUntil(lambda: panel.splitter.sizes()[1] >= 600, timeout=5_000)
    panel.splitter.setSizes([1000, 180])  # and back: the preview image must not hold it wide
    qtbot.waitUntil(lambda: panel.splitter.sizes()[1] <= 200, timeout=5_000)
    assert panel.minimumSizeHint().width() < 800  # no line of text sets the panel's width
    panel.details.copy_all()
    assert SHA in QGuiApplication.clipboard().text()


def test_a_teacher_with_the_users_loras_is_labelled_so_and_its_images_name_them(qtbot, tmp_path, run):
    loras = [{"path": "/loras/style.safetensors", "scale": 0.8, "sha256": SHA[:64]}]
    for folder in ("teacher", "iter_60"):
        meta_path = run / "samples" / folder / "meta.json"
        meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()), "teacher_loras": loras}))
    panel = _panel(qtbot, tmp_path)
    _open(qtbot, panel, run)
    heads = _headers(panel)
    assert heads[0].splitlines()[0] == "teacher + 1 LoRA" and not any("LoRA" in h for h in heads[1:])
    tips = [panel.model.headerData(c, Qt.Horizontal, Qt.ToolTipRole) for c in range(2)]
    assert "the teacher is base + style.safetensors at 0.8" in tips[0]
    assert "distilled from base + style.safetensors at 0.8" in tips[1]
    for col in (0, 1):
        panel.grid.set_current_cell(0, col)
        assert f"teacher LoRA: /loras/style.safetensors at scale 0.8, sha256 {SHA[:64]}" in panel.provenance_text()


def test_the_size_control_sets_the_thumbnail_cells(qtbot, tmp_path, run):
    panel = _panel(qtbot, tmp_path)
    _open(qtbot, panel, run)
    panel.thumb_size.setValue(200)
    assert panel.grid.columnWidth(1) == 200 and panel.grid.rowHeight(3) == 200
    panel.thumb_size.setValue(64)
    assert panel.grid.columnWidth(2) == 64 and panel.grid.rowHeight(0) == 64
    assert panel.model.data(panel.model.index(0, 0), Qt.DecorationRole) is not None


def test_re_renders_sit_right_after_their_checkpoint(qtbot, tmp_path, run):
    for src, dst in (("teacher", "teacher-r2"), ("iter_60", "iter_60-r2"), ("iter_120", "iter_120-r2"),
                     ("iter_60", "iter_60-r3")):
        _copy_folder(run, src, dst)
    panel = _panel(qtbot, tmp_path)
    _open(qtbot, panel, run)
    assert _headers(panel) == ["teacher", "teacher-r2", "iter_60", "iter_60-r2", "iter_60-r3", "iter_120",
                               "iter_120-r2"]
    tip = panel.model.headerData(3, Qt.Horizontal, Qt.ToolTipRole)
    assert tip == "samples/iter_60-r2: rendered again from checkpoint iter_60"


def test_a_render_that_stopped_shows_what_failed_and_hides_an_empty_column(qtbot, tmp_path, run):
    _copy_folder(run, "iter_60", "iter_60-r2", keep=3, meta=False)  # stopped after 3 of 10 images
    (run / "samples" / "iter_120-r2").mkdir()                      # stopped before the first
    panel = _panel(qtbot, tmp_path)
    _open(qtbot, panel, run)
    m = panel.model
    c = _headers(panel).index("iter_60-r2")
    states = [m.data(m.index(r, c), STATE_ROLE) for r in range(m.rowCount())]
    assert states.count("ok") == 3 and states.count("failed") == 7  # "not rendered" in the cell
    hidden = _headers(panel).index("iter_120-r2")
    assert panel.grid.isColumnHidden(hidden) and not panel.grid.isColumnHidden(c)
    assert "Hidden: iter_120-r2 (a render that stopped before its first image)" in panel.header.text()
    row = next(r for r, s in enumerate(states) if s == "failed")
    panel.grid.set_current_cell(row, c)
    text = panel.provenance_text()
    assert "no meta.json (a render that stopped before it finished" in text and "missing: samples/iter_60-r2" in text


def test_details_say_rendering_until_meta_json_exists(qtbot, tmp_path, run):
    # `dmad sample` writes the images first and meta.json last; this stand-in waits in between
    go, copied = tmp_path / "go", tmp_path / "copied"  # copied: every image is written (a ready marker)
    program = _script(tmp_path, "fake_sample.py", (
        "run = sys.argv[sys.argv.index('--run') + 1]\n"
        "src, dst = run + '/samples/iter_60', run + '/samples/iter_60-r2'\n"
        "os.makedirs(dst)\n"
        "[shutil.copy(os.path.join(src, f), dst) for f in os.listdir(src) if f.endswith('.png')]\n"
        f"open({str(copied)!r}, 'w').close()\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\n"
        "shutil.copy(src + '/meta.json', dst + '/meta.json')\n"
        "print(json.dumps({'v': 1, 't': time.time(), 'kind': 'samples', 'iter': 60, "
        "'data': {'folder': dst, 'paths': []}}), flush=True)\n"))
    panel = _panel(qtbot, tmp_path, render_command=program)
    _open(qtbot, panel, run)
    panel.grid.set_current_cell(2, 1)
    panel.render_again()
    qtbot.waitUntil(copied.exists, timeout=30_000)
    with qtbot.waitSignal(panel.grid_filled, timeout=20_000):
        panel.refresh()
    panel.grid.set_current_cell(2, _headers(panel).index("iter_60-r2"))
    text = panel.provenance_text()
    assert "meta.json: samples/iter_60-r2: rendering…" in text and "provenance unknown" not in text
    with qtbot.waitSignal(panel.render_finished, timeout=30_000):
        go.touch()
    qtbot.waitUntil(lambda: "seed: 2" in panel.provenance_text(), timeout=20_000)
    assert "rendering…" not in panel.provenance_text()


def test_a_checkpoint_without_samples_has_a_column_that_offers_render(qtbot, tmp_path, run):
    for it in (60, 120, 150):  # the stop checkpoint iter_150 was saved, its samples were not
        (run / "checkpoints" / f"iter_{it}").mkdir(parents=True)
    log = tmp_path / "argv.json"
    program = _script(tmp_path, "fake_sample.py", f"open({str(log)!r}, 'w').write(json.dumps(sys.argv[1:]))\n")
    panel = _panel(qtbot, tmp_path, render_command=program)
    _open(qtbot, panel, run)
    m = panel.model
    assert _headers(panel) == ["teacher", "iter_60", "iter_120", "iter_150"]
    assert {m.data(m.index(r, 3), STATE_ROLE) for r in range(m.rowCount())} == {"no-samples"}
    assert not panel.grid.isColumnHidden(3)
    panel.grid.set_current_cell(4, 3)
    assert "no samples at this checkpoint" in panel.provenance_text()
    assert panel.buttons["render"].text() == "Render" and panel.buttons["render"].isEnabled()
    panel.grid.scrollTo(m.index(4, 3))
    rect = panel.grid.visualRect(m.index(4, 3))
    with qtbot.waitSignal(panel.render_finished, timeout=30_000):  # a double click: press, release, double
        qtbot.mouseClick(panel.grid.viewport(), Qt.LeftButton, Qt.NoModifier, rect.center())
        qtbot.mouseDClick(panel.grid.viewport(), Qt.LeftButton, Qt.NoModifier, rect.center())
    assert json.loads(log.read_text()) == ["sample", "--run", str(run), "--checkpoint", "150"]


def test_export_runs_dmad_export_for_the_chosen_checkpoint_and_shows_the_folder(qtbot, tmp_path, run):
    (run / "checkpoints" / "iter_120").mkdir(parents=True)  # iter_60's weights were rotated away
    log = tmp_path / "argv.json"
    program = _script(tmp_path, "fake_export.py", (
        f"open({str(log)!r}, 'w').write(json.dumps(sys.argv[1:]))\n"
        "run = sys.argv[sys.argv.index('--run') + 1]\n"
        "out = os.path.join(run, 'export', 'iter_120-diffusers')\n"
        "os.makedirs(out)\n"
        "print('loading the teacher', file=sys.stderr)\n"
        "print(out, flush=True)\n"))
    shown = []
    panel = _panel(qtbot, tmp_path, render_command=program, reveal=shown.append)
    _open(qtbot, panel, run)
    panel.grid.set_current_cell(0, 0)
    assert not panel.export.isEnabled() and "teacher" in panel.export.toolTip()
    panel.grid.set_current_cell(0, 1)
    assert not panel.export.isEnabled() and "checkpoints/iter_60 is not on disk" in panel.export.toolTip()
    panel.grid.set_current_cell(0, 2)
    assert panel.export.isEnabled()
    assert not panel.export.actions_by_format["lora"].isEnabled()  # the demo's student is a full UNet
    with qtbot.waitSignal(panel.export_finished, timeout=30_000) as sig:
        panel.export.actions_by_format["diffusers"].trigger()
    out = run / "export" / "iter_120-diffusers"
    assert sig.args == [0, str(out)] and shown == [out]
    assert json.loads(log.read_text()) == ["export", "--run", str(run), "--checkpoint", "120", "--format", "diffusers"]
    assert panel.render_status.text() == f"Exported to {out}"


def test_a_and_b_from_two_runs_open_beside_the_window_and_on_screen(qtbot, tmp_path, run):
    other = prepare_recorded_run(RECORDED_RUN, tmp_path / "other")
    other = other.rename(other.with_name("second_run"))
    panel = _panel(qtbot, tmp_path)
    panel.move(0, 0)
    _open(qtbot, panel, run)
    panel.grid.set_current_cell(0, 0)
    panel.mark("A")  # the teacher's circle in the first run
    _open(qtbot, panel, other)
    panel.grid.set_current_cell(0, 2)
    panel.mark("B")  # iter_120's circle in the second
    assert panel.model.data(panel.model.index(0, 2), STATE_ROLE) == "ok"
    with qtbot.waitSignal(panel.ab.compared, timeout=10_000) as sig:
        assert panel.compare()
    assert sig.args[0].max > 0
    assert panel.ab.labels() == ("A: demo_run: teacher / shape-circle", "B: second_run: iter_120 / shape-circle")
    avail = panel.screen().availableGeometry()
    geo = panel.ab.geometry()
    assert avail.contains(geo) and geo.width() >= 0.55 * avail.width() and geo.height() >= 0.55 * avail.height()
