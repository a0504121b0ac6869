"""Training's data checks (dmad.data_checks, dmad.data): the header scan, the one-line refusal of
too few usable images, and the deterministic replacement of items that fail on load."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from dmad.data_checks import TRAIN_MIN_SIZE, check_pair, require_batch, scan_folder
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
    data = scan_folder(corpus, workers=3)
    assert [p[0].name for p in data.pairs] == ["a_good.png", "h_truncated.png", "i_multiline.png"]
    assert all(cap == img.with_suffix(".txt") for img, cap in data.pairs)
    assert {(Path(s.path).name, s.category) for s in data.skipped} == {
        ("b_empty.txt", "empty_caption"), ("c_latin1.txt", "caption_not_utf8"),
        ("d_nocaption.png", "image_without_caption"), ("e_garbage.png", "image_corrupt"),
        ("f_tiny.png", "image_too_small"), ("g_twin.png", "stem_two_images"), ("g_twin.jpg", "stem_two_images")}
    assert data.images == 10 and all(s.detail for s in data.skipped)
    assert check_pair(corpus / "f_tiny.png", min_size=1) is None


def test_pixel_limit_is_refused_from_the_header(tmp_path):
    img = _pair(tmp_path, "big", size=64)
    skip = check_pair(img, max_pixels=64 * 64 - 1)
    assert skip is not None and skip.category == "pixel_limit_exceeded"


def test_too_few_usable_images_is_one_line_with_the_reasons(corpus):
    data = scan_folder(corpus)
    require_batch(data, 3)
    with pytest.raises(UserInputError) as exc:
        require_batch(data, 4)
    assert str(exc.value) == (
        f"train_data_dir {corpus}: 3 usable images, fewer than one effective batch of 4 (7 unusable: "
        f"2 stem_two_images, 1 caption_not_utf8, 1 empty_caption, 1 image_corrupt, 1 image_too_small, "
        f"1 image_without_caption; run `dmad check-data {corpus} --min-size {TRAIN_MIN_SIZE}` for the paths)")


torch = pytest.importorskip("torch")


def test_an_item_that_fails_on_load_is_replaced_by_the_next(corpus):
    from dmad.data import CaptionedImages

    ds = CaptionedImages(scan_folder(corpus).pairs, resolution=16, folder=corpus)
    image, caption, skips = ds[1]  # h_truncated: its pixel data stops half way
    good, good_caption, none = ds[2]
    assert torch.equal(image, good) and caption == good_caption == "two lines" and none == ()
    assert [(Path(s.path).name, s.category) for s in skips] == [("h_truncated.png", "image_corrupt")]
    assert "truncated" in skips[0].detail
    assert torch.equal(ds[1][0], image)  # the same replacement every time


def test_files_that_break_after_the_scan_are_skipped_with_their_category(corpus):
    from dmad.data import CaptionedImages

    ds = CaptionedImages(scan_folder(corpus).pairs, resolution=16, folder=corpus)
    (corpus / "a_good.txt").unlink()
    image, caption, skips = ds[0]
    assert caption == "two lines" and [(Path(s.path).name, s.category) for s in skips] == [
        ("a_good.png", "image_without_caption"), ("h_truncated.png", "image_corrupt")]
    (corpus / "i_multiline.txt").write_text("   ")
    (corpus / "a_good.txt").write_bytes(b"caf\xe9")
    with pytest.raises(UserInputError, match="no image of .* loads any more .*i_multiline.txt: empty_caption"):
        ds[2]
    (corpus / "i_multiline.txt").write_text("fine again")
    assert [s.category for s in ds[0][2]] == ["caption_not_utf8", "image_corrupt"]


def test_worker_processes_carry_the_skips(corpus):
    from dmad.data import CaptionedImages, ResumableBatches, make_loader

    ds = CaptionedImages(scan_folder(corpus).pairs, resolution=16, folder=corpus)
    runs = []
    for workers in (0, 1):
        loader = iter(make_loader(ds, ResumableBatches(len(ds), 3, seed=0), workers))
        runs.append([next(loader) for _ in range(2)])
    for (img0, cap0, skip0), (img1, cap1, skip1) in zip(*runs):
        assert torch.equal(img0, img1) and cap0 == cap1 and skip0 == skip1
    assert sum(len(b[2]) for b in runs[0]) == 2  # two epochs, each meets h_truncated once


def test_training_refuses_too_few_usable_images_before_loading_models(write_config, tmp_path, corpus):
    from dmad.config import load_config
    from dmad.events import read_events
    from dmad.train import run_training

    cfg = load_config(write_config({"identity": {"train_data_dir": str(corpus)},
                                    "resources": {"train_batch_size": 4}}))
    run = tmp_path / "run"
    with pytest.raises(UserInputError, match="3 usable images, fewer than one effective batch of 4"):
        run_training(cfg, run_dir=run, resume=None, argv=["dmad", "train"])
    phases = [e.data["phase"] for e in read_events(run / "events.jsonl") if e.kind == "phase"]
    assert "loading" not in phases
    assert [e.kind for e in read_events(run / "events.jsonl")][-1] == "error"
