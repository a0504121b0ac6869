"""Samples grid column headers stay readable at every thumbnail size (issue 42 polish): at the
smallest size "teacher" was clipped (and drawn bold, wider still, while its column held the current
cell). Checked on the pixels Qt paints: a name's text spans as many pixels in its own column as in a
column far wider than it, and stays off the column's edges. No torch."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QFont

from app.screenshots import RECORDED_RUN, prepare_recorded_run
from app.widgets.samples_grid import CELL_RANGE
from tests.app.test_samples_grid import _open, _panel


def _ink(header, section: int) -> tuple[int, int]:
    """(first, last) pixel column of the text painted in one header section, from its left edge."""
    image = header.grab().toImage()
    x0, width = header.sectionViewportPosition(section), header.sectionSize(section)
    assert 0 <= x0 and x0 + width <= image.width()
    xs = [x - x0 for x in range(x0, x0 + width) for y in range(image.height())
          if image.pixelColor(x, y).lightness() < 110]
    assert xs, "no text painted"
    return min(xs), max(xs)


def _whole_width(header, section: int, columns) -> int:
    for c in columns:
        header.resizeSection(c, 300 if c == section else 40)
    first, last = _ink(header, section)
    return last - first + 1


def test_every_column_name_is_whole_at_every_thumbnail_size(qtbot, tmp_path):
    run = prepare_recorded_run(RECORDED_RUN, tmp_path / "runs")  # teacher, iter_60, iter_120
    panel = _panel(qtbot, tmp_path)
    _open(qtbot, panel, run)
    grid, header = panel.grid, panel.grid.horizontalHeader()
    columns = range(panel.model.columnCount())
    assert [panel.model.headerData(c, Qt.Orientation.Horizontal) for c in columns] == ["teacher", "iter_60", "iter_120"]
    for points in (None, 14):  # the test's font, then a larger desktop font (the widths follow it)
        if points:
            font = QFont(grid.font())
            font.setPointSize(points)
            grid.setFont(font)
        whole = {c: _whole_width(header, c, columns) for c in columns}
        for px in (CELL_RANGE[0], 56, 80, 120, CELL_RANGE[1]):
            grid.set_cell_px(px)
            for c in columns:
                grid.set_current_cell(0, c)  # the current cell's column (Qt drew its header bold)
                qtbot.wait(1)
                first, last = _ink(header, c)
                name = (points, px, panel.model.headerData(c, Qt.Orientation.Horizontal))
                assert last - first + 1 >= whole[c] - 1, name  # not clipped
                assert 1 <= first and last <= header.sectionSize(c) - 2, name
                assert header.sectionSize(c) >= px and grid.rowHeight(0) == px
        grid.set_cell_px(CELL_RANGE[0])
        assert header.sectionSize(0) > CELL_RANGE[0]  # "teacher" is wider than the smallest thumbnails
    grid.set_cell_px(CELL_RANGE[1])
    assert [header.sectionSize(c) for c in columns] == [CELL_RANGE[1]] * 3  # names that fit leave px
