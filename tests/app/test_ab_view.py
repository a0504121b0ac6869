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
    view.set_one_to_one(True)
    assert view.left.scale_factor() == 1.0 and view.right.scale_factor() == 1.0
    view.set_one_to_one(False)
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
    view.set_one_to_one(True)
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
