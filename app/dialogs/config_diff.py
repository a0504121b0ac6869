"""The "Compare configs" dialog: two runs' config.json side by side, one row per dotted field; a value
its run's distillation method does not read is greyed and says so."""
from __future__ import annotations

from typing import Optional

from PySide6.QtGui import QBrush, QColor, QFont
from PySide6.QtWidgets import (QAbstractItemView, QCheckBox, QDialog, QDialogButtonBox, QHeaderView,
                               QLabel, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from app.models.config_diff import diff_configs, format_value

_DIFF_BACKGROUND = QColor(255, 236, 179)  # amber tint: the rows that differ, when all rows are shown
_UNUSED_FOREGROUND = QColor(130, 130, 130)  # a value the run's method does not read


class ConfigDiffDialog(QDialog):
    """Only the differing fields by default; "Show all fields" lists the equal ones too."""

    def __init__(self, name_a: str, config_a: dict, name_b: str, config_b: dict,
                 parent: Optional[QWidget] = None):
        super().__init__(parent)
        self.setWindowTitle(f"Compare configs: {name_a} / {name_b}")
        self.resize(900, 520)
        self._a, self._b = config_a, config_b
        self.summary = QLabel()
        self.show_all = QCheckBox("Show all fields")
        self.show_all.toggled.connect(self._fill)
        self.table = QTableWidget(0, 3)
        self.table.setHorizontalHeaderLabels(["Field", f"A: {name_a}", f"B: {name_b}"])
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.verticalHeader().setVisible(False)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        for col in (1, 2):
            header.setSectionResizeMode(col, QHeaderView.ResizeMode.Stretch)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        for w in (self.summary, self.show_all, self.table, buttons):
            layout.addWidget(w)
        self._fill()

    def _fill(self) -> None:
        everything = diff_configs(self._a, self._b, show_all=True)
        differing = sum(d.differs for d in everything)
        idle = sum(d.differs and bool(d.unused_a or d.unused_b) for d in everything)
        shown = everything if self.show_all.isChecked() else [d for d in everything if d.differs]
        self.summary.setText((f"{differing} of {len(everything)} fields differ"
                              + (f"; {idle} of them unused by one run's distillation method (greyed)" if idle else ""))
                             if differing else f"The configs are identical ({len(everything)} fields)")
        self.table.setRowCount(len(shown))
        bold = QFont()
        bold.setBold(True)
        for row, d in enumerate(shown):
            cells = ((d.path, ""), (format_value(d.a), d.unused_a), (format_value(d.b), d.unused_b))
            for col, (value, unused) in enumerate(cells):
                text = f"{value}  ({unused})" if unused else value
                item = QTableWidgetItem(text)
                item.setToolTip(text)
                if d.differs and self.show_all.isChecked():
                    item.setBackground(QBrush(_DIFF_BACKGROUND))
                    item.setFont(bold)
                if unused:
                    item.setForeground(QBrush(_UNUSED_FOREGROUND))
                self.table.setItem(row, col, item)

    def rows(self) -> list[tuple[str, str, str]]:
        """What the table shows (field, A, B): for tests and for copying."""
        return [tuple(self.table.item(r, c).text() for c in range(3))  # type: ignore[misc]
                for r in range(self.table.rowCount())]
