"""The Data panel's image browser (issue 42 item 11): every image with its caption, filtered by the
check's findings and by text, a finding selecting its image, and a caption edited in place: written
atomically in a worker, then that one image checked again by the engine and the report's counts
updated, without checking the whole dataset again.

Most tests run the engine's own `dmad check-data` (torch-free, a second or so) on a small folder, so
the findings are the engine's; the thousands-of-images test lists a folder against a stand-in report.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings, Qt, QThreadPool
from PySide6.QtGui import QColor, QImage

from app.models.data_browse import ALL, ANY, NONE, Recheck, merge_recheck, read_caption, write_caption
from app.models.data_report import DataReport, Problem
from app.models.thumbs import ThumbCache
from app.panels.data import DataPanel
from app.screenshots import no_nvml
from app.selftest import LAYOUT_SIZES, settle, widget_problems, window_problems
from app.window import MainWindow
from tests.app.test_data_panel import StandIn, make_report, run_check

@pytest.fixture(autouse=True)
def _workers_done(qtbot):
    """The pool's jobs (thumbnails, the larger picture, captions) end before the widgets go."""
    yield
    QThreadPool.globalInstance().waitForDone(30_000)


COLOURS = ["#d03030", "#30a040", "#3050d0", "#c0a020", "#8030b0", "#20a0b0"]


def _png(path: Path, i: int, px: int = 80) -> None:
    """A picture that is not near-constant and not like the others: a square at a place of its own."""
    img = QImage(px, px, QImage.Format_RGB32)
    img.fill(QColor("#202020" if i % 2 else "#e0e0e0"))
    for y in range(px // 4 * (i % 3), px // 4 * (i % 3) + px // 3):
        for x in range(px // 5 * (i % 4), px // 5 * (i % 4) + px // 3):
            img.setPixelColor(x, y, QColor(COLOURS[i % len(COLOURS)]))
    assert img.save(str(path))


def _dataset(root: Path) -> Path:
    """Six images: a clean one with a long caption, an empty caption, none, a cp1252 one, a
    multi-line one and a clean one."""
    root.mkdir(parents=True)
    captions = {"a_long": "a " + "very " * 40 + "long caption about a red square",
                "b_empty": "   \n", "c_none": None, "d_latin": "caf\u00e9".encode("cp1252"),
                "e_multi": "first line\nsecond line", "f_fine": "a blue square on black"}
    for i, (stem, caption) in enumerate(captions.items()):
        _png(root / f"{stem}.png", i)
        if isinstance(caption, bytes):
            (root / f"{stem}.txt").write_bytes(caption)
        elif caption is not None:
            (root / f"{stem}.txt").write_text(caption, encoding="utf-8")
    return root


def real_panel(qtbot, tmp_path, size=(1100, 760)) -> tuple[DataPanel, Path]:
    data = _dataset(tmp_path / "data")
    panel = DataPanel(cache=ThumbCache(tmp_path / "thumbs", px=48))
    qtbot.addWidget(panel)
    panel.set_config({"identity": {"train_data_dir": "data"}, "resources": {"resolution": 64}}, tmp_path)
    panel.min_size.setValue(32)
    panel.resize(*size)
    panel.show()
    code, line = run_check(qtbot, panel)
    assert code == 1, line
    qtbot.waitUntil(lambda: panel.browser.model.rowCount() == 6, timeout=30_000)
    return panel, data


def names(panel: DataPanel) -> list[str]:
    b = panel.browser
    return [b.model.item(b.proxy.mapToSource(b.proxy.index(r, 0)).row()).name for r in range(b.proxy.rowCount())]


def select_finding(panel: DataPanel, category: str) -> Problem:
    row = next(r for r in range(panel.proxy.rowCount()) if panel.proxy.index(r, 0).data() == category)
    panel.table.setCurrentIndex(panel.proxy.index(row, 0))
    return panel.findings.current_problem()


def save_and_recheck(qtbot, panel: DataPanel) -> None:
    with qtbot.waitSignal(panel.rechecker.done, timeout=60_000):
        assert panel.browser.save()
    qtbot.waitUntil(lambda: not panel.rechecker.busy(), timeout=10_000)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".tmp-") or p.suffix == ".tmp")


# ---------------------------------------------------------------- listing and filtering

def test_the_browser_lists_every_image_with_its_caption_and_thumbnail(qtbot, tmp_path):
    panel, data = real_panel(qtbot, tmp_path)
    b = panel.browser
    assert names(panel) == ["a_long.png", "b_empty.png", "c_none.png", "d_latin.png", "e_multi.png", "f_fine.png"]
    text = lambda row: b.model.data(b.model.index(row), Qt.DisplayRole)  # noqa: E731
    assert text(0).startswith("a very very") and text(1) == text(2) == "(no caption)"
    assert text(3) == "caf\u00e9" and text(4) == "first line second line"  # one line, as training joins it
    tip = b.model.data(b.model.index(0), Qt.ToolTipRole)
    assert "long caption about a red square" in tip and tip.startswith("a_long.png")  # the whole caption
    # the view elides the caption under the thumbnail: the grid is far narrower than the text
    assert b.view.fontMetrics().horizontalAdvance(text(0)) > b.view.gridSize().width()
    assert b.view.textElideMode() == Qt.ElideRight and not b.view.wordWrap()
    assert "empty_caption" in b.model.data(b.model.index(1), Qt.ToolTipRole)
    qtbot.waitUntil(lambda: all(b.model.has_thumb(r) for r in range(6)), timeout=30_000)
    thumb = b.model.data(b.model.index(5), Qt.DecorationRole).pixmap(80, 80).toImage()
    assert thumb.pixelColor(2, 2) == QColor("#202020") and thumb.pixelColor(20, 45) == QColor(COLOURS[5])
    assert b.thumbs.cache.decodes == 6


def test_only_the_thumbnails_on_screen_are_decoded_among_thousands(qtbot, tmp_path):
    data = tmp_path / "cfg" / "data"
    data.mkdir(parents=True)
    _png(data / "first.png", 0)
    png = (data / "first.png").read_bytes()
    for i in range(2000):
        (data / f"img_{i:04d}.png").write_bytes(png)
        (data / f"img_{i:04d}.txt").write_text(f"caption number {i}")
    stand_in = StandIn(tmp_path / "standin", report=make_report(data, per_category={"duplicate_exact": 3}))
    panel = DataPanel(command=stand_in.command, cache=ThumbCache(tmp_path / "thumbs", px=48))
    qtbot.addWidget(panel)
    panel.set_config({"identity": {"train_data_dir": "data"}}, data.parent)
    panel.resize(1100, 700)
    panel.show()
    run_check(qtbot, panel)
    b = panel.browser
    qtbot.waitUntil(lambda: b.model.rowCount() == 2001, timeout=60_000)
    qtbot.waitUntil(lambda: b.model.has_thumb(0) and not b.thumbs.busy(), timeout=60_000)
    assert 0 < b.thumbs.cache.decodes < 100 and not b.model.has_thumb(2000)
    b.view.scrollToBottom()
    qtbot.waitUntil(lambda: b.model.has_thumb(2000), timeout=60_000)
    assert b.thumbs.cache.decodes < 200
    b.search.setText("number 1999")  # the text search covers every caption, read in the worker
    qtbot.waitUntil(lambda: b.proxy.rowCount() == 1, timeout=5_000)
    assert names(panel) == ["img_1999.png"] and b.count.text() == "1 of 2001 images"


def test_filtering_by_a_finding_code_shows_only_those_images(qtbot, tmp_path):
    panel, _ = real_panel(qtbot, tmp_path)
    b = panel.browser
    labels = {b.codes.itemData(i): b.codes.itemText(i) for i in range(b.codes.count())}
    assert labels[ALL] == "All images (6)" and labels[NONE] == "No findings (2)" and labels[ANY] == "With findings (4)"
    assert labels["empty_caption"] == "empty_caption (1)" and labels["caption_not_utf8"] == "caption_not_utf8 (1)"
    assert labels["image_without_caption"] == "image_without_caption (1)"
    assert "duplicate_exact" not in labels  # only codes the report found
    b.codes.setCurrentIndex(b.codes.findData("empty_caption"))
    assert names(panel) == ["b_empty.png"]
    b.codes.setCurrentIndex(b.codes.findData(NONE))
    assert names(panel) == ["a_long.png", "f_fine.png"]
    b.codes.setCurrentIndex(b.codes.findData(ANY))
    assert names(panel) == ["b_empty.png", "c_none.png", "d_latin.png", "e_multi.png"]
    b.codes.setCurrentIndex(b.codes.findData(ALL))
    b.search.setText("  BLUE   square ")  # case and spaces do not matter
    qtbot.waitUntil(lambda: b.proxy.rowCount() == 1, timeout=5_000)
    assert names(panel) == ["f_fine.png"]
    b.search.setText("e_multi")  # the file name too
    qtbot.waitUntil(lambda: names(panel) == ["e_multi.png"], timeout=5_000)


def test_selecting_a_finding_selects_and_shows_its_image(qtbot, tmp_path):
    panel, data = real_panel(qtbot, tmp_path)
    b = panel.browser
    b.codes.setCurrentIndex(b.codes.findData(NONE))  # hides the images with findings
    b.search.setText("blue")
    qtbot.waitUntil(lambda: b.proxy.rowCount() == 1, timeout=5_000)
    p = select_finding(panel, "empty_caption")
    assert p.path == str(data / "b_empty.txt")  # the finding names the caption; its image is selected
    item = b.current_item()
    assert item is not None and item.image == str(data / "b_empty.png")
    assert b.codes.currentData() == ALL and b.search.text() == ""  # the filter that hid it is cleared
    current = b.proxy.mapToSource(b.view.currentIndex()).row()
    assert b.model.item(current) is item and b.view.selectionModel().isSelected(b.view.currentIndex())
    assert b.view.visualRect(b.view.currentIndex()).intersects(b.view.viewport().rect())  # scrolled to
    shown = [b.detail.findings.item(i).text() for i in range(b.detail.findings.count())]
    assert shown == ["error: empty_caption: empty or whitespace-only"]
    assert b.detail.name.text() == str(data / "b_empty.png") and b.detail.editor.toPlainText() == "   \n"
    qtbot.waitUntil(lambda: b.detail.preview.pixmap() is not None, timeout=30_000)  # larger, from a worker
    select_finding(panel, "image_without_caption")
    assert b.current_item().name == "c_none.png" and b.detail.editor.toPlainText() == ""
    assert b.detail.note.text() == "no caption file: Save writes c_none.txt"


# ---------------------------------------------------------------- editing captions

def test_saving_a_caption_writes_it_atomically_and_rechecks_only_that_image(qtbot, tmp_path, monkeypatch):
    panel, data = real_panel(qtbot, tmp_path)
    before = panel.report()
    assert before.counts["empty_caption"] == 1 and before.usable == 3
    started = []
    original = type(panel.rechecker._dmad).start
    monkeypatch.setattr(type(panel.rechecker._dmad), "start",
                        lambda self, args: (started.append(list(args)), original(self, args))[1])
    b = panel.browser
    b.codes.setCurrentIndex(b.codes.findData("empty_caption"))
    select_finding(panel, "empty_caption")
    assert not b.detail.save.isEnabled()  # nothing changed yet
    b.detail.editor.setPlainText("a green square on white")
    assert b.detail.save.isEnabled()
    save_and_recheck(qtbot, panel)
    assert (data / "b_empty.txt").read_text(encoding="utf-8") == "a green square on white"
    assert leftovers(data) == []  # temp file renamed into place, nothing else left
    item = b.item_of(str(data / "b_empty.png"))
    assert "empty_caption" not in item.codes() and item.findings == ()
    after = panel.report()
    assert after.counts["empty_caption"] == 0 and after.errors == before.errors - 1
    assert after.usable == before.usable + 1 and after.datasets[0]["usable"] == before.datasets[0]["usable"] + 1
    assert after.datasets[0]["captions"] == before.datasets[0]["captions"] + 1
    assert sum(bk["usable"] for bk in after.buckets) == sum(bk["usable"] for bk in before.buckets) + 1
    assert "empty_caption" not in {panel.model.problem(r).category for r in range(panel.model.rowCount())}
    assert panel.category.itemText(panel.category.findData("empty_caption")) == "empty_caption (0)"
    assert panel.status.text() == f"{after.errors} errors and {after.warnings} warnings in 6 images (4 usable)."
    assert b.codes.currentData() == "empty_caption" and b.proxy.rowCount() == 0  # the fixed image left the filter
    assert b.detail.note.text() == "b_empty.txt saved and checked again: no findings"
    assert b.model.data(b.model.index(1), Qt.DisplayRole) == "a green square on white"
    # one image, not the dataset: a one-entry list in a temporary folder, which is gone afterwards
    assert len(started) == 1 and started[0][0] == "check-data" and "--no-cache" in started[0]
    listing = Path(started[0][1])
    assert listing.parent != data and not listing.parent.exists()
    assert started[0][started[0].index("--min-size") + 1] == "32"


def test_saving_a_latin1_caption_writes_utf8_and_a_multiline_one_is_still_said(qtbot, tmp_path):
    panel, data = real_panel(qtbot, tmp_path)
    b = panel.browser
    select_finding(panel, "caption_not_utf8")
    assert b.detail.editor.toPlainText() == "caf\u00e9" and "not UTF-8 (read as Windows-1252)" in b.detail.note.text()
    assert b.detail.save.isEnabled()  # unchanged, but saving fixes the encoding
    save_and_recheck(qtbot, panel)
    assert (data / "d_latin.txt").read_bytes() == "caf\u00e9".encode("utf-8")
    assert panel.report().counts["caption_not_utf8"] == 0
    select_finding(panel, "image_without_caption")
    b.detail.editor.setPlainText("a purple square\non two lines")
    save_and_recheck(qtbot, panel)
    assert (data / "c_none.txt").read_text(encoding="utf-8") == "a purple square\non two lines"
    item = b.item_of(str(data / "c_none.png"))
    assert item.codes() == {"caption_multiline"}  # the engine's verdict on what was written
    assert panel.report().counts["image_without_caption"] == 0 and panel.report().counts["caption_multiline"] == 2
    assert b.detail.note.text() == "c_none.txt saved and checked again: 1 finding"


def test_a_read_only_or_vanished_file_is_one_line_and_nothing_is_lost(qtbot, tmp_path):
    panel, data = real_panel(qtbot, tmp_path)
    b = panel.browser
    caption = data / "f_fine.txt"
    panel.browser.show_path(str(data / "f_fine.png"))
    os.chmod(caption, 0o444)
    b.detail.editor.setPlainText("an edit worth keeping")
    assert b.save()
    qtbot.waitUntil(lambda: b.detail.note.text() == "f_fine.txt is read-only: not written", timeout=10_000)
    assert "c0392b" in b.detail.note.styleSheet()
    assert caption.read_text() == "a blue square on black" and leftovers(data) == []
    assert b.detail.editor.toPlainText() == "an edit worth keeping" and b.detail.save.isEnabled()
    os.chmod(caption, 0o644)
    caption.unlink()  # gone since it was read
    assert b.save()
    qtbot.waitUntil(lambda: "deleted since it was read" in b.detail.note.text(), timeout=10_000)
    assert b.detail.note.text() == ("f_fine.txt was deleted since it was read: not written; "
                                    "Save again to write it anyway")
    assert not caption.exists() and b.detail.editor.toPlainText() == "an edit worth keeping"
    save_and_recheck(qtbot, panel)  # the second Save writes it
    assert caption.read_text() == "an edit worth keeping"
    (data / "a_long.png").unlink()  # the image itself vanished
    b.show_path(str(data / "a_long.png"))
    b.detail.editor.setPlainText("a caption for nothing")
    assert b.save()
    qtbot.waitUntil(lambda: b.detail.note.text() == "a_long.png is gone: a_long.txt not written", timeout=10_000)
    assert (data / "a_long.txt").read_text().startswith("a very very") and leftovers(data) == []


def test_a_caption_changed_on_disk_is_not_overwritten_and_an_edit_survives_browsing(qtbot, tmp_path):
    panel, data = real_panel(qtbot, tmp_path)
    b = panel.browser
    b.show_path(str(data / "f_fine.png"))
    b.detail.editor.setPlainText("my edit")
    b.show_path(str(data / "a_long.png"))  # look elsewhere: the edit is kept
    assert b.count.text() == "6 images, 1 unsaved" and b.unsaved() == 1
    b.show_path(str(data / "f_fine.png"))
    assert b.detail.editor.toPlainText() == "my edit" and b.detail.note.text() == "an edit not saved yet"
    (data / "f_fine.txt").write_text("someone else's edit, longer than before")
    assert b.save()
    qtbot.waitUntil(lambda: "changed on disk" in b.detail.note.text(), timeout=10_000)
    assert (data / "f_fine.txt").read_text() == "someone else's edit, longer than before"
    with qtbot.waitSignal(b._read.done, timeout=10_000):
        b.detail.reload.click()  # Reload shows what is on disk and drops the edit
    assert b.detail.editor.toPlainText() == "someone else's edit, longer than before" and b.unsaved() == 0


def test_a_recheck_that_fails_says_so_in_one_line_and_the_caption_stays_saved(qtbot, tmp_path):
    data = tmp_path / "cfg" / "data"
    data.mkdir(parents=True)
    _png(data / "empty_caption-0.png", 0)
    (data / "empty_caption-0.txt").write_text(" ")
    stand_in = StandIn(tmp_path / "standin", report=make_report(data, per_category={"empty_caption": 1}, images=1))
    panel = DataPanel(command=stand_in.command, cache=ThumbCache(tmp_path / "thumbs", px=48))
    qtbot.addWidget(panel)
    panel.set_config({"identity": {"train_data_dir": "data"}}, data.parent)
    run_check(qtbot, panel)
    b = panel.browser
    qtbot.waitUntil(lambda: b.model.rowCount() == 1, timeout=30_000)
    assert b.show_path(str(data / "empty_caption-0.png"))
    stand_in.set("usage")  # the recheck's command fails: exit 2 and one line
    b.detail.editor.setPlainText("a caption")
    with qtbot.waitSignal(panel.rechecker.failed, timeout=60_000):
        assert b.save()
    assert (data / "empty_caption-0.txt").read_text() == "a caption" and leftovers(data) == []
    listing = Path(stand_in.argv()["args"][1])
    assert b.detail.note.text() == ("empty_caption-0.txt saved; not checked again: dmad: error: not a folder or a "
                                    f"dataset list: {listing}")
    assert "c0392b" in b.detail.note.styleSheet() and panel.report().counts["empty_caption"] == 1  # unchanged
    qtbot.waitUntil(lambda: not listing.parent.exists(), timeout=10_000)  # its temporary folder is removed


def test_the_recheck_judges_the_image_by_its_datasets_own_options(qtbot, tmp_path):
    # the list's minimum_image_size (100) wins over the panel's --min-size 32: an 80 px image stays too small
    folder = tmp_path / "photos"
    folder.mkdir()
    _png(folder / "small.png", 0)
    (folder / "small.txt").write_text("", encoding="utf-8")
    listing = tmp_path / "list.json"
    listing.write_text(json.dumps([{"id": "photos", "instance_data_dir": "photos", "minimum_image_size": 100}]))
    panel = DataPanel(cache=ThumbCache(tmp_path / "thumbs", px=48))
    qtbot.addWidget(panel)
    panel.source_edit.setText(str(listing))
    panel.min_size.setValue(32)
    run_check(qtbot, panel)
    b = panel.browser
    qtbot.waitUntil(lambda: b.model.rowCount() == 1, timeout=30_000)
    assert b.model.item(0).codes() == {"empty_caption", "image_too_small"}
    b.show_path(str(folder / "small.png"))
    b.detail.editor.setPlainText("a small picture")
    save_and_recheck(qtbot, panel)
    assert b.model.item(0).codes() == {"image_too_small"} and panel.report().usable == 0
    assert panel.report().counts["empty_caption"] == 0 and panel.report().datasets[0]["captions"] == 1
    assert b.detail.note.text() == "small.txt saved and checked again: 1 finding"


def test_only_text_file_captions_are_editable(qtbot, tmp_path):
    a, c = tmp_path / "named", tmp_path / "prompted"
    for folder in (a, c):
        folder.mkdir()
    _png(a / "a_red_square.png", 0)
    _png(c / "dog.png", 1)
    listing = tmp_path / "list.json"
    listing.write_text(json.dumps([{"id": "named", "instance_data_dir": "named", "caption_strategy": "filename"},
                                   {"id": "prompted", "instance_data_dir": "prompted",
                                    "caption_strategy": "instanceprompt", "instance_prompt": "a photo of sks dog"}]))
    panel = DataPanel(cache=ThumbCache(tmp_path / "thumbs", px=48))
    qtbot.addWidget(panel)
    panel.source_edit.setText(str(listing))
    panel.min_size.setValue(32)
    run_check(qtbot, panel)
    b = panel.browser
    qtbot.waitUntil(lambda: b.model.rowCount() == 2, timeout=30_000)
    b.show_path(str(a / "a_red_square.png"))
    assert b.detail.editor.toPlainText() == "a red square" and b.detail.editor.isReadOnly()
    assert not b.detail.save.isEnabled() and "rename the image" in b.detail.note.text()
    b.show_path(str(c / "dog.png"))
    assert b.detail.editor.toPlainText() == "a photo of sks dog" and b.detail.editor.isReadOnly()
    assert "instance_prompt" in b.detail.note.text() and not b.save()


def test_browsing_and_saving_touch_no_dataset_file_on_the_gui_thread(qtbot, tmp_path, monkeypatch):
    """Listing, captions, thumbnails, the larger picture, the write and the recheck's copy: all in
    workers (the house rule: a dataset on a network drive never stalls the window)."""
    import builtins
    import io

    from PySide6.QtCore import QThread
    from PySide6.QtWidgets import QApplication

    on_gui: list[tuple[str, str]] = []
    seen: list[str] = []
    paused = [False]
    root = str(tmp_path / "data") + os.sep

    def wrap(name, real):
        def call(path=".", *args, **kwargs):
            p = os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else ""
            if not paused[0] and (p.startswith(root) or p == root[:-1]):
                seen.append(name)
                if QThread.currentThread() is QApplication.instance().thread():
                    on_gui.append((name, p))
            return real(path, *args, **kwargs)
        return call

    panel, data = real_panel(qtbot, tmp_path)
    for name in ("open", "stat", "lstat", "listdir", "scandir", "replace", "symlink"):
        monkeypatch.setattr(os, name, wrap(name, getattr(os, name)))
    monkeypatch.setattr(builtins, "open", wrap("builtins.open", builtins.open))
    monkeypatch.setattr(io, "open", wrap("io.open", io.open))
    with qtbot.waitSignal(panel.check_finished, timeout=60_000):
        paused[0] = True  # Check itself resolves the source it was given (the panel's, not the browser's)
        panel.check()  # a second check: the browser lists and reads the folder again
        paused[0] = False
    qtbot.waitUntil(lambda: panel.browser.model.rowCount() == 6 and not panel.busy(), timeout=30_000)
    select_finding(panel, "empty_caption")
    qtbot.waitUntil(lambda: panel.browser.detail.preview.pixmap() is not None, timeout=30_000)
    panel.browser.detail.editor.setPlainText("written off the GUI thread")
    save_and_recheck(qtbot, panel)
    with qtbot.waitSignal(panel.browser._read.done, timeout=10_000):
        panel.browser.reload()
    assert {"listdir", "stat", "open", "replace"} <= set(seen)  # the files were read and written ...
    assert on_gui == []  # ... never by the GUI thread


# ---------------------------------------------------------------- pieces

def test_captions_are_read_safely(tmp_path):
    (tmp_path / "outside.txt").write_text("secret")
    folder = tmp_path / "d"
    folder.mkdir()
    os.symlink(tmp_path / "outside.txt", folder / "link.txt")
    read = read_caption(folder / "link.txt")
    assert read.text == "" and not read.editable and "outside its folder" in read.note
    os.mkfifo(folder / "fifo.txt")
    assert not read_caption(folder / "fifo.txt").editable  # never opened: it would block
    (folder / "big.txt").write_bytes(b"x" * (2 << 20))
    assert not read_caption(folder / "big.txt").editable
    (folder / "u16.txt").write_bytes("hello".encode("utf-16"))
    read = read_caption(folder / "u16.txt")
    assert read.text == "hello" and read.reencode and "UTF-16" in read.note
    (folder / "bom.txt").write_bytes(b"\xef\xbb\xbfwith a BOM")
    read = read_caption(folder / "bom.txt")
    assert (read.text, read.note, read.editable, read.reencode) == ("with a BOM", "", True, False)
    assert read_caption(folder / "none.txt").stamp is None and read_caption(folder / "none.txt").editable


def test_a_caption_link_inside_its_folder_is_written_at_its_target(tmp_path):
    (tmp_path / "img.png").write_bytes(b"")
    (tmp_path / "shared.txt").write_text("old")
    os.symlink("shared.txt", tmp_path / "img.txt")
    read = read_caption(tmp_path / "img.txt")
    assert write_caption(str(tmp_path / "img.txt"), str(tmp_path / "img.png"), "new", read.stamp)[0] == "saved"
    assert (tmp_path / "img.txt").is_symlink() and (tmp_path / "shared.txt").read_text() == "new"
    with pytest.raises(ValueError, match="^cannot save img.txt: No such file or directory$"):  # its folder went
        write_caption(str(tmp_path / "gone" / "img.txt"), str(tmp_path / "img.png"), "x", None)
    folder = tmp_path / "img2.txt"
    folder.mkdir()
    st = os.stat(folder)
    with pytest.raises(ValueError, match="^img2.txt is not a regular file: not written$"):
        write_caption(str(folder), str(tmp_path / "img.png"), "x", (st.st_size, st.st_mtime_ns))


def _problem(category: str, severity: str, path: str) -> Problem:
    return Problem(category, severity, path, "main", f"{category} detail", ())


def test_merging_a_recheck_updates_the_counts_and_keeps_cross_file_findings():
    img, cap = "/d/a.png", "/d/a.txt"
    problems = (_problem("duplicate_exact", "warning", img), _problem("empty_caption", "error", cap),
                _problem("image_corrupt", "error", "/d/b.png"))
    report = DataReport(source="/d", batch=2, max_pixels=1, problems=problems,
                        datasets=({"id": "main", "root": "/d", "images": 2, "usable": 0, "captions": 1},),
                        counts={"empty_caption": 1, "image_corrupt": 1, "duplicate_exact": 1, "caption_multiline": 0},
                        images=2, usable=0, errors=2, warnings=1,
                        buckets=({"width": 64, "height": 64, "images": 2, "usable": 0, "full_batches": 0},),
                        clean=False)
    found = Recheck(img, cap, "main", (_problem("caption_multiline", "warning", cap),), (64, 64))
    after = merge_recheck(report, found)
    assert [p.category for p in after.problems] == ["duplicate_exact", "caption_multiline", "image_corrupt"]
    assert after.counts == {"empty_caption": 0, "image_corrupt": 1, "duplicate_exact": 1, "caption_multiline": 1}
    assert (after.errors, after.warnings, after.usable, after.clean) == (1, 2, 1, False)
    assert after.datasets[0]["usable"] == 1 and after.datasets[0]["captions"] == 2
    assert after.buckets[0]["usable"] == 1 and after.buckets[0]["full_batches"] == 0
    again = merge_recheck(after, found)  # the same answer twice changes nothing more
    assert again.counts == after.counts and again.usable == 1 and again.datasets == after.datasets


# ---------------------------------------------------------------- layout

def test_the_data_tab_with_the_browser_fits_both_window_sizes(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    data = _dataset(tmp_path / "data")
    w = MainWindow(QSettings(str(tmp_path / "s.ini"), QSettings.IniFormat), runs_root=tmp_path / "runs",
                   load_nvml=no_nvml, unsaved_dir=tmp_path / "unsaved", probes_dir=tmp_path / "probes")
    qtbot.addWidget(w)
    w.resize(*LAYOUT_SIZES[0])
    w.show()
    w.show_panel("Data")
    w.data.source_edit.setText(str(data))
    run_check(qtbot, w.data)
    qtbot.waitUntil(lambda: w.data.browser.model.rowCount() == 6, timeout=30_000)
    select_finding(w.data, "caption_not_utf8")
    for size in LAYOUT_SIZES:
        w.resize(*size)
        settle(200)
        assert window_problems(w, size, on_screen=False) == [], size
        assert widget_problems(w, "Data") == [], size
        b = w.data.browser
        assert b.view.height() >= b.view.gridSize().height() and b.detail.editor.height() >= 40, size
        assert b.detail.save.isVisible() and b.detail.save.height() > 0
        w.data.pages.setCurrentIndex(1)  # the bucket plot, on the page beside the findings
        settle(100)
        assert widget_problems(w, "Data / Buckets") == [], size
        w.data.pages.setCurrentIndex(0)
    w.training._clear()


def test_the_dataset_is_browsed_and_a_caption_saved_before_any_check(qtbot, tmp_path):
    data = _dataset(tmp_path / "data")
    panel = DataPanel(cache=ThumbCache(tmp_path / "thumbs", px=48))
    qtbot.addWidget(panel)
    panel.set_config({"identity": {"train_data_dir": "data"}, "resources": {"resolution": 64}}, tmp_path)
    panel.resize(1100, 760)
    panel.show()
    qtbot.waitUntil(lambda: panel.browser.model.rowCount() == 6, timeout=30_000)  # no check has run
    assert "f_fine.png" in names(panel) and panel._report is None
    b = panel.browser
    b.view.setCurrentIndex(b.proxy.index(names(panel).index("b_empty.png"), 0))
    b.detail.editor.setPlainText("a grey square")
    save_and_recheck(qtbot, panel)
    assert (data / "b_empty.txt").read_text(encoding="utf-8") == "a grey square" and leftovers(data) == []
    assert "rechecking" not in b.detail.note.text().lower()  # the save ends; findings come with a check
