"""The A/B window (issue 42 polish): Escape closes it, and a new pair starts fitted, as the first pair
does, instead of keeping the zoom chosen for the old pair. No torch."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor

from tests.app.test_ab_view import _img, _loaded


def test_escape_closes_the_window_and_stops_the_blink(qtbot, tmp_path):
    view = _loaded(qtbot, tmp_path)
    view.set_mode("blink")
    view.left.setFocus()
    qtbot.keyClick(view.left, Qt.Key.Key_A)  # other keys do not close it
    assert view.isVisible()
    qtbot.keyClick(view.left, Qt.Key.Key_Escape)  # from the image view that has the focus
    assert not view.isVisible() and not view.blinking()
    view.show()
    assert view.blinking()  # shown again in blink mode: it blinks again
    qtbot.keyClick(view, Qt.Key.Key_Escape)
    assert not view.isVisible()


def test_a_new_pair_starts_fitted(qtbot, tmp_path):
    view = _loaded(qtbot, tmp_path)  # a 64 px pair, fitted
    fitted = view.left.scale_factor()
    assert fitted > 1.0 and view.left.zoom is None
    view.set_zoom(4.0)
    assert view.left.scale_factor() == 4.0 and view.right.scale_factor() == 4.0
    c, d = tmp_path / "c.png", tmp_path / "d.png"
    _img(64, QColor("red")).save(str(c))  # the same size: the views keep their pixmap geometry
    _img(64, QColor("blue")).save(str(d))
    with qtbot.waitSignal(view.compared, timeout=10_000):
        view.set_pair("iter_60 / y", c, "iter_120 / y", d)
    assert view.left.zoom is None and view.right.zoom is None
    assert view.left.scale_factor() == fitted and view.right.scale_factor() == fitted
    fit = next(b for b in view.zoom_buttons.buttons() if b.text() == "Fit")
    assert fit.isChecked()

