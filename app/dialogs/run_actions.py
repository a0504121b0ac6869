"""The Runs tab's actions on run folders and their questions: delete (to the trash, or permanently when
there is no trash), a new name (checked as it is typed: app/models/run_files.name_problem), a note, and
export (app/dialogs/export_run.py). The folders change in pool workers (app/models/run_files.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional, Sequence

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import (QDialog, QDialogButtonBox, QLabel, QLineEdit, QMessageBox, QPlainTextEdit,
                               QVBoxLayout, QWidget)

from app.dialogs.export_run import ExportDialog
from app.engine.background import Task
from app.models.run_files import (FileResult, RunBusy, delete_run, name_problem, rename_run, trash_run,
                                  write_note)
from app.widgets.elided_label import ElidedLabel


def ask_trash(parent: Optional[QWidget], names: Sequence[str]) -> bool:
    listed = ", ".join(names[:3]) + (", …" if len(names) > 3 else "")
    what = names[0] if len(names) == 1 else f"{len(names)} runs ({listed})"
    box = QMessageBox(QMessageBox.Icon.Question, "Delete runs", f"Move {what} to the trash?",
                      QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel, parent)
    box.button(QMessageBox.StandardButton.Yes).setText("Move to trash")
    box.setInformativeText("Checkpoints, samples and logs go with the folder; the trash can give them back.")
    box.setDefaultButton(QMessageBox.StandardButton.Cancel)
    return box.exec() == QMessageBox.StandardButton.Yes


def ask_delete_permanently(parent: Optional[QWidget], name: str) -> bool:
    box = QMessageBox(QMessageBox.Icon.Warning, "Delete permanently?",
                      f"{name} cannot be moved to the trash here. Delete it permanently?",
                      QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel, parent)
    box.button(QMessageBox.StandardButton.Yes).setText("Delete permanently")
    box.setInformativeText("Its checkpoints, samples and logs are gone for good: this cannot be undone.")
    box.setDefaultButton(QMessageBox.StandardButton.Cancel)
    return box.exec() == QMessageBox.StandardButton.Yes


class RenameDialog(QDialog):
    """A new folder name for a run; OK only for a name that can be used (said as it is typed)."""

    def __init__(self, root: Path, path: Path, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self.setWindowTitle(f"Rename {path.name}")
        self._root, self._path = root, path
        self.name = QLineEdit(path.name)
        self.problem = ElidedLabel()
        self.problem.setStyleSheet("color: #b00020;")
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        self.name.textChanged.connect(self._check)
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel(f"New folder name in {root}:"))
        for w in (self.name, self.problem, self.buttons):
            layout.addWidget(w)
        self.resize(560, self.sizeHint().height())
        self._check()

    def value(self) -> str:
        return self.name.text()

    def _check(self) -> None:
        problem = name_problem(self._root, self._path, self.value())
        self.problem.setText(problem)
        self.buttons.button(QDialogButtonBox.StandardButton.Ok).setEnabled(not problem)


class NoteDialog(QDialog):
    """The run's note (<run>/note.txt): a few lines of the user's own; empty removes it."""

    def __init__(self, name: str, note: str, parent: Optional[QWidget] = None):
        super().__init__(parent)
        self.setWindowTitle(f"Note - {name}")
        self.text = QPlainTextEdit(note)
        self.text.setPlaceholderText("what this run tried, what came of it")
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.text)
        layout.addWidget(buttons)
        self.resize(520, 240)

    def value(self) -> str:
        return self.text.toPlainText()


def _safely(action: Callable[[], FileResult], kind: str, path: Path) -> FileResult:
    """Worker side: an action that never raises (a refusal or an OS error is its one line)."""
    try:
        return action()
    except RunBusy as e:
        return FileResult(kind, path, None, str(e), ok=False)
    except OSError as e:
        return FileResult(kind, path, None, f"{path.name}: {e.strerror or e}", ok=False)


class RunFileActions(QObject):
    """Delete, Rename, Note and Export for the Runs tab: asks first, changes folders in a pool worker
    (a delete of checkpoints takes seconds; a network drive longer), reports each `FileResult`."""

    done = Signal(object)  # FileResult

    def __init__(self, parent: QWidget, program: Optional[Sequence[str]] = None):
        super().__init__(parent)
        self._parent, self._program = parent, program
        self._task = Task(self, every_answer=True)  # each folder's answer, not only the last one's
        self._task.done.connect(self._on_done)
        # a bug in an action: said in one line, like a refusal (the traceback is the Task's to print)
        self._task.failed.connect(lambda message: self.done.emit(FileResult("error", Path(), None, message, ok=False)))

    def busy(self) -> bool:
        return self._task.busy()

    def delete(self, paths: Sequence[Path]) -> None:
        if paths and ask_trash(self._parent, [p.name for p in paths]):
            for path in paths:
                self._task.submit(lambda p=path: _safely(lambda: trash_run(p), "trash", p))

    def rename(self, root: Path, path: Path) -> None:
        dialog = RenameDialog(root, path, self._parent)
        if dialog.exec() == QDialog.DialogCode.Accepted:
            name = dialog.value()
            self._task.submit(lambda: _safely(lambda: rename_run(root, path, name), "rename", path))

    def note(self, path: Path, note: str) -> None:
        dialog = NoteDialog(path.name, note, self._parent)
        if dialog.exec() == QDialog.DialogCode.Accepted:
            text = dialog.value()
            self._task.submit(lambda: _safely(lambda: write_note(path, text), "note", path))

    def export(self, path: Path, lora_student: bool) -> ExportDialog:
        dialog = ExportDialog(path, lora_student, self._program, self._parent)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()
        return dialog

    def _on_done(self, result: FileResult) -> None:
        if result.trash_failed and ask_delete_permanently(self._parent, result.path.name):
            self._task.submit(lambda p=result.path: _safely(lambda: delete_run(p), "delete", p))
            return
        self.done.emit(result)
