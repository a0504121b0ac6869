"""Datasets in training: dataset lists, probability/repeats mixing and aspect
buckets, tested statistically; crops, EXIF, transparency, caption strategies and normalisation."""
from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from dmad.data.buckets import crop_box, training_bucket
from dmad.contract.datafiles import normalize_caption
from dmad.errors import UserInputError
from dmad.data.mixing import Group, MixtureBatches, make_groups

torch = pytest.importorskip("torch")


def _z(observed: int, n: int, p: float) -> float:
    """Binomial z-score of `observed` successes in n draws of chance p."""
    return (observed - n * p) / math.sqrt(n * p * (1 - p))


def _groups() -> list[Group]:
    # dataset 0: 100 images (60 in bucket A, 40 in B), probability 1, repeats 0 -> weight 100
    # dataset 1: 50 images in one bucket, probability 0.5, repeats 1 -> weight 0.5 * 2 * 50 = 50
    a, b, c = list(range(60)), list(range(60, 100)), list(range(100, 150))
    return make_groups([[((64, 32), a), ((32, 64), b)], [((48, 48), c)]], [1.0, 0.5 * 2])


def test_batches_are_drawn_by_probability_repeats_and_bucket_size():
    sampler = MixtureBatches(_groups(), batch_size=4, seed=3)
    n = 6000
    it = iter(sampler)
    per_group = Counter()
    for _ in range(n):
        batch = next(it)
        groups = {next(k for k, g in enumerate(sampler.groups) if i in g.items) for i, _ in batch}
        assert len(groups) == 1  # every batch is one bucket of one dataset
        per_group[groups.pop()] += 1
    share = {(64, 32): 60 / 150, (32, 64): 40 / 150, (48, 48): 50 / 150}  # by bucket
    expected = {k: share[g.bucket] for k, g in enumerate(sampler.groups)}
    for g, p in expected.items():
        assert abs(_z(per_group[g], n, p)) < 4.5, (g, per_group[g], n * p)
    # chi-square with 2 degrees of freedom: 13.8 is the 0.1% quantile
    chi2 = sum((per_group[g] - n * p) ** 2 / (n * p) for g, p in expected.items())
    assert chi2 < 13.8


def test_probability_zero_and_equal_weights():
    groups = make_groups([[((8, 8), [0, 1])], [((8, 8), [2, 3])]], [0.0, 1.0])
    assert [g.dataset for g in groups] == [1]
    it = iter(MixtureBatches(groups, 2, seed=0))
    assert all({i for i, _ in next(it)} == {2, 3} for _ in range(20))


def test_each_pass_over_a_group_shows_every_image_once():
    groups = make_groups([[((8, 8), list(range(12)))]], [1.0])
    it = iter(MixtureBatches(groups, 4, seed=1))
    seen = [i for _ in range(9) for i, _ in next(it)]  # 36 = three passes of 12
    for k in range(3):
        assert sorted(seen[12 * k:12 * (k + 1)]) == list(range(12))
    assert seen[:12] != seen[12:24]  # a fresh order each pass


def test_resume_and_ranks_see_the_same_batches():
    groups = _groups()
    whole = iter(MixtureBatches(groups, 4, seed=7))
    stream = [next(whole) for _ in range(40)]
    resumed = iter(MixtureBatches(groups, 4, seed=7, consumed=25))
    assert [next(resumed) for _ in range(15)] == stream[25:]
    ranks = [iter(MixtureBatches(groups, 4, seed=7, rank=r, world=2, consumed=5)) for r in (0, 1)]
    for b in range(5, 20):
        for r in (0, 1):
            assert next(ranks[r]) == stream[2 * b + r]  # global batch b * world + rank
    positions = [pos for batch in stream for _, pos in batch]
    assert positions == list(range(160))  # sample positions: unique, in order (per-sample noise seeds)


def test_a_bucket_smaller_than_a_batch_is_refused():
    with pytest.raises(ValueError, match="fewer than a batch"):
        MixtureBatches(make_groups([[((8, 8), [0, 1])]], [1.0]), 3, seed=0)


@pytest.mark.parametrize("w,h", [(512, 512), (1024, 256), (300, 700), (640, 480), (100, 90), (4000, 3000)])
def test_buckets_never_upscale_and_respect_the_step(w, h):
    for rtype in ("pixel_area", "pixel"):
        for square in (False, True):
            for rounding in ("nearest", "down"):
                bw, bh = training_bucket(w, h, 512, 64, rtype, square, rounding)
                assert bw <= w and bh <= h
                if min(bw, bh) >= 64:
                    assert bw % 64 == 0 and bh % 64 == 0
                if square:
                    assert bw == bh
    # 4000 x 3000 scaled to 512 * 512 pixels is 591 x 443: nearest keeps the aspect, down crops more
    assert training_bucket(4000, 3000, 512, 64) == (576, 448)
    assert training_bucket(4000, 3000, 512, 64, rounding="down") == (576, 384)
    assert training_bucket(4000, 3000, 512, 64, "pixel") == (704, 512)  # shorter side 512: 683 x 512
    assert training_bucket(500, 500, 512, 64) == (448, 448)  # 500 would round to 512: past the image


def test_crop_boxes():
    size, box = crop_box(400, 200, (128, 128), crop=True, style="center")
    assert size == (256, 128) and box == (64, 0, 192, 128)
    assert crop_box(400, 200, (128, 128), True, "corner")[1] == (0, 0, 128, 128)
    rnd = [crop_box(400, 200, (128, 128), True, "random", key=k)[1] for k in range(50)]
    assert all(0 <= b[0] <= 128 and b[2] - b[0] == 128 for b in rnd) and len({b[0] for b in rnd}) > 10
    assert crop_box(400, 200, (128, 64), crop=False, style="center") == ((128, 64), (0, 0, 128, 64))


def test_caption_normalisation_is_explicit():
    assert normalize_caption("a red\tcircle \n\n  on grey  \r\n") == "a red circle on grey"
    assert normalize_caption("first line\nsecond", "first") == "first line"
    assert normalize_caption("one\ntwo\nthree", "random", pick=4) == "two"
    assert normalize_caption(" \n\t ") == ""


# ---------------------------------------------------------------- real folders


def _image(path: Path, w: int, h: int, seed: int = 0, mode: str = "RGB") -> Path:
    rng = np.random.default_rng(seed)
    arr = rng.integers(0, 256, (h, w, 4 if mode == "RGBA" else 3), dtype=np.uint8)
    Image.fromarray(arr, mode).save(path)
    return path


def _folder(root: Path, sizes: list[tuple[int, int]], prefix: str = "img", caption: str | None = "a photo") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i, (w, h) in enumerate(sizes):
        _image(root / f"{prefix}_{i:03d}.png", w, h, seed=i)
        if caption is not None:
            (root / f"{prefix}_{i:03d}.txt").write_text(f"{caption} {i}", encoding="utf-8")
    return root


def _list(path: Path, entries: list[dict]) -> Path:
    path.write_text(json.dumps(entries), encoding="utf-8")
    return path


def _open(source: Path, batch: int, resolution: int = 32):
    from dmad.data.loading import MixedImages, load_datasets

    sets, groups = load_datasets(source, resolution, batch, batch)
    return MixedImages(sets, groups, seed=0, source=source), groups, sets


def test_a_dataset_list_trains_in_buckets(tmp_path):
    from dmad.data.loading import make_loader

    wide = _folder(tmp_path / "wide", [(64, 32)] * 6 + [(40, 40)] * 4)
    tall = _folder(tmp_path / "tall", [(32, 64)] * 5, prefix="t")
    source = _list(tmp_path / "data.json", [
        {"id": "wide", "instance_data_dir": "wide", "bucket_step": 8, "crop": True},
        {"id": "tall", "instance_data_dir": str(tall), "bucket_step": 8, "repeats": 2, "resolution_type": "pixel"}])
    ds, groups, sets = _open(source, batch=2)
    assert {(sets[g.dataset].entry.id, g.bucket, len(g.items)) for g in groups} == {
        ("wide", (48, 24), 6), ("wide", (32, 32), 4), ("tall", (32, 64), 5)}
    assert sorted(g.weight for g in groups) == [4.0, 6.0, 15.0]
    loader = iter(make_loader(ds, MixtureBatches(groups, 2, seed=0), 0))
    shapes = Counter()
    for _ in range(60):
        b = next(loader)
        assert b.pixels.shape[0] == 2 and len(b.captions) == 2 and not b.skips
        assert float(b.pixels.min()) >= -1 and float(b.pixels.max()) <= 1
        shapes[tuple(b.pixels.shape[2:])] += 1
    assert set(shapes) == {(24, 48), (32, 32), (64, 32)}  # (H, W) of each bucket
    assert shapes[(64, 32)] > shapes[(32, 32)]  # tall: 5 images x 3 (repeats 2) outweighs 4
    assert wide.is_dir()


def test_small_images_are_skipped_not_upscaled(tmp_path):
    folder = _folder(tmp_path / "d", [(32, 32)] * 3 + [(20, 20), (31, 64)])
    source = _list(tmp_path / "d.json", [{"id": "d", "instance_data_dir": "d", "minimum_image_size": 24}])
    ds, groups, sets = _open(source, batch=1)
    assert [it.image.name for it in sets[0].items] == ["img_000.png", "img_001.png", "img_002.png"]
    why = {Path(s.path).name: s for s in sets[0].skipped}
    assert why["img_003.png"].category == "image_too_small" and "below 24" in why["img_003.png"].detail
    # 31 x 64 is above the minimum but its bucket (24 x ...) would fall below the 32 px step
    assert why["img_004.png"].category == "image_too_small" and "never upscaled" in why["img_004.png"].detail
    assert folder.is_dir()


def test_caption_strategies_and_lines(tmp_path):
    _folder(tmp_path / "names", [(32, 32)] * 2, prefix="a_red-circle", caption=None)
    _folder(tmp_path / "inst", [(32, 32)] * 2, caption=None)
    multi = _folder(tmp_path / "multi", [(32, 32)] * 2, caption=None)
    for i in range(2):
        (multi / f"img_{i:03d}.txt").write_bytes("\ufeffcaption one\n\ncaption\ttwo\n".encode("utf-8"))
    source = _list(tmp_path / "l.json", [
        {"id": "names", "instance_data_dir": "names", "caption_strategy": "filename"},
        {"id": "inst", "instance_data_dir": "inst", "caption_strategy": "instanceprompt",
         "instance_prompt": "  a  photo of sks\n"},
        {"id": "multi", "instance_data_dir": "multi", "caption_lines": "random"}])
    ds, _, _ = _open(source, batch=1)
    assert ds.caption(0, 0) == "a red circle 000"
    assert ds.caption(2, 0) == "a photo of sks"
    picks = {ds.caption(4, pos) for pos in range(40)}
    assert picks == {"caption one", "caption two"}
    assert ds.caption(4, 17) == ds.caption(4, 17)  # a pure function of the sample position
    assert ds.all_captions(4) == ["caption one", "caption two"]


def test_images_load_upright_and_transparent_pixels_are_white(tmp_path):
    from dmad.data.loading import load_image

    folder = tmp_path / "x"
    folder.mkdir()
    im = Image.new("RGB", (64, 32), (255, 0, 0))
    im.paste((0, 0, 255), (0, 0, 32, 32))  # left half blue
    exif = Image.Exif()
    exif[0x0112] = 6  # stored sideways: shown turned 90 degrees clockwise
    im.save(folder / "turned.jpg", exif=exif, quality=95)
    t = load_image(folder / "turned.jpg", (32, 64), crop=False)  # upright: 32 wide, 64 tall
    assert tuple(t.shape) == (3, 64, 32)
    top, bottom = t[:, 8, 16], t[:, 56, 16]
    assert top[2] > 0.8 and top[0] < -0.5 and bottom[0] > 0.8  # blue on top after the turn
    clear = Image.new("RGBA", (32, 32), (0, 0, 0, 0))
    clear.save(folder / "clear.png")
    assert float(load_image(folder / "clear.png", (32, 32)).min()) == 1.0
    source = _list(tmp_path / "t.json", [{"id": "t", "instance_data_dir": "x", "caption_strategy": "filename",
                                                    "bucket_step": 8}])
    _, _, sets = _open(source, batch=1, resolution=64)
    assert {it.image.name: it.size for it in sets[0].items}["turned.jpg"] == (32, 64)


def test_bad_dataset_lists_are_one_line(tmp_path):
    from dmad.contract.datasets import load_dataset_list

    (tmp_path / "d").mkdir()
    cases = [
        ([{"id": "a", "instance_data_dir": "d", "probability": 0}], "every dataset has probability 0"),
        ([{"id": "a", "instance_data_dir": "d", "bucket_step": 12}], "entry 0 'bucket_step'"),
        ([{"id": "a", "instance_data_dir": "d", "caption_lines": "all"}], "entry 0 'caption_lines'"),
        ([{"id": "a", "instance_data_dir": "missing"}], "instance_data_dir is not a folder"),
    ]
    for raw, msg in cases:
        with pytest.raises(UserInputError, match=msg) as exc:
            load_dataset_list(_list(tmp_path / "bad.json", raw))
        assert "\n" not in str(exc.value)
