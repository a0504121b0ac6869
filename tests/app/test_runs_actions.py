"""The Runs panel's filter, Delete, Rename, Note and Export, how it names and sizes runs, and the state
and iteration it shows for a run that is stopping or progressing. Run folders are written in the
engine's formats (tests/app/test_runs_panel.py); `dmad export` is a small script. No torch."""
from __future__ import annotations

import json
import sys
import textwrap
import time

from PySide6.QtCore import QFile, Qt, QTimer
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QApplication, QDialogButtonBox, QFileDialog, QMessageBox

from app.dialogs.export_run import ExportDialog
from app.dialogs.run_actions import NoteDialog, RenameDialog
from app.models.lifecycle import RunLifecycle
from app.models.run_files import name_problem
from app.models.run_state import RunState
from app.panels.runs import COLUMNS, RunsPanel
from dmad.contract.runs import atomic_write_json
from tests.app.test_runs_panel import _config, by_name, cell, open_panel, write_run

WAIT_MS = 30_000


def _visible_names(panel: RunsPanel) -> list[str]:
    proxy = panel.proxy
    return sorted(proxy.index(r, 0).data() for r in range(proxy.rowCount()))


def _in_modal(qtbot, act) -> None:
    """Run `act(dialog)` on the modal dialog the next click opens (its exec() is a nested event loop)."""
    def later():
        dialog = QApplication.activeModalWidget()
        if dialog is None:
            QTimer.singleShot(20, later)
            return
        act(dialog)
    QTimer.singleShot(0, later)


def _scanned_after(qtbot, panel: RunsPanel, click) -> None:
    with qtbot.waitSignal(panel.runs_scanned, timeout=WAIT_MS):
        click()


def test_the_filter_keeps_rows_whose_name_note_or_state_holds_the_text(qtbot, tmp_path):
    write_run(tmp_path, "sd15-lr1e-4", "finished")
    write_run(tmp_path, "sdxl-baseline", "stopped")
    (write_run(tmp_path, "flux-try", "finished") / "note.txt").write_text("Best so far: sharp edges\n")
    panel = open_panel(qtbot, tmp_path)
    panel.filter_edit.setText("SD")
    assert _visible_names(panel) == ["sd15-lr1e-4", "sdxl-baseline"]  # any case
    panel.filter_edit.setText("sharp")
    assert _visible_names(panel) == ["flux-try"]  # the note
    panel.filter_edit.setText("stopped")
    assert _visible_names(panel) == ["sdxl-baseline"]  # the state
    panel.filter_edit.clear()
    assert len(_visible_names(panel)) == 3


def test_a_note_is_written_atomically_and_shown_in_its_column_and_tooltips(qtbot, tmp_path):
    run = write_run(tmp_path, "r1", "finished")
    panel = open_panel(qtbot, tmp_path)
    panel.select_paths([run])

    def write(dialog: NoteDialog) -> None:
        dialog.text.setPlainText("lr too high: diverged at 2k\nretry with 5e-5")
        dialog.accept()
    _in_modal(qtbot, write)
    _scanned_after(qtbot, panel, lambda: qtbot.mouseClick(panel.note_button, Qt.LeftButton))
    assert (run / "note.txt").read_text() == "lr too high: diverged at 2k\nretry with 5e-5\n"
    assert cell(panel, "r1", "Note") == "lr too high: diverged at 2k"
    tip = cell(panel, "r1", "Name", Qt.ItemDataRole.ToolTipRole)
    assert tip.startswith("r1\n") and "retry with 5e-5" in tip
    assert "note of r1 saved" in panel.message.full_text()


def test_rename_refuses_taken_and_invalid_names_and_renames_a_run_that_is_not_live(qtbot, tmp_path):
    run = write_run(tmp_path, "old-name", "stopped")
    write_run(tmp_path, "taken", "finished")
    live = write_run(tmp_path, "live", "running")
    assert name_problem(tmp_path, run, "taken") == f"taken exists already in {tmp_path}"
    assert "may not contain '/'" in name_problem(tmp_path, run, "a/b")
    assert name_problem(tmp_path, run, "") and name_problem(tmp_path, run, ".hidden")
    panel = open_panel(qtbot, tmp_path)
    panel.select_paths([live])
    assert not panel.rename_button.isEnabled() and "live is running: stop it first" in panel.rename_button.toolTip()
    panel.select_paths([run])
    assert panel.rename_button.isEnabled()
    seen = []

    def rename(dialog: RenameDialog) -> None:
        ok = dialog.buttons.button(QDialogButtonBox.StandardButton.Ok)
        dialog.name.setText("taken")
        seen.append((ok.isEnabled(), dialog.problem.full_text()))
        dialog.name.setText("new-name")
        seen.append((ok.isEnabled(), dialog.problem.full_text()))
        ok.click()
    _in_modal(qtbot, rename)
    with qtbot.waitSignal(panel.run_renamed, timeout=WAIT_MS) as renamed:
        qtbot.mouseClick(panel.rename_button, Qt.LeftButton)
    assert seen == [(False, f"taken exists already in {tmp_path}"), (True, "")]
    assert renamed.args == [run, tmp_path / "new-name"]
    assert not run.exists() and (tmp_path / "new-name" / "status.json").is_file()
    qtbot.waitUntil(lambda: [r.name for r in panel.selected_rows()] == ["new-name"], timeout=WAIT_MS)  # still selected


def test_delete_moves_a_run_to_the_trash_and_never_a_live_one(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))  # the trash of this test, not the user's
    (tmp_path / "data").mkdir()  # Qt makes data/Trash, not data itself
    root = tmp_path / "runs"
    run = write_run(root, "done", "finished")
    live = write_run(root, "live", "running")
    panel = open_panel(qtbot, root)
    panel.select_paths([live])
    assert not panel.delete_button.isEnabled()
    panel.select_paths([run, live])
    assert not panel.delete_button.isEnabled()  # one live run in the selection is one too many
    panel.select_paths([run])
    monkeypatch.setattr(QMessageBox, "exec", lambda box: QMessageBox.StandardButton.Yes)
    with qtbot.waitSignal(panel.run_deleted, timeout=WAIT_MS) as deleted:
        qtbot.mouseClick(panel.delete_button, Qt.LeftButton)
    assert deleted.args == [run] and not run.exists()
    assert (tmp_path / "data" / "Trash" / "files" / "done" / "status.json").is_file()  # it can come back
    qtbot.waitUntil(lambda: sorted(by_name(panel)) == ["live"], timeout=WAIT_MS)


def test_without_a_trash_delete_asks_before_deleting_permanently(qtbot, tmp_path, monkeypatch):
    run = write_run(tmp_path, "done", "finished")
    monkeypatch.setattr(QFile, "moveToTrash", staticmethod(lambda path: (False, "")))
    asked = []

    def exec_(box):
        asked.append(box.text())
        return QMessageBox.StandardButton.Yes
    monkeypatch.setattr(QMessageBox, "exec", exec_)
    panel = open_panel(qtbot, tmp_path)
    panel.select_paths([run])
    with qtbot.waitSignal(panel.run_deleted, timeout=WAIT_MS):
        qtbot.mouseClick(panel.delete_button, Qt.LeftButton)
    assert asked == ["Move done to the trash?", "done cannot be moved to the trash here. Delete it permanently?"]
    assert not run.exists()


def test_a_folder_that_went_live_meanwhile_is_not_deleted(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    run = write_run(tmp_path, "r", "stopped")
    panel = open_panel(qtbot, tmp_path)
    panel.select_paths([run])
    status = json.loads((run / "status.json").read_text())
    atomic_write_json(run / "status.json", {**status, "state": "running", "heartbeat": time.time()})  # continued
    monkeypatch.setattr(QMessageBox, "exec", lambda box: QMessageBox.StandardButton.Yes)
    qtbot.mouseClick(panel.delete_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: "stop it before you delete it" in panel.message.full_text(), timeout=WAIT_MS)
    assert run.is_dir()


EXPORT = textwrap.dedent(r'''
    import json, sys, time
    from pathlib import Path
    args = sys.argv[2:]
    Path(sys.argv[1]).write_text(json.dumps(args))
    run = Path(args[args.index("--run") + 1])
    print("INFO dmad: loading the teacher", file=sys.stderr, flush=True)
    time.sleep(0.3)
    out = (Path(args[args.index("--out") + 1]) if "--out" in args
           else run / "export" / ("iter_20-" + args[args.index("--format") + 1]))
    out.mkdir(parents=True)
    print(out, flush=True)
''')


def test_export_runs_dmad_export_shows_progress_and_reveals_the_folder(qtbot, tmp_path, monkeypatch):
    script = tmp_path / "export.py"
    script.write_text(EXPORT, encoding="utf-8")
    argv = tmp_path / "argv.json"
    full = write_run(tmp_path / "runs", "full", "finished", last_checkpoint=20)
    lora = write_run(tmp_path / "runs", "lora", "finished", last_checkpoint=20, config=_config(identity={
        "pretrained_model_name_or_path": "/models/demo/teacher", "train_data_dir": "/data/shapes", "student": "lora"}))
    (lora / "checkpoints" / "iter_20").mkdir(parents=True)
    opened = []
    monkeypatch.setattr(QDesktopServices, "openUrl", lambda url: opened.append(url.toLocalFile()) or True)
    panel = open_panel(qtbot, tmp_path / "runs", engine_command=[sys.executable, str(script), str(argv)])
    panel.select_paths([full])
    qtbot.mouseClick(panel.export_button, Qt.LeftButton)
    dialog = panel.findChild(ExportDialog)
    assert dialog.format.currentData() == "diffusers" and dialog.format.count() == 4
    assert not dialog.format.model().item(1).isEnabled() and not dialog.format.model().item(2).isEnabled()
    assert dialog.format.model().item(3).isEnabled() and dialog.format.itemData(3) == "single-file"  # any student
    dialog.close()
    panel.select_paths([lora])
    qtbot.mouseClick(panel.export_button, Qt.LeftButton)
    dialog = next(d for d in panel.findChildren(ExportDialog) if d.run == lora)
    assert dialog.format.currentData() == "lora" and dialog.copy_button.isHidden()  # nothing exported yet
    qtbot.waitUntil(lambda: dialog.checkpoint.count() == 2, timeout=WAIT_MS)  # latest, iter_20
    dialog.checkpoint.setCurrentIndex(1)
    qtbot.mouseClick(dialog.export_button, Qt.LeftButton)
    assert dialog.export_button.text() == "Cancel" and not dialog.progress.isHidden()  # busy
    qtbot.waitUntil(lambda: "loading the teacher" in dialog.status.full_text(), timeout=WAIT_MS)
    qtbot.waitUntil(lambda: not dialog.command.is_running(), timeout=WAIT_MS)
    out = lora / "export" / "iter_20-lora"
    assert json.loads(argv.read_text()) == ["export", "--run", str(lora), "--format", "lora", "--checkpoint", "20"]
    assert dialog.status.full_text() == f"Exported to {out}" and opened == [str(out)]
    assert dialog.export_button.text() == "Export" and dialog.progress.isHidden()
    # one file for ComfyUI / Forge / A1111, saved in fp16
    dialog.format.setCurrentIndex(dialog.format.findData("lora-single-file"))
    dialog.dtype.setCurrentIndex(dialog.dtype.findData("fp16"))
    qtbot.mouseClick(dialog.export_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: not dialog.command.is_running() and len(opened) == 2, timeout=WAIT_MS)
    assert json.loads(argv.read_text()) == ["export", "--run", str(lora), "--format", "lora-single-file",
                                            "--dtype", "fp16", "--checkpoint", "20"]
    assert not dialog.copy_button.isHidden()
    # into another folder, on a machine where no file manager opens it: the path, and Copy path
    elsewhere = tmp_path / "loras"
    elsewhere.mkdir()
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: str(elsewhere))
    monkeypatch.setattr(QDesktopServices, "openUrl", lambda url: False)
    qtbot.mouseClick(dialog.choose, Qt.LeftButton)
    assert dialog.destination.text() == str(elsewhere)
    qtbot.mouseClick(dialog.export_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: "no file manager" in dialog.status.full_text(), timeout=WAIT_MS)
    out = elsewhere / "lora-iter_20-lora-single-file"
    assert json.loads(argv.read_text())[-2:] == ["--out", str(out)] and out.is_dir()
    assert dialog.status.full_text() == f"Exported to {out} (no file manager opened it: Copy path)"
    qtbot.mouseClick(dialog.copy_button, Qt.LeftButton)
    assert QApplication.clipboard().text() == str(out)


def test_export_offers_to_merge_the_teachers_loras_into_the_one_lora_file(qtbot, tmp_path, monkeypatch):
    script = tmp_path / "export.py"
    script.write_text(EXPORT, encoding="utf-8")
    argv = tmp_path / "argv.json"
    ident = {"pretrained_model_name_or_path": "/models/demo/teacher", "train_data_dir": "/data/shapes", "student": "lora"}
    plain = write_run(tmp_path / "runs", "plain", "finished", last_checkpoint=20, config=_config(identity=ident))
    styled = write_run(tmp_path / "runs", "styled", "finished", last_checkpoint=20, config=_config(identity={
        **ident, "teacher_loras": [{"path": "/loras/style_lora", "scale": 0.8}]}))
    for run in (plain, styled):
        (run / "checkpoints" / "iter_20").mkdir(parents=True)
    monkeypatch.setattr(QDesktopServices, "openUrl", lambda url: True)
    panel = open_panel(qtbot, tmp_path / "runs", engine_command=[sys.executable, str(script), str(argv)])
    dialogs = {}
    for run in (plain, styled):
        panel.select_paths([run])
        qtbot.mouseClick(panel.export_button, Qt.LeftButton)
        dialogs[run.name] = d = next(x for x in panel.findChildren(ExportDialog) if x.run == run)
        qtbot.waitUntil(lambda d=d: d.checkpoint.count() == 2, timeout=WAIT_MS)  # the worker has read the run
        d.format.setCurrentIndex(d.format.findData("lora-single-file"))
    assert dialogs["plain"].merge.isHidden()  # its teacher had no LoRAs: nothing to merge
    d = dialogs["styled"]
    assert not d.merge.isHidden() and "style_lora" in d.merge.text()
    d.format.setCurrentIndex(d.format.findData("lora"))
    assert d.merge.isHidden()  # only the one-file LoRA format merges
    d.format.setCurrentIndex(d.format.findData("lora-single-file"))
    d.merge.setChecked(True)
    qtbot.mouseClick(d.export_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: not d.command.is_running() and argv.is_file(), timeout=WAIT_MS)
    assert json.loads(argv.read_text()) == ["export", "--run", str(styled), "--format", "lora-single-file",
                                            "--merge-user-loras"]


# ---------------------------------------------------------------- how runs are shown

def test_names_are_never_cut_and_headers_are_not_clipped(qtbot, tmp_path):
    a = "dmad_20261130-1028_shapes-and-colours-dataset_demo-prompts-v1"
    write_run(tmp_path, a, "finished")
    write_run(tmp_path, a.replace("1028", "1029"), "finished")
    panel = open_panel(qtbot, tmp_path)
    panel.resize(900, 500)
    panel.show()
    qtbot.waitExposed(panel)
    header, name = panel.table.horizontalHeader(), COLUMNS.index("Name")
    metrics = panel.table.fontMetrics()
    assert header.sectionSize(name) >= metrics.horizontalAdvance(a)  # the whole name fits
    for column, title in enumerate(COLUMNS[:-1]):  # the last one stretches
        assert header.sectionSize(column) >= header.fontMetrics().horizontalAdvance(title), title


def test_a_run_the_app_is_stopping_is_listed_as_stopping(qtbot, tmp_path):
    run = write_run(tmp_path, "r", "running")  # the engine has not reached its boundary: status says running
    panel = open_panel(qtbot, tmp_path)
    lifecycle = RunLifecycle()
    state = RunState(lifecycle)
    panel.watch(state)
    lifecycle.open(run, {"state": "running"})
    with qtbot.waitSignal(panel.runs_scanned, timeout=WAIT_MS):
        lifecycle.stop_requested()
    assert by_name(panel)["r"].state == "stopping" and cell(panel, "r", "Status") == "stopping"
    assert panel.message.full_text().startswith("1 runs · 1 live")


def test_the_iteration_is_status_jsons_or_a_newer_metrics_row(qtbot, tmp_path):
    write_run(tmp_path, "fresh", "running", iters=(10, 20), iter=40)  # heartbeats refresh iter between rows
    write_run(tmp_path, "stale", "running", iters=(10, 20), iter=3)  # an older engine kept a paused iter
    panel = open_panel(qtbot, tmp_path)
    assert cell(panel, "fresh", "Iteration") == "40 / 1000" and cell(panel, "stale", "Iteration") == "20 / 1000"
