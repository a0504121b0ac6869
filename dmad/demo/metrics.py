"""Quality measures for the shapes demo, on the outputs of the shipped evaluator (dmad.demo.evaluator).

- Prompt adherence: the fraction of images whose every attribute (shape, colour, size, position,
  background) the classifier reads as the caption states; plus accuracy per attribute.
- FD: Fréchet distance between Gaussians fitted to the classifier's penultimate features (the FID
  recipe with our classifier in place of Inception). FD_real compares samples to held-out real
  renders of the same captions (`evaluator.real_attrs_for_captions`; renders of other captions
  differ in the caption mix, which the features encode first), FD_teacher compares them to the
  50-step teacher's samples.
- Diversity: mean pairwise L2 distance between the features of one prompt's samples (different
  seeds), averaged over prompts. A collapsed student scores near 0.
- Noise floor: FD is biased upwards at finite N, so two sample sets from the *same* model differ by
  more than 0. The bench measures it as frechet_distance(teacher features with seeds A, teacher
  features with seeds B), the same N and prompts per side as every other FD in its table; an FD
  within the noise floor is indistinguishable from the teacher. Compare FDs only at equal N.

scipy is not available, so the matrix square root is taken by eigendecomposition of symmetric
matrices in float64 (numpy.linalg.eigh): tr sqrt(S1 S2) = tr sqrt(S1^1/2 S2 S1^1/2), whose argument
is symmetric positive semi-definite. Cost: O(D^3) with D = 128 features, a few milliseconds.
"""
from __future__ import annotations

import re
from typing import Optional, Sequence

import numpy as np
import torch

from dmad.demo import shapes

ATTRIBUTES = shapes.ATTRIBUTES


def _alternatives(values) -> str:
    return "|".join(re.escape(v) for v in sorted(values, key=len, reverse=True))


_CAPTION = re.compile(
    rf"a (?:(?P<size>{_alternatives(shapes.SIZES)}) )?(?:(?P<colour>{_alternatives(shapes.COLOURS)}) )?"
    rf"(?:(?P<shape>{_alternatives(shapes.SHAPES)})|shape)"
    rf"(?: at the (?P<position>{_alternatives(p for p in shapes.POSITIONS if p != 'center')})|(?P<center> in the center))?"
    rf"(?: on a (?P<background>{_alternatives(shapes.BACKGROUNDS)}) background)?")


def parse_caption(caption: str) -> dict:
    """The attributes a shapes caption states (the inverse of dmad.demo.shapes.caption): all five
    for a full caption, fewer for one that leaves some out ("a red shape" -> {"colour": "red"}).
    Surrounding whitespace (a .txt file's newline) is ignored; anything else raises ValueError."""
    m = _CAPTION.fullmatch(caption.strip()) if isinstance(caption, str) else None
    if m is None:
        raise ValueError(f"not a shapes caption: {caption!r}; expected 'a [<size>] [<colour>] <shape>|shape "
                         f"[at the <position>|in the center] [on a <background> background]'")
    found = m.groupdict()
    if found.pop("center"):
        found["position"] = "center"
    return {k: found[k] for k in ATTRIBUTES if found.get(k)}


def adherence(pred_attrs: Sequence[dict], target_attrs: Sequence[dict]) -> dict:
    """{"n", "all": fraction with every stated attribute right, "per_attribute": {attribute:
    accuracy over the targets that state it}}. A target states the attributes it has (a full
    caption all five; parse_caption of an under-specified one fewer); an attribute no target
    states is left out of per_attribute."""
    if len(pred_attrs) != len(target_attrs) or not target_attrs:
        raise ValueError(f"need equally many predictions and targets, at least one; got "
                         f"{len(pred_attrs)} and {len(target_attrs)}")
    stated = np.array([[k in t for k in ATTRIBUTES] for t in target_attrs])
    hits = np.array([[p.get(k) == t.get(k) for k in ATTRIBUTES] for p, t in zip(pred_attrs, target_attrs)])
    right = hits | ~stated
    per = {k: float(hits[stated[:, j], j].mean()) for j, k in enumerate(ATTRIBUTES) if stated[:, j].any()}
    return {"n": len(target_attrs), "all": float(right.all(axis=1).mean()), "per_attribute": per}


def _as_numpy(feats) -> np.ndarray:
    if isinstance(feats, torch.Tensor):
        feats = feats.detach().cpu().double().numpy()
    a = np.asarray(feats, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] < 2:
        raise ValueError(f"need features (N >= 2, D), got shape {a.shape}")
    return a


def feature_stats(feats) -> tuple[np.ndarray, np.ndarray]:
    """(mean (D,), covariance (D, D), unbiased) of features (N, D): compute once for a reference set."""
    a = _as_numpy(feats)
    return a.mean(axis=0), np.atleast_2d(np.cov(a, rowvar=False))


def _sqrt_psd(m: np.ndarray) -> np.ndarray:
    w, v = np.linalg.eigh((m + m.T) / 2)
    return (v * np.sqrt(np.clip(w, 0, None))) @ v.T  # clip: round-off makes tiny eigenvalues negative


def frechet_distance_from_stats(mu1, cov1, mu2, cov2) -> float:
    """|mu1 - mu2|^2 + tr(S1) + tr(S2) - 2 tr sqrt(S1^1/2 S2 S1^1/2)."""
    root1 = _sqrt_psd(cov1)
    cross = np.linalg.eigvalsh(_symmetric(root1 @ cov2 @ root1))
    fd = float(np.sum((mu1 - mu2) ** 2) + np.trace(cov1) + np.trace(cov2) - 2 * np.sum(np.sqrt(np.clip(cross, 0, None))))
    return max(fd, 0.0)  # a true FD is >= 0; identical sets can land at -1e-13


def _symmetric(m: np.ndarray) -> np.ndarray:
    return (m + m.T) / 2


def frechet_distance(feats_a, feats_b) -> float:
    """FD between two feature sets (N, D) (torch or numpy; N may differ; N >= 2 each)."""
    return frechet_distance_from_stats(*feature_stats(feats_a), *feature_stats(feats_b))


def fd_interval(feats, ref_mu, ref_cov, n_boot: int = 200, seed: int = 0, level: float = 0.95,
                chunk: int = 25, groups: Optional[Sequence[Sequence[int]]] = None) -> tuple[float, float]:
    """How much FD(feats, reference) moves with which N images happened to be drawn: the estimate
    plus and minus z standard deviations of the FDs of `n_boot` bootstrap resamples of the sample
    set (N, D) against fixed reference statistics (z = 1.96 for `level` 0.95), clipped at 0.
    Whether two rows of the same items differ is fd_difference_interval's question: two rows can
    differ beyond chance while these intervals overlap.

    Why not the quantiles of the resampled FDs: FD's finite-sample bias grows as the sample
    shrinks and a resample has only ~63% distinct images, so those FDs sit above the estimate
    (measured at N = 512: a whole percentile interval above it), and the pivotal correction
    (2F - quantiles) then collapsed to [0, 0] for a 3.9 noise-floor FD. The spread of the
    resampled FDs is the part that stays trustworthy.

    Cost: the resamples' trace term tr sqrt(S_b S_ref) is the sum of the square roots of the
    eigenvalues of R S_b R with R = S_ref^1/2 (similar matrices), so the reference's root is taken
    once and each resample needs one eigvalsh, `chunk` resamples per batched call (1.7x faster
    at N = 16, 2.6x at N = 512, D = 128, than an FD per resample; equal to round-off).

    `groups` (the item indices of each caption): a stratified bootstrap that resamples seeds
    within each caption, so every resample keeps the row's caption mix. The reference is matched
    to that mix, and resampling items freely unbalances it: on the demo bench that interval came
    out ~4.5x wider than the spread of FD over other noise sets, where the stratified one
    matched it."""
    a = _as_numpy(feats)
    fd = frechet_distance_from_stats(*feature_stats(a), ref_mu, ref_cov)
    fds = _resampled_fds(a, _draws(len(a), n_boot, seed, groups), ref_mu, ref_cov, chunk)
    half = _z(level) * float(np.std(fds, ddof=1))
    return max(0.0, float(fd - half)), float(fd + half)


def fd_difference_interval(feats_a, feats_b, ref_mu, ref_cov, correct_a=None, correct_b=None,
                           n_boot: int = 200, seed: int = 0, level: float = 0.95, chunk: int = 25,
                           groups: Optional[Sequence[Sequence[int]]] = None) -> dict:
    """Is row A's FD against the reference lower than row B's beyond chance, when both rows were
    drawn for the same items (the same caption and initial noise at each index)? The paired
    bootstrap: each resample draws the same item indices for both rows, so the difference
    FD(A_b) - FD(B_b) keeps what the rows share (a hard caption is hard for both) and its spread
    is the chance part of the difference alone. Returns {"fd_a", "fd_b", "diff", "diff_ci"}: the
    difference A - B plus and minus z standard deviations of the resampled differences (as
    fd_interval; FD's small-sample bias, which puts resampled FDs above the estimate, is nearly
    the same for both rows and cancels in the difference). With per-item correctness (bools) of
    both rows it adds "adherence_a", "adherence_b", "adherence_diff", "adherence_diff_ci" from the
    same resamples.

    Why not "the two rows' own intervals do not overlap": that ignores the pairing, and even for
    independent rows it is a far stricter test than 95% (about 99.4% for equal spreads), so two
    rows can differ beyond chance while their intervals still overlap."""
    a, b = _as_numpy(feats_a), _as_numpy(feats_b)
    if a.shape != b.shape:
        raise ValueError(f"paired rows need the same items; got features {a.shape} and {b.shape}")
    draws = _draws(len(a), n_boot, seed, groups)
    fd_a = frechet_distance_from_stats(*feature_stats(a), ref_mu, ref_cov)
    fd_b = frechet_distance_from_stats(*feature_stats(b), ref_mu, ref_cov)
    d = np.asarray(_resampled_fds(a, draws, ref_mu, ref_cov, chunk)) - np.asarray(_resampled_fds(b, draws, ref_mu, ref_cov, chunk))
    half = _z(level) * float(np.std(d, ddof=1))
    out = {"fd_a": fd_a, "fd_b": fd_b, "diff": fd_a - fd_b, "diff_ci": (fd_a - fd_b - half, fd_a - fd_b + half)}
    if correct_a is not None and correct_b is not None:
        ca, cb = np.asarray(correct_a, dtype=float), np.asarray(correct_b, dtype=float)
        if ca.shape != (len(a),) or cb.shape != (len(a),):
            raise ValueError(f"per-item correctness needs {len(a)} values per row; got {ca.shape} and {cb.shape}")
        per_item = ca - cb
        dd = per_item[np.stack(draws)].mean(axis=1)
        half = _z(level) * float(np.std(dd, ddof=1))
        out.update(adherence_a=float(ca.mean()), adherence_b=float(cb.mean()), adherence_diff=float(per_item.mean()),
                   adherence_diff_ci=(float(per_item.mean() - half), float(per_item.mean() + half)))
    return out


def _z(level: float) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf((1 + level) / 2)


def _draws(n: int, n_boot: int, seed: int, groups: Optional[Sequence[Sequence[int]]] = None) -> list[np.ndarray]:
    """The bootstrap's resamples of n items: seeded, drawn one at a time (so a chunk size never
    changes them). With `groups` (a partition of the n items), each resample draws within each
    group as many items as it has (a stratified bootstrap)."""
    rng = np.random.default_rng(seed)
    if groups is None:
        return [rng.integers(0, n, n) for _ in range(n_boot)]
    parts = [np.asarray(g, dtype=np.int64) for g in groups]
    if sorted(int(i) for g in parts for i in g) != list(range(n)):
        raise ValueError(f"groups must partition the {n} items")
    return [np.concatenate([g[rng.integers(0, len(g), len(g))] for g in parts]) for _ in range(n_boot)]


def _resampled_fds(a: np.ndarray, draws: list[np.ndarray], ref_mu, ref_cov, chunk: int) -> list[float]:
    """FD of each resample a[draw] against fixed reference statistics, `chunk` per batched call."""
    root, ref_trace = _sqrt_psd(ref_cov), float(np.trace(ref_cov))
    fds: list[float] = []
    for i in range(0, len(draws), chunk):
        x = a[np.stack(draws[i:i + chunk])]                      # (B, N, D)
        mu = x.mean(axis=1)
        xc = x - mu[:, None, :]
        cov = np.swapaxes(xc, 1, 2) @ xc / (x.shape[1] - 1)     # unbiased, as feature_stats
        m = root @ cov @ root
        cross = np.linalg.eigvalsh((m + np.swapaxes(m, 1, 2)) / 2)
        f = (np.sum((mu - ref_mu) ** 2, axis=1) + np.trace(cov, axis1=1, axis2=2) + ref_trace
             - 2 * np.sum(np.sqrt(np.clip(cross, 0, None)), axis=1))
        fds.extend(np.maximum(f, 0.0).tolist())
    return fds


def diversity(features_by_prompt: dict[str, torch.Tensor]) -> float:
    """Mean pairwise L2 distance between one prompt's sample features, averaged over prompts."""
    if not features_by_prompt:
        raise ValueError("diversity needs at least one prompt")
    per_prompt = []
    for prompt, feats in features_by_prompt.items():
        f = torch.as_tensor(feats).detach().double().cpu()
        if f.ndim != 2 or f.shape[0] < 2:
            raise ValueError(f"diversity needs >= 2 samples (N, D) per prompt; {prompt!r} has shape {tuple(f.shape)}")
        per_prompt.append(torch.pdist(f).mean().item())
    return float(np.mean(per_prompt))


@torch.no_grad()
def evaluate_images(classifier, images: torch.Tensor, captions: Sequence[str], batch_size: int = 256) -> dict:
    """Classify images (N, 3, H, W) in [-1, 1] generated for `captions`.

    Returns {"predictions": [attrs], "targets": [attrs], "correct": [bool] (every stated attribute right),
    "features": (N, D) float32 CPU tensor, "adherence": adherence(predictions, targets)}."""
    if images.ndim != 4 or images.shape[0] != len(captions):
        raise ValueError(f"need images (N, 3, H, W) and N captions; got {tuple(images.shape)} and {len(captions)}")
    targets = [parse_caption(c) for c in captions]
    feats, preds = [], []
    for start in range(0, images.shape[0], batch_size):
        f = classifier.features(images[start:start + batch_size])
        preds += classifier.decode(classifier.logits_from_features(f))
        feats.append(f.float().cpu())
    correct = [all(p[k] == v for k, v in t.items()) for p, t in zip(preds, targets)]  # what each caption states
    return {"predictions": preds, "targets": targets, "correct": correct, "features": torch.cat(feats),
            "adherence": adherence(preds, targets)}
