"""The shipped shapes evaluator and the demo's metrics (CPU, ~15 s)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from dmad.demo import shapes
from dmad.demo.evaluator import (ATTRIBUTES, HELDOUT_DATA_SEED, TRAIN_DATA_SEED, ShapesClassifier, default_path,
                                 load_evaluator, real_attrs_for_captions, render_real, render_real_attrs, to_unit,
                                 train_evaluator, vocabulary)
from dmad.demo.metrics import (adherence, diversity, evaluate_images, feature_stats, frechet_distance,
                               frechet_distance_from_stats, parse_caption)
from dmad.errors import UserInputError

FRESH_SEED = 31337  # neither the shipped dataset's (0) nor the evaluator's training or held-out seeds


@pytest.fixture(scope="module")
def evaluator() -> ShapesClassifier:
    return load_evaluator()


@pytest.fixture(scope="module")
def fresh():
    """300 real renders the evaluator has never seen, as the bench would pass them."""
    images, attrs = render_real(range(300), FRESH_SEED)
    return to_unit(images), attrs


def test_shipped_files_are_complete_and_small():
    folder = default_path()
    cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    report = json.loads((folder / "report.json").read_text(encoding="utf-8"))
    assert (folder / "evaluator.safetensors").stat().st_size < 2 * 1024 * 1024
    assert cfg["vocab"] == vocabulary()
    assert report["n"] >= 2000 and min(report["per_attribute"].values()) >= 0.99
    assert len((folder / "training_log.jsonl").read_text(encoding="utf-8").splitlines()) > 10
    assert FRESH_SEED not in (0, TRAIN_DATA_SEED, HELDOUT_DATA_SEED)


def test_shipped_evaluator_reads_fresh_real_renders(evaluator, fresh):
    images, attrs = fresh
    result = evaluate_images(evaluator, images, [shapes.caption(a) for a in attrs])
    per = result["adherence"]["per_attribute"]
    assert min(per.values()) >= 0.99, per
    assert result["adherence"]["all"] >= 0.95
    assert result["features"].shape == (300, evaluator.feature_dim)
    assert sum(result["correct"]) == round(result["adherence"]["all"] * 300)


def test_other_sizes_are_resized(evaluator, fresh):
    images, attrs = fresh
    big = torch.nn.functional.interpolate(images[:100], size=128, mode="nearest")  # the same picture, 2x
    assert adherence(evaluator.predict(big), attrs[:100])["all"] >= 0.95


def test_load_refuses_missing_files(tmp_path):
    with pytest.raises(UserInputError, match="missing"):
        load_evaluator(tmp_path)


def test_parse_caption_inverts_caption():
    for seed in (0, 7, FRESH_SEED):
        for i in range(300):
            a = shapes.attributes_for(i, seed)
            assert parse_caption(shapes.caption(a)) == {k: a[k] for k in ATTRIBUTES}
    every = {"shape": "diamond", "colour": "purple", "size": "small", "position": "center", "background": "white"}
    assert parse_caption(shapes.caption(every) + "\n") == every


@pytest.mark.parametrize("garbage", [
    "", "a red", "red circle", "a shape shape", "a circle shape", "a red circle on black",
    "a small red circle at the top left on a black", "a huge red circle in the center on a black background",
    "a small red circle at the center on a black background", "a small red cross in the center on a black background",
    "a small pink circle in the center on a black background",
    "A small red circle in the center on a black background", "a small red circle in the center on a black background!"])
def test_parse_caption_rejects_garbage(garbage):
    with pytest.raises(ValueError, match="not a shapes caption"):
        parse_caption(garbage)


@pytest.mark.parametrize("caption, stated", [
    ("a red shape", {"colour": "red"}), ("a large circle", {"size": "large", "shape": "circle"}),
    ("a shape on a white background", {"background": "white"}), ("a shape", {}),
    ("a small blue triangle in the center", {"size": "small", "colour": "blue", "shape": "triangle", "position": "center"}),
    ("a square at the top left", {"shape": "square", "position": "top left"})])
def test_parse_caption_reads_what_an_under_specified_caption_states(caption, stated):
    assert parse_caption(caption) == stated


def test_every_stated_subset_round_trips():
    from dmad.demo.shapes import ATTRIBUTES, attributes_for, caption
    from itertools import combinations

    attrs = attributes_for(3, 0)
    for n in range(len(ATTRIBUTES) + 1):
        for stated in combinations(ATTRIBUTES, n):
            assert parse_caption(caption(attrs, stated)) == {k: attrs[k] for k in stated}


def test_adherence_scores_only_what_a_caption_states():
    from dmad.demo.metrics import adherence

    pred = [{"shape": "circle", "colour": "red", "size": "small", "position": "center", "background": "black"}] * 2
    res = adherence(pred, [{"colour": "red"}, {"colour": "blue", "shape": "circle"}])
    assert res["all"] == 0.5 and res["per_attribute"] == {"shape": 1.0, "colour": 0.5}


def test_frechet_distance_zero_for_identical_sets_and_symmetric():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(500, 16, generator=g)
    b = torch.randn(400, 16, generator=g) * 1.5 + 0.3
    assert frechet_distance(a, a) == pytest.approx(0.0, abs=1e-8)
    assert frechet_distance(a, b) == pytest.approx(frechet_distance(b, a), rel=1e-8)
    assert frechet_distance(a, b) > 1.0


def test_frechet_distance_matches_the_1d_formula():
    a = np.array([0.0, 1.0, 2.0, 5.0])[:, None]
    b = np.array([3.0, -1.0, 4.0, 10.0, 7.0])[:, None]
    m1, m2, s1, s2 = a.mean(), b.mean(), a.std(ddof=1), b.std(ddof=1)
    assert frechet_distance(a, b) == pytest.approx((m1 - m2) ** 2 + (s1 - s2) ** 2, rel=1e-10)


def test_the_bootstrap_interval_brackets_the_fd_and_separates_a_real_gap():
    from dmad.demo.metrics import fd_interval

    g = torch.Generator().manual_seed(2)
    ref = feature_stats(torch.randn(4000, 8, generator=g))
    same, shifted = torch.randn(500, 8, generator=g), torch.randn(500, 8, generator=g) + 0.5
    lo, hi = fd_interval(same, *ref, n_boot=100)
    lo_s, hi_s = fd_interval(shifted, *ref, n_boot=100)
    fd_same = frechet_distance_from_stats(*feature_stats(same), *ref)
    assert 0 <= lo < fd_same < hi and hi - fd_same == pytest.approx(fd_same - lo)  # centred on the estimate
    assert hi < lo_s and lo_s <= 8 * 0.25 <= hi_s * 1.5  # the shift's true FD (|0.5 * ones(8)|^2 = 2) is told apart
    assert fd_interval(same, *ref, n_boot=100) == (lo, hi)  # seeded: the same interval every time


def test_the_bootstrap_interval_is_the_spread_of_one_fd_per_resample():
    """fd_interval's batched trace term (eigenvalues of R S_b R, R the reference's root) against the
    plain definition: an FD per resample, the same seeded resamples, spread x 1.96 either side."""
    from statistics import NormalDist

    from dmad.demo.metrics import fd_interval

    g = torch.Generator().manual_seed(5)
    ref = feature_stats(torch.randn(300, 16, generator=g) * torch.linspace(0.2, 2.0, 16))  # an uneven reference
    feats = (torch.randn(37, 16, generator=g) + 0.3).double().numpy()
    rng = np.random.default_rng(3)
    fds = [frechet_distance_from_stats(*feature_stats(feats[rng.integers(0, 37, 37)]), *ref) for _ in range(60)]
    half = NormalDist().inv_cdf(0.975) * np.std(fds, ddof=1)
    fd = frechet_distance_from_stats(*feature_stats(feats), *ref)
    lo, hi = fd_interval(feats, *ref, n_boot=60, seed=3, chunk=7)  # a chunk that does not divide n_boot
    assert (lo, hi) == pytest.approx((fd - half, fd + half), rel=1e-9)


def test_the_paired_difference_is_the_spread_of_one_fd_difference_per_shared_resample():
    """fd_difference_interval against its definition: the same seeded item indices resample both
    rows, the FD difference of each resample, its spread x 1.96 either side of the estimate; the
    adherence difference from the same resamples."""
    from statistics import NormalDist

    from dmad.demo.metrics import fd_difference_interval

    g = torch.Generator().manual_seed(7)
    ref = feature_stats(torch.randn(300, 6, generator=g))
    a = torch.randn(41, 6, generator=g).double().numpy()
    b = a + 0.2 * torch.randn(41, 6, generator=g).double().numpy() + 0.3
    ca, cb = [i % 3 != 0 for i in range(41)], [i % 2 == 0 for i in range(41)]
    rng = np.random.default_rng(4)
    draws = [rng.integers(0, 41, 41) for _ in range(50)]

    def fd(x):
        return frechet_distance_from_stats(*feature_stats(x), *ref)

    diffs = [fd(a[i]) - fd(b[i]) for i in draws]
    adh = [np.mean(np.array(ca, float)[i] - np.array(cb, float)[i]) for i in draws]
    z = NormalDist().inv_cdf(0.975)
    d = fd_difference_interval(a, b, *ref, ca, cb, n_boot=50, seed=4, chunk=9)
    assert d["diff"] == pytest.approx(fd(a) - fd(b), rel=1e-9) and (d["fd_a"], d["fd_b"]) == pytest.approx((fd(a), fd(b)))
    assert d["diff_ci"] == pytest.approx((d["diff"] - z * np.std(diffs, ddof=1), d["diff"] + z * np.std(diffs, ddof=1)), rel=1e-9)
    mean = np.mean(ca) - np.mean(cb)
    assert d["adherence_diff"] == pytest.approx(mean)
    assert d["adherence_diff_ci"] == pytest.approx((mean - z * np.std(adh, ddof=1), mean + z * np.std(adh, ddof=1)))


def test_pairing_tells_apart_rows_whose_own_intervals_overlap():
    """Two rows of the same items that differ by a small shift on top of large shared item-to-item
    variation: each row's own interval is wide (which items were drawn moves both FDs), their
    intervals overlap, yet the paired difference is beyond chance; a row against itself differs by
    exactly 0."""
    from dmad.demo.metrics import fd_difference_interval, fd_interval

    g = torch.Generator().manual_seed(11)
    ref = feature_stats(torch.randn(4000, 8, generator=g))
    shared = torch.randn(120, 8, generator=g).double().numpy() * 1.5     # hard and easy items, shared by both rows
    a, b = shared + 0.1, shared + 0.3 + 0.05 * torch.randn(120, 8, generator=g).double().numpy()
    (lo_a, hi_a), (lo_b, hi_b) = fd_interval(a, *ref), fd_interval(b, *ref)
    assert lo_b < hi_a  # the rows' own intervals overlap
    d = fd_difference_interval(a, b, *ref)
    assert d["diff_ci"][1] < 0  # the paired difference excludes 0: A is closer to the reference
    same = fd_difference_interval(a, a, *ref, [True] * 120, [True] * 120)
    assert same["diff"] == 0 and same["diff_ci"] == (0, 0) and same["adherence_diff_ci"] == (0, 0)
    with pytest.raises(ValueError, match="same items"):
        fd_difference_interval(a, b[:100], *ref)
    with pytest.raises(ValueError, match="120 values per row"):
        fd_difference_interval(a, b, *ref, [True] * 119, [True] * 120)


def test_frechet_distance_grows_with_a_mean_shift():
    a = torch.randn(300, 8, generator=torch.Generator().manual_seed(1))
    fds = [frechet_distance(a, a + shift) for shift in (0.0, 0.5, 1.0, 2.0)]
    assert fds == sorted(fds) and fds[0] < 1e-8
    assert fds[-1] == pytest.approx(8 * 2.0 ** 2, rel=1e-6)  # |shift * ones(8)|^2, covariances equal


def test_real_renders_for_captions_keep_the_caption_and_vary_the_offset():
    caps = [shapes.caption(shapes.attributes_for(i, FRESH_SEED)) for i in range(3)]
    attrs = real_attrs_for_captions(caps, 4, HELDOUT_DATA_SEED)
    assert [shapes.caption(a) for a in attrs] == [c for c in caps for _ in range(4)]  # caption-major
    assert len({tuple(a["offset"]) for a in attrs}) == len(attrs)
    assert all(-1 <= v <= 1 for a in attrs for v in a["offset"])
    assert attrs == real_attrs_for_captions(caps, 4, HELDOUT_DATA_SEED)  # a pure function of its seeds
    later = real_attrs_for_captions(caps, 4, HELDOUT_DATA_SEED, first=4)  # disjoint k: other images
    assert {tuple(a["offset"]) for a in later}.isdisjoint({tuple(a["offset"]) for a in attrs})


def test_fd_real_needs_a_reference_of_the_same_captions(evaluator):
    """The bench's measurement fault (fixed): perfect renders of a few captions sat far from renders
    of random captions, so FD_real measured the caption mix, not the images. Against renders of the
    same captions they sit at the noise floor."""
    caps = [shapes.caption(shapes.attributes_for(i, FRESH_SEED)) for i in range(16)]

    def feats(attrs):
        return evaluate_images(evaluator, to_unit(render_real_attrs(attrs)), [shapes.caption(a) for a in attrs])["features"]

    samples = feats(real_attrs_for_captions(caps, 16, HELDOUT_DATA_SEED))
    same = feats(real_attrs_for_captions(caps, 16, HELDOUT_DATA_SEED, first=16))
    mixed = feats(render_real(range(256), HELDOUT_DATA_SEED)[1])
    assert frechet_distance(samples, mixed) > 10 * frechet_distance(samples, same)


def test_diversity(evaluator, fresh):
    images, _ = fresh
    same = evaluator.features(images[:1].repeat(4, 1, 1, 1))
    varied = evaluator.features(images[:4])
    assert diversity({"p": same, "q": same}) == pytest.approx(0.0, abs=1e-5)
    assert diversity({"p": varied}) > 0.1
    assert diversity({"p": same, "q": varied}) == pytest.approx(diversity({"q": varied}) / 2, rel=1e-5)
    assert diversity({"a": torch.tensor([[0.0, 0.0], [3.0, 4.0], [0.0, 0.0]])}) == pytest.approx(10 / 3)
    with pytest.raises(ValueError, match=">= 2 samples"):
        diversity({"p": same[:1]})


def test_adherence_counts():
    t = {"shape": "circle", "colour": "red", "size": "small", "position": "center", "background": "black"}
    wrong_colour = {**t, "colour": "blue"}
    wrong_both = {**t, "shape": "square", "position": "top left"}
    result = adherence([t, wrong_colour, wrong_both, t], [t] * 4)
    assert result["n"] == 4 and result["all"] == 0.5
    assert result["per_attribute"] == {"shape": 0.75, "colour": 0.75, "size": 1.0, "position": 0.75, "background": 1.0}
    with pytest.raises(ValueError):
        adherence([t], [t, t])


def test_training_is_deterministic(tmp_path):
    kwargs = dict(seed=3, n_train=64, n_val=16, steps=3, batch_size=8, log_every=1, log=lambda m: None)
    torch.manual_seed(1)  # the caller's global RNG state must not matter, only `seed`
    a = train_evaluator(tmp_path / "a", **kwargs)
    torch.manual_seed(2)
    b = train_evaluator(tmp_path / "b", **kwargs)
    wa, wb = load_file(str(tmp_path / "a" / "evaluator.safetensors")), load_file(str(tmp_path / "b" / "evaluator.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert a["per_attribute"] == b["per_attribute"]
    c = train_evaluator(tmp_path / "c", **{**kwargs, "seed": 4})
    wc = load_file(str(tmp_path / "c" / "evaluator.safetensors"))
    assert not torch.equal(wa["neck.0.weight"], wc["neck.0.weight"])
    assert load_evaluator(tmp_path / "a").predict(torch.zeros(1, 3, 64, 64))[0].keys() == set(ATTRIBUTES)
    rows = [json.loads(line) for line in (tmp_path / "a" / "training_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]


def test_training_leaves_the_global_rng_alone(tmp_path):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    train_evaluator(tmp_path / "x", n_train=16, n_val=4, steps=1, batch_size=4, log=lambda m: None)
    assert torch.equal(torch.rand(3), expected)
