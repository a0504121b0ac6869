"""Training's data checks (dmad.data.scan, dmad.data.loading): the header scan, the one-line refusal of
too few usable images, and the deterministic replacement of items that fail on load."""
from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from dmad.data.scan import TRAIN_MIN_SIZE, check_image_item, require_batch, scan_folder
from dmad.errors import UserInputError


def _png(path: Path, size: int = 32, seed: int = 0) -> Path:
    from PIL import Image

    rng = random.Random(seed)
    Image.frombytes("RGB", (size, size), bytes(rng.randrange(256) for _ in range(size * size * 3))).save(path)
    return path


def _pair(folder: Path, stem: str, caption: str | bytes | None = "a caption", size: int = 32, seed: int = 0) -> Path:
    img = _png(folder / f"{stem}.png", size, seed)
    if isinstance(caption, str):
        (folder / f"{stem}.txt").write_text(caption, encoding="utf-8")
    elif caption is not None:
        (folder / f"{stem}.txt").write_bytes(caption)
    return img


def _truncate(path: Path) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


@pytest.fixture
def corpus(tmp_path) -> Path:
    folder = tmp_path / "data"
    folder.mkdir()
    _pair(folder, "a_good")
    _pair(folder, "b_empty", " \n\t")
    _pair(folder, "c_latin1", "caf\xe9".encode("latin-1"))
    _pair(folder, "d_nocaption", None)
    (folder / "e_garbage.png").write_bytes(b"\x89PNG but not really")
    (folder / "e_garbage.txt").write_text("garbage")
    _pair(folder, "f_tiny", size=TRAIN_MIN_SIZE - 1)
    _pair(folder, "g_twin")
    _png(folder / "g_twin.jpg")
    _truncate(_pair(folder, "h_truncated", seed=3))  # the header is intact: only decoding finds it
    _pair(folder, "i_multiline", "two\nlines")  # a warning, not an error: usable
    return folder


def test_scan_keeps_usable_pairs_in_order_and_names_each_problem(corpus):
    data = scan_folder(corpus, workers=3, resolution=32)
    assert [p[0].name for p in data.pairs] == ["a_good.png", "h_truncated.png", "i_multiline.png"]
    assert all(cap == img.with_suffix(".txt") for img, cap in data.pairs)
    assert {(Path(s.path).name, s.category) for s in data.skipped} == {
        ("b_empty.txt", "empty_caption"), ("c_latin1.txt", "caption_not_utf8"),
        ("d_nocaption.png", "image_without_caption"), ("e_garbage.png", "image_corrupt"),
        ("f_tiny.png", "image_too_small"), ("g_twin.png", "stem_two_images"), ("g_twin.jpg", "stem_two_images")}
    assert data.images == 10 and all(s.detail for s in data.skipped)
    assert check_image_item(corpus / "f_tiny.png", "textfile", min_size=1)[0] is None


def test_usable_images_in_buckets_smaller_than_a_batch_are_named(tmp_path):
    folder = tmp_path / "d"
    folder.mkdir()
    for i in range(3):
        _pair(folder, f"square_{i}", size=32)
    for i in range(2):
        img = folder / f"wide_{i}.png"
        from PIL import Image

        Image.new("RGB", (64, 32), (i, 50, 90)).save(img)
        (folder / f"wide_{i}.txt").write_text("a wide one")
    from dmad.data.scan import scan_entry
    from dmad.contract.datasets import DatasetEntry

    data = scan_entry(DatasetEntry(id="d", instance_data_dir=str(folder), bucket_step=8), 32, train_batch=3)
    assert [it.image.name for it in data.items] == ["square_0.png", "square_1.png", "square_2.png"]
    assert {s.category for s in data.skipped} == {"bucket_too_small"}
    with pytest.raises(UserInputError, match=r"5 usable images, but only 3 in buckets that hold a batch "
                                             r"\(train_batch_size\): 2 sit in 1 smaller bucket\(s\), fewer than one "
                                             r"effective batch of 4"):
        require_batch(data, 4)


def test_pixel_limit_is_refused_from_the_header(tmp_path):
    img = _pair(tmp_path, "big", size=64)
    skip, _ = check_image_item(img, "textfile", TRAIN_MIN_SIZE, max_pixels=64 * 64 - 1)
    assert skip is not None and skip.category == "pixel_limit_exceeded"


def test_too_few_usable_images_is_one_line_with_the_reasons(corpus):
    data = scan_folder(corpus, resolution=32)
    require_batch(data, 3)
    with pytest.raises(UserInputError) as exc:
        require_batch(data, 4)
    assert str(exc.value) == (
        f"train_data_dir {corpus}: 3 usable images, fewer than one effective batch of 4 (7 unusable: "
        f"2 stem_two_images, 1 caption_not_utf8, 1 empty_caption, 1 image_corrupt, 1 image_too_small, "
        f"1 image_without_caption; run `dmad check-data {corpus} --min-size {TRAIN_MIN_SIZE}` for the paths)")


torch = pytest.importorskip("torch")


def _dataset(corpus: Path, batch: int = 1):
    from dmad.data.loading import MixedImages, load_datasets

    sets, groups = load_datasets(corpus, resolution=32, train_batch=batch, effective_batch=batch)
    return MixedImages(sets, groups, seed=0, source=corpus), groups


def test_an_item_that_fails_on_load_is_replaced_by_the_next(corpus):
    ds, _ = _dataset(corpus)
    got = ds[1, 0]  # h_truncated: its pixel data stops half way
    good = ds[2, 0]
    assert torch.equal(got.pixels, good.pixels) and got.caption == good.caption == "two lines" and good.skips == ()
    assert [(Path(s.path).name, s.category) for s in got.skips] == [("h_truncated.png", "image_corrupt")]
    assert "truncated" in got.skips[0].detail
    assert torch.equal(ds[1, 5].pixels, got.pixels)  # the same replacement every time


def test_files_that_break_after_the_scan_are_skipped_with_their_category(corpus):
    ds, _ = _dataset(corpus)
    (corpus / "a_good.txt").unlink()
    got = ds[0, 0]
    assert got.caption == "two lines" and [(Path(s.path).name, s.category) for s in got.skips] == [
        ("a_good.png", "image_without_caption"), ("h_truncated.png", "image_corrupt")]
    (corpus / "i_multiline.txt").write_text("   ")
    (corpus / "a_good.txt").write_bytes(b"caf\xe9")
    with pytest.raises(UserInputError, match="no image of a 32x32 bucket of .* loads any more .*i_multiline.txt: "
                                             "empty_caption"):
        ds[2, 0]
    (corpus / "i_multiline.txt").write_text("fine again")
    assert [s.category for s in ds[0, 0].skips] == ["caption_not_utf8", "image_corrupt"]


def test_worker_processes_carry_the_skips(corpus):
    from dmad.data.loading import make_loader
    from dmad.data.mixing import MixtureBatches

    ds, groups = _dataset(corpus, batch=3)
    runs = []
    for workers in (0, 1):
        loader = iter(make_loader(ds, MixtureBatches(groups, 3, seed=0), workers))
        runs.append([next(loader) for _ in range(2)])
    for a, b in zip(*runs):
        assert torch.equal(a.pixels, b.pixels) and a.captions == b.captions and a.skips == b.skips
    assert sum(len(b.skips) for b in runs[0]) == 2  # two passes, each meets h_truncated once


def test_training_refuses_too_few_usable_images_before_loading_models(write_config, tmp_path, corpus, capsys):
    from dmad.contract.config import load_config
    from dmad.contract.events import parse_line
    from dmad.train.loop import run_training

    cfg = load_config(write_config({"identity": {"train_data_dir": str(corpus)},
                                    "resources": {"train_batch_size": 4}}))
    run = tmp_path / "run"
    with pytest.raises(UserInputError, match=r"3 usable images, fewer than one effective batch of 4 \(7 unusable: "):
        run_training(cfg, run_dir=run, resume=None, argv=["dmad", "train"])
    events = [e for e in map(parse_line, capsys.readouterr().out.splitlines()) if e is not None]
    assert [e.kind for e in events] == ["started"]  # the event stream the app read: no phase "loading"
    assert not run.exists()  # a fresh start refused before it committed leaves no folder behind


def test_the_second_scan_of_a_run_reuses_the_first_unless_the_folder_changed(corpus, monkeypatch):
    from dmad.data import scan as data_checks
    from dmad.contract.datasets import load_dataset_list

    calls = []
    real = data_checks.scan_entry
    monkeypatch.setattr(data_checks, "scan_entry", lambda *a, **k: calls.append(a) or real(*a, **k))
    monkeypatch.setattr(data_checks, "_last_scan", {})
    entries = load_dataset_list(corpus)
    first = data_checks.scan_datasets(entries, 32, 1)
    assert data_checks.scan_datasets(entries, 32, 1) is first and len(calls) == 1  # preflight, then the session
    data_checks.scan_datasets(entries, 16, 1)
    assert len(calls) == 2  # other inputs: scanned again
    _pair(corpus, "z_new")  # a file added: the folder's mtime moved
    os.utime(corpus, ns=(corpus.stat().st_atime_ns, corpus.stat().st_mtime_ns + 10**9))
    again = data_checks.scan_datasets(entries, 16, 1)
    assert len(calls) == 3 and "z_new.png" in {it.image.name for it in again[0].items}
