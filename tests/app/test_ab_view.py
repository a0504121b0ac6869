"""The A/B view: the difference numbers, the heat map, blink, 1:1 zoom and synced pan. No torch."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtGui import QColor, QImage

from app.dialogs.ab_view import ABView, image_difference


def _img(px: int, colour: QColor) -> QImage:
    img = QImage(px, px, QImage.Format_RGB32)
    img.fill(colour)
    return img


def test_difference_of_two_different_images_is_nonzero_and_of_the_same_image_zero():
    a = _img(16, QColor(200, 10, 10))
    b = _img(16, QColor(200, 10, 10))
    b.setPixelColor(3, 4, QColor(100, 10, 30))  # one pixel: |dR| = 100, |dB| = 20
    d = image_difference(a, b)
    assert d.max == 100
    assert abs(d.mean - 120 / (16 * 16 * 3)) < 1e-9
    assert d.heat.pixelColor(3, 4) == QColor(255, 255, 255)  # the largest difference is white
    assert d.heat.pixelColor(0, 0) == QColor(0, 0, 0)
    same = image_difference(a, a.copy())
    assert (same.max, same.mean, same.note) == (0, 0.0, "")


def test_images_of_different_sizes_are_compared_at_as_size_and_say_so():
    d = image_difference(_img(16, QColor("red")), _img(32, QColor("red")))
    assert d.max == 0 and "sizes differ (16x16 vs 32x32)" in d.note
    assert (d.heat.width(), d.heat.height()) == (16, 16)


def _pair(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a.png", tmp_path / "b.png"
    _img(64, QColor("black")).save(str(a))
    img = _img(64, QColor("black"))
    img.setPixelColor(10, 10, QColor("white"))
    img.save(str(b))
    return a, b


def test_modes_blink_zoom_and_synced_pan(qtbot, tmp_path):
    view = ABView()
    qtbot.addWidget(view)
    view.resize(400, 300)
    view.show()
    a, b = _pair(tmp_path)
    with qtbot.waitSignal(view.compared, timeout=10_000) as sig:
        view.set_pair("teacher / x", a, "iter_60 / x", b)
    assert sig.args[0].max == 255 and "max 255" in view.stats.text()
    view.set_mode("blink")
    assert view.blinking() and not view.right.isVisible()
    shown = view.showing_b
    qtbot.waitUntil(lambda: view.showing_b != shown, timeout=3_000)  # the timer toggles A and B
    assert view.left_label.text() == ("B: iter_60 / x" if view.showing_b else "A: teacher / x")
    view.set_mode("diff")
    assert not view.blinking() and view.left_label.text().startswith("|A - B|")
    view.set_mode("side")
    assert view.right.isVisible()
    view.set_zoom(1.0)
    assert view.left.scale_factor() == 1.0 and view.right.scale_factor() == 1.0
    view.set_zoom(None)
    assert view.left.scale_factor() > 1.0  # 64 px fitted into a larger view


def test_pan_is_synced_between_the_two_views_at_1_to_1(qtbot, tmp_path):
    view = ABView()
    qtbot.addWidget(view)
    view.resize(300, 200)
    view.show()
    a, b = tmp_path / "a.png", tmp_path / "b.png"
    _img(1000, QColor("gray")).save(str(a))
    _img(1000, QColor("gray")).save(str(b))
    with qtbot.waitSignal(view.compared, timeout=10_000):
        view.set_pair("A", a, "B", b)
    view.set_zoom(1.0)
    h = view.left.horizontalScrollBar()
    assert h.maximum() > 0
    h.setValue(h.maximum() // 2)
    view.left.verticalScrollBar().setValue(123)
    assert view.right.horizontalScrollBar().value() == h.maximum() // 2
    assert view.right.verticalScrollBar().value() == 123


def test_an_unreadable_image_is_one_line(qtbot, tmp_path):
    view = ABView()
    qtbot.addWidget(view)
    (tmp_path / "bad.png").write_bytes(b"not a png")
    with qtbot.waitSignal(view.failed, timeout=10_000):
        view.set_pair("A", tmp_path / "bad.png", "B", tmp_path / "bad.png")
    assert view.stats.text().startswith("Cannot compare: OSError: cannot decode")


def _checker(px: int) -> QImage:
    """px x px, alternating black and white pixels: any smoothing when enlarged shows as grey."""
    img = QImage(px, px, QImage.Format_RGB32)
    for y in range(px):
        for x in range(px):
            img.setPixelColor(x, y, QColor("white") if (x + y) % 2 else QColor("black"))
    return img


def _loaded(qtbot, tmp_path, size=(900, 600)) -> ABView:
    view = ABView()
    qtbot.addWidget(view)
    view.resize(*size)
    view.show()
    a, b = tmp_path / "a.png", tmp_path / "b.png"
    _checker(64).save(str(a))
    _checker(64).save(str(b))
    with qtbot.waitSignal(view.compared, timeout=10_000):
        view.set_pair("teacher / x", a, "iter_60 / x", b)
    return view


def test_zoom_steps_enlarge_without_smoothing_and_both_views_pan_together(qtbot, tmp_path):
    view = _loaded(qtbot, tmp_path)
    for text, zoom in (("1:1", 1.0), ("2x", 2.0), ("4x", 4.0), ("8x", 8.0)):
        button = next(b for b in view.zoom_buttons.buttons() if b.text() == text)
        button.click()
        assert view.left.scale_factor() == zoom and view.right.scale_factor() == zoom
    # 64 px at 8x is 512 px: each image pixel is an 8 x 8 block of one colour, nothing in between
    shot = view.left.viewport().grab().toImage()
    colours = {shot.pixelColor(x, y).name() for x in range(0, min(shot.width(), 200))
               for y in range(0, min(shot.height(), 200))}
    assert colours <= {"#000000", "#ffffff"}, sorted(colours)[:5]
    h = view.left.horizontalScrollBar()
    assert h.maximum() > 0  # 512 px in a ~430 px view: it pans
    h.setValue(h.maximum())
    view.left.verticalScrollBar().setValue(37)
    assert view.right.horizontalScrollBar().value() == h.maximum()
    assert view.right.verticalScrollBar().value() == 37
    next(b for b in view.zoom_buttons.buttons() if b.text() == "Fit").click()
    assert view.left.scale_factor() > 1.0  # fitted: 64 px fill the view


def test_blink_and_difference_fill_the_window(qtbot, tmp_path):
    view = _loaded(qtbot, tmp_path)
    side_width = view.left.width()
    assert side_width < view.width() / 2
    for mode in ("blink", "diff"):
        view.set_mode(mode)
        qtbot.waitUntil(lambda: view.left.width() > 0.9 * view.width() - 40, timeout=3_000)
        assert not view.columns[1].isVisible()
    view.set_mode("side")
    qtbot.waitUntil(lambda: view.left.width() < view.width() / 2, timeout=3_000)


def test_the_window_opens_at_most_of_the_screen_beside_the_anchor_and_inside_the_screen(qtbot, tmp_path):
    from PySide6.QtCore import QRect
    from PySide6.QtWidgets import QWidget

    from app.dialogs.ab_view import placement

    avail = QRect(0, 0, 1280, 800)
    beside = placement(avail, QRect(0, 0, 500, 700))
    assert beside.left() > 500 and avail.contains(beside) and beside.width() == int(1280 * 0.6)
    on_the_left = placement(avail, QRect(900, 50, 380, 700))
    assert on_the_left.right() < 900 and avail.contains(on_the_left)
    over = placement(avail, QRect(0, 0, 1280, 800))  # a maximized window: on top of it, on screen
    assert avail.contains(over) and over.height() >= 0.55 * 800
    anchor = QWidget()
    qtbot.addWidget(anchor)
    anchor.setGeometry(0, 0, 200, 200)
    anchor.show()
    view = ABView()
    qtbot.addWidget(view)
    view.show_beside(anchor)
    screen = view.screen().availableGeometry()
    assert screen.contains(view.geometry()) and view.width() >= 0.55 * screen.width()
