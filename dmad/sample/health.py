"""Health signals of a run's samples against the teacher's: pure functions of images, no model and
nothing downloaded, so they work for any teacher (docs/ARCHITECTURE.md, "Health signals").

Each prompt of the prompt set is rendered at its `health_seeds` seeds by the teacher (once per run)
and by the student (at every validation). From those images:

  diversity        mean pairwise distance between one prompt's seeds (FEATURE below), student / teacher
  saturation       mean HSV saturation, student / teacher
  brightness       mean luma (Rec. 601), student / teacher
  contrast         luma standard deviation, student / teacher
  colourfulness    Hasler-Suesstrunk M, student / teacher
  detail           high-frequency energy: mean squared 4-neighbour Laplacian of luma, student / teacher
  teacher_distance mean |student - teacher| of the same prompt and seed on 32 x 32 images in [0, 1]

Ratios are taken per prompt (a prompt whose teacher level is about 0, e.g. the saturation of a
white shape on black, has none) and averaged over the prompts; a signal with no ratio is absent.
The alert rule (alerts_for) compares each ratio with THRESHOLDS and looks at the trend of the
run's earlier rows of health.csv. numpy and PIL only: nothing here touches a training step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Optional, Sequence

import numpy as np
from PIL import Image

from dmad.contract.runlog import HEALTH_LABELS, HEALTH_SIGNALS, HEALTH_THRESHOLDS

SIGNALS, LABELS = HEALTH_SIGNALS, HEALTH_LABELS  # the contract's names and order (health.csv, events)

# The alert bounds per signal, with their evidence: the contract's (the app draws them too).
THRESHOLDS = HEALTH_THRESHOLDS
# A signal that has moved towards a bound for TREND_VALIDATIONS validations in a
# row (TREND_VALIDATIONS + 1 rows) and is within TREND_MARGIN of it (relative) alerts early.
TREND_VALIDATIONS = 3
TREND_MARGIN = 0.1

# What users usually change, per signal and direction ({back}: the checkpoint to go back to).
_GUIDANCE_WINS = ("the teacher's guidance is winning over the critic: lower real_guidance_scale towards the teacher's "
                  "own CFG, check that the critic learns (critic_lr, critic ratio), or go back to {back}")
ADVICE = {
    ("diversity", "low"): "lower the GAN weight or the generator's learning rate, raise the critic ratio, or go back "
                          "to {back}",
    ("saturation", "high"): _GUIDANCE_WINS,
    ("colourfulness", "high"): _GUIDANCE_WINS,  # the same over-saturation, seen on colour spread
    ("brightness", "low"): "images are getting darker than the teacher's: check the real score's CFG, lower the "
                           "generator's learning rate, or go back to {back}",
    ("brightness", "high"): "images are getting lighter than the teacher's (washed out): check the real score's CFG, "
                            "lower the generator's learning rate, or go back to {back}",
    ("contrast", "low"): "images are flattening (washed out): lower the generator's learning rate, or go back to "
                         "{back}",
    ("contrast", "high"): "contrast beyond the teacher's: the real score's CFG may be too high; lower it, or go "
                          "back to {back}",
    ("detail", "low"): "the student is blurring: more critic updates per generator update (critic ratio), perhaps "
                       "a lower GAN weight, or go back to {back}",
    ("detail", "high"): "the student is over-sharpening (high-frequency artefacts): lower the GAN weight or the "
                        "generator's learning rate, or go back to {back}",
    ("teacher_distance", "high"): "the student is drifting from the teacher: lower the generator's learning rate, "
                                  "raise the distribution-matching weight, or go back to {back}",
}

RATIO_FLOOR = {  # a teacher level at or below this makes the prompt's ratio absent (about 0)
    # diversity: a prompt whose teacher draws about one image (a full demo caption: 0.005-0.014)
    # is below what a one-pixel shift of one seed of four gives (0.011-0.022, bench/health_cost.py)
    "diversity": 0.03, "saturation": 0.02, "brightness": 0.01, "contrast": 0.005, "colourfulness": 0.005,
    "detail": 1e-6,
}
SMALL = 32  # side of the images teacher_distance compares
FEATURE = "lab32"  # diversity's feature space (FEATURES); chosen by measurement, see bench/health_cost.py


# ----------------------------------------------------------------------------- images

def load_image(path: str | Path) -> np.ndarray:
    """A PNG as float32 (H, W, 3) in [0, 1]."""
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0


def _resized(img: np.ndarray, side: int) -> np.ndarray:
    if img.shape[0] == side and img.shape[1] == side:
        return img
    pil = Image.fromarray((img * 255.0).round().clip(0, 255).astype(np.uint8))
    return np.asarray(pil.resize((side, side), Image.BOX), dtype=np.float32) / 255.0


def luma(img: np.ndarray) -> np.ndarray:
    return img[..., 0] * 0.299 + img[..., 1] * 0.587 + img[..., 2] * 0.114


def saturation(img: np.ndarray) -> float:
    hi, lo = img.max(axis=-1), img.min(axis=-1)
    return float(np.where(hi > 0, (hi - lo) / np.maximum(hi, 1e-12), 0.0).mean())


def brightness(img: np.ndarray) -> float:
    return float(luma(img).mean())


def contrast(img: np.ndarray) -> float:
    return float(luma(img).std())


def colourfulness(img: np.ndarray) -> float:
    """Hasler and Suesstrunk (2003): sqrt(sd_rg^2 + sd_yb^2) + 0.3 sqrt(mean_rg^2 + mean_yb^2), on [0, 1] pixels."""
    r, g, b = img[..., 0], img[..., 1], img[..., 2]
    rg, yb = r - g, 0.5 * (r + g) - b
    return float(math.hypot(rg.std(), yb.std()) + 0.3 * math.hypot(rg.mean(), yb.mean()))


def detail(img: np.ndarray) -> float:
    """Mean squared 4-neighbour Laplacian of luma (inner pixels): high-frequency energy."""
    y = luma(img)
    if y.shape[0] < 3 or y.shape[1] < 3:
        return 0.0
    lap = y[:-2, 1:-1] + y[2:, 1:-1] + y[1:-1, :-2] + y[1:-1, 2:] - 4.0 * y[1:-1, 1:-1]
    return float((lap * lap).mean())


IMAGE_STATS = {"saturation": saturation, "brightness": brightness, "contrast": contrast,
               "colourfulness": colourfulness, "detail": detail}


def teacher_distance(student: np.ndarray, teacher: np.ndarray) -> float:
    """Mean absolute difference of the two images at SMALL x SMALL, in [0, 1] (0: identical)."""
    return float(np.abs(_resized(student, SMALL) - _resized(teacher, SMALL)).mean())


# ----------------------------------------------------------------------------- diversity features

def _srgb_to_lab(img: np.ndarray) -> np.ndarray:
    """CIE Lab (D65) of sRGB pixels in [0, 1], scaled to about [0, 1] (L / 100, a / 128, b / 128)."""
    lin = np.where(img <= 0.04045, img / 12.92, ((img + 0.055) / 1.055) ** 2.4)
    m = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]], dtype=np.float32)
    xyz = lin @ m.T / np.array([0.95047, 1.0, 1.08883], dtype=np.float32)
    f = np.where(xyz > 216 / 24389, np.cbrt(xyz), xyz * (24389 / 27) / 116 + 16 / 116)
    lab = np.stack([116 * f[..., 1] - 16, 500 * (f[..., 0] - f[..., 1]), 200 * (f[..., 1] - f[..., 2])], axis=-1)
    return lab / np.array([100.0, 128.0, 128.0], dtype=np.float32)


def feature_lab32(img: np.ndarray) -> np.ndarray:
    """Candidate A: the image at 32 x 32 in Lab, as one vector."""
    return _srgb_to_lab(_resized(img, 32)).reshape(-1)


_PROJECTION: dict[int, np.ndarray] = {}
PROJECTION_DIM = 256


def feature_proj64(img: np.ndarray) -> np.ndarray:
    """Candidate B: a fixed seeded Gaussian random projection of the 64 x 64 RGB pixels to
    PROJECTION_DIM numbers (scaled so RMS distances match the pixels' RMS distances on average)."""
    x = _resized(img, 64).reshape(-1)
    if x.size not in _PROJECTION:
        rng = np.random.default_rng(20240539)
        _PROJECTION[x.size] = (rng.standard_normal((x.size, PROJECTION_DIM)) / math.sqrt(x.size)).astype(np.float32)
    return x @ _PROJECTION[x.size]


FEATURES = {"lab32": feature_lab32, "proj64": feature_proj64}


def mean_pairwise_distance(features: Sequence[np.ndarray]) -> Optional[float]:
    """Mean RMS distance over every pair of feature vectors; None for fewer than two."""
    n = len(features)
    if n < 2:
        return None
    total = sum(float(np.sqrt(np.mean((features[i] - features[j]) ** 2))) for i in range(n) for j in range(i + 1, n))
    return total / (n * (n - 1) / 2)


# ----------------------------------------------------------------------------- levels and signals

@dataclass(frozen=True)
class PromptLevels:
    """One prompt's absolute levels over its seeds: the mean of each image statistic, and the
    diversity (None with one seed)."""

    stats: dict[str, float]
    diversity: Optional[float]


def prompt_levels(images: Sequence[np.ndarray], feature: str = FEATURE) -> PromptLevels:
    stats = {name: float(np.mean([fn(im) for im in images])) for name, fn in IMAGE_STATS.items()}
    return PromptLevels(stats, mean_pairwise_distance([FEATURES[feature](im) for im in images]))


def set_levels(images: Mapping[str, Sequence[np.ndarray]], feature: str = FEATURE) -> dict[str, PromptLevels]:
    """{prompt id: its levels} of {prompt id: its images, one per seed}."""
    return {pid: prompt_levels(ims, feature) for pid, ims in images.items() if len(ims)}


def _level(levels: PromptLevels, signal: str) -> Optional[float]:
    return levels.diversity if signal == "diversity" else levels.stats[signal]


def absolute_levels(levels: Mapping[str, PromptLevels]) -> dict[str, float]:
    """Each signal's level averaged over the prompts (the teacher's reference values)."""
    out = {}
    for signal in SIGNALS[:-1]:
        values = [v for lv in levels.values() if (v := _level(lv, signal)) is not None]
        if values:
            out[signal] = float(np.mean(values))
    return out


def relative_signals(student: Mapping[str, PromptLevels], teacher: Mapping[str, PromptLevels]) -> dict[str, float]:
    """Each signal but teacher_distance: student / teacher per prompt, averaged over the prompts
    that have a ratio (teacher level above RATIO_FLOOR); a signal without any is absent."""
    out = {}
    for signal in SIGNALS[:-1]:
        ratios = []
        for pid, lv in student.items():
            s, t = _level(lv, signal), _level(teacher[pid], signal) if pid in teacher else None
            if s is not None and t is not None and t > RATIO_FLOOR[signal]:
                ratios.append(s / t)
        if ratios:
            out[signal] = float(np.mean(ratios))
    return out


def mean_teacher_distance(student: Mapping[str, Sequence[np.ndarray]],
                          teacher: Mapping[str, Sequence[np.ndarray]]) -> Optional[float]:
    """teacher_distance averaged over every (prompt, seed) both have; None when none."""
    d = [teacher_distance(s, t) for pid, ims in student.items() for s, t in zip(ims, teacher.get(pid, ()))]
    return float(np.mean(d)) if d else None


def health_signals(student: Mapping[str, Sequence[np.ndarray]], teacher: Mapping[str, Sequence[np.ndarray]],
                   teacher_levels: Optional[Mapping[str, PromptLevels]] = None) -> dict[str, float]:
    """The seven signals (SIGNALS order; absent ones left out) of the student's images against the
    teacher's: {prompt id: images, seed k at index k}. `teacher_levels`: set_levels(teacher), when
    already computed (the teacher's are the same at every validation)."""
    t_levels = teacher_levels if teacher_levels is not None else set_levels(teacher)
    out = relative_signals(set_levels(student), t_levels)
    distance = mean_teacher_distance(student, teacher)
    if distance is not None:
        out["teacher_distance"] = distance
    return {k: out[k] for k in SIGNALS if k in out}


# ----------------------------------------------------------------------------- alerts

@dataclass(frozen=True)
class Alert:
    signal: str
    value: float
    threshold: float
    direction: str  # "low" | "high"
    since_iter: Optional[int]
    message: str
    advice: str

    def to_event(self) -> dict:
        return {"signal": self.signal, "value": self.value, "threshold": self.threshold, "direction": self.direction,
                "since_iter": self.since_iter, "message": self.message, "advice": self.advice}

    def warning(self) -> str:
        return f"health: {self.message} — {self.advice}"


def trend_start(history: Sequence[tuple[int, float]], it: int, value: float, direction: str) -> tuple[Optional[int], int]:
    """(first iteration of the current trend, validations in it): how long the signal has moved
    towards `direction` ("low": falling) up to (it, value), over the earlier rows `history`
    ((iter, value), oldest first, iterations before `it`). (None, 0) when the last move was not
    that way."""
    points = [p for p in history if p[0] < it] + [(it, value)]
    moves, k = 0, len(points) - 1
    while k > 0 and (points[k][1] < points[k - 1][1] if direction == "low" else points[k][1] > points[k - 1][1]):
        moves, k = moves + 1, k - 1
    return (points[k][0], moves) if moves else (None, 0)


def _message(signal: str, value: float, it: int, direction: str, since: Optional[int]) -> str:
    if signal == "teacher_distance":
        text = f"distance to the teacher {value:.2f} at iteration {it:,}"
    else:
        text = f"{LABELS[signal].lower()} {value:.0%} of the teacher's at iteration {it:,}"
    if since is not None:
        text += f", {'falling' if direction == 'low' else 'rising'} since {since:,}"
    return text


def _crossed(value: float, bound: float, direction: str, margin: float = 0.0) -> bool:
    return value < bound * (1 + margin) if direction == "low" else value > bound * (1 - margin)


def alerts_for(signals: Mapping[str, float], it: int, history: Mapping[str, Sequence[tuple[int, float]]],
               healthy_checkpoint: Optional[str] = None,
               thresholds: Optional[Mapping[str, tuple[Optional[float], Optional[float]]]] = None) -> list[Alert]:
    """The alerts of one validation's `signals` at iteration `it`: a signal beyond its threshold, or
    moving towards it for TREND_VALIDATIONS validations and within TREND_MARGIN of it. `history`:
    {signal: [(iter, value), ...]} of the run's earlier health rows, oldest first.
    `healthy_checkpoint`: the checkpoint to go back to (the last one that raised no alert)."""
    back = f"checkpoint {healthy_checkpoint}" if healthy_checkpoint else "an earlier checkpoint"
    thresholds = THRESHOLDS if thresholds is None else thresholds
    out = []
    for signal in SIGNALS:
        value = signals.get(signal)
        if value is None or signal not in thresholds:
            continue
        for direction, bound in zip(("low", "high"), thresholds[signal]):
            if bound is None:
                continue
            since, moves = trend_start(history.get(signal, ()), it, value, direction)
            early = moves >= TREND_VALIDATIONS and _crossed(value, bound, direction, TREND_MARGIN)
            if _crossed(value, bound, direction) or early:
                out.append(Alert(signal, value, bound, direction, since, _message(signal, value, it, direction, since),
                                 ADVICE[(signal, direction)].format(back=back)))
    return out


def history_of(rows: Iterable[Mapping[str, object]]) -> dict[str, list[tuple[int, float]]]:
    """{signal: [(iter, value), ...]} of health.csv rows (dmad.contract.runlog.read_health)."""
    out: dict[str, list[tuple[int, float]]] = {s: [] for s in SIGNALS}
    for r in rows:
        for s in SIGNALS:
            v = r.get(s)
            if isinstance(v, float) and isinstance(r.get("iter"), int):
                out[s].append((r["iter"], v))  # type: ignore[arg-type]
    return out
