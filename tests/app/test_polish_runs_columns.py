"""Runs tab columns follow their contents (issue 42 polish): a state that becomes "finished" after the
first scan, or a longer iteration, is not elided ("finish…"), while a column whose texts did not
change keeps the width the user gave it. No torch."""
from __future__ import annotations

import json
import time

from app.panels.runs import COLUMNS, NOTE_WIDTH
from tests.app.test_runs_panel import by_name, open_panel, rescan, write_run
from dmad.contract.runs import atomic_write_json


def _fits(panel, column: str) -> bool:
    index = COLUMNS.index(column)
    header = panel.table.horizontalHeader()
    return header.sectionSize(index) >= max(panel.table.sizeHintForColumn(index), header.sectionSizeHint(index))


def test_a_changed_state_and_iteration_widen_their_columns_and_the_users_width_stays(qtbot, tmp_path):
    run = write_run(tmp_path, "r", "paused", iters=(10,))  # our own pid, fresh heartbeat: really paused
    panel = open_panel(qtbot, tmp_path)
    status, iteration = COLUMNS.index("Status"), COLUMNS.index("Iteration")
    header = panel.table.horizontalHeader()
    fitted = header.sectionSize(status), header.sectionSize(iteration)
    teacher = COLUMNS.index("Teacher")
    header.resizeSection(teacher, header.sectionSize(teacher) + 57)  # the user widens a column
    widened = header.sectionSize(teacher)

    state = json.loads((run / "status.json").read_text())
    atomic_write_json(run / "status.json", {**state, "state": "finished", "iter": 123456, "max_train_steps": 1000000,
                                            "heartbeat": time.time()})
    rescan(qtbot, panel)
    assert by_name(panel)["r"].state == "finished"  # the same folder: the cells changed in place
    assert _fits(panel, "Status") and _fits(panel, "Iteration")
    assert header.sectionSize(status) > fitted[0] and header.sectionSize(iteration) > fitted[1]
    assert header.sectionSize(teacher) == widened  # its texts did not change: the user's width is kept


def test_a_new_run_refits_the_changed_columns_and_the_note_stays_capped(qtbot, tmp_path):
    write_run(tmp_path, "a", "finished")
    panel = open_panel(qtbot, tmp_path)
    name = COLUMNS.index("Name")
    before = panel.table.horizontalHeader().sectionSize(name)
    long = write_run(tmp_path, "a-much-longer-run-name-that-differs-late-v2", "stopped")
    (long / "note.txt").write_text("a note far longer than the column may ever grow " * 8)
    rescan(qtbot, panel)
    header = panel.table.horizontalHeader()
    assert _fits(panel, "Name") and _fits(panel, "Status") and header.sectionSize(name) > before
    assert header.sectionSize(COLUMNS.index("Note")) == NOTE_WIDTH
    assert header.stretchLastSection()
