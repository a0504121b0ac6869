"""The rows of `dmad bench distill`: which model a row reads (its key), what the evaluator reads from
its samples, and where each row is kept so an interrupted bench goes on where it stopped.

A row is one model at one step count (the teacher at 50 steps + CFG, a DMAD student of training
seed 1 at 4 steps, ...) over both parts of a set (dmad.demo.bench_sets): full captions (FD to
real renders with a seed-stratified interval, adherence, diversity) and under-specified captions
(total-variation distance to the data's conditional, coverage, stated accuracy, precision and
recall against real renders: dmad.demo.coverage). A row is found by its RowKey (model, method,
steps, checkpoint rule, training seed); its label is derived from the key. Rows are written as
<rows>/<slug of the label>.json (the numbers) and .npz (the features and per-item readings),
each atomically; a row whose JSON exists is read back, not sampled again.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from dmad.errors import UserInputError


def steps_label(k: int) -> str:
    return f"{k} step{'s' if k > 1 else ''}"


@dataclass(frozen=True)
class RowKey:
    """Which model a row reads. model: "teacher" (its own sampler + CFG; noise "B": the same model
    on the other noise set, FD's floor), "real" (other real renders: every floor) or "student"
    (a distillation `method` of training `seed`, at `steps`, at its checkpoint rule `budget`:
    "final", the peer's "same wall clock" / "equal compute", or "iter <N>" on a learning curve)."""

    model: str
    steps: Optional[int] = None
    method: Optional[str] = None
    seed: Optional[int] = None
    budget: str = ""
    noise: str = "A"

    @property
    def group(self) -> str:
        """The label without the training seed: "DMAD 4 steps", "DMAD 1 step @ iter 800"."""
        if self.model == "real":
            return "real renders (floor)"
        if self.model == "teacher":
            return f"teacher {steps_label(self.steps)} + CFG" + (", other seeds" if self.noise == "B" else "")
        from dmad.demo.bench_runs import METHODS

        name = METHODS[self.method].name if self.method in METHODS else str(self.method)
        return f"{name} {steps_label(self.steps)}" + ("" if self.budget in ("", "final") else f" @ {self.budget}")

    @property
    def label(self) -> str:
        """"teacher 50 steps + CFG", "DMAD 4 steps, seed 1", "DMAD 1 step @ iter 800, seed 0"."""
        return self.group + ("" if self.model != "student" else f", seed {self.seed}")


_KEY_FIELDS = tuple(f.name for f in fields(RowKey))


@dataclass
class Row:
    """A row's key (RowKey's fields) and what the evaluator read."""

    model: str                      # "teacher" | "student" | "real"
    steps: Optional[int] = None
    method: Optional[str] = None    # a student's: a key of dmad.demo.bench_runs.METHODS
    seed: Optional[int] = None      # a student's training seed
    budget: str = ""                # a student's checkpoint rule: "final", "equal compute", "iter <N>", ...
    noise: str = "A"                # the initial-noise set ("B": the teacher's other seeds)
    nfe: Optional[int] = None       # network evaluations per image
    iteration: Optional[int] = None
    network_passes: Optional[float] = None  # training compute up to the checkpoint (dmad.train.passes)
    fd_real: float = 0.0
    fd_real_ci: Optional[tuple] = None      # seed-stratified bootstrap, 95%
    fd_teacher: Optional[float] = None
    adherence: float = 0.0
    per_attribute: dict = field(default_factory=dict)
    diversity: Optional[float] = None
    tv: Optional[float] = None              # under-specified captions (dmad.demo.coverage)
    tv_by_attribute: dict = field(default_factory=dict)
    stated_accuracy: Optional[float] = None
    coverage: Optional[float] = None
    all_covered: Optional[bool] = None
    missing: dict = field(default_factory=dict)  # caption -> {attribute: values with p >= 5% never drawn}
    precision: Optional[float] = None
    recall: Optional[float] = None
    under_diversity: Optional[float] = None
    seconds_per_image: Optional[float] = None
    notes: str = ""

    @classmethod
    def at(cls, key: RowKey, **facts) -> "Row":
        return cls(**asdict(key), **facts)

    @property
    def key(self) -> RowKey:
        return RowKey(**{k: getattr(self, k) for k in _KEY_FIELDS})

    @property
    def label(self) -> str:
        return self.key.label

    def to_dict(self) -> dict:
        return {"label": self.label, **asdict(self)}


def slug(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")


class RowStore:
    """<folder>/<slug>.json + .npz per row; `get` reads a finished row back or makes it. The folder
    keeps the protocol its rows were scored under (protocol.json: the sets' seeds, the teacher, digests
    of the real references and of what the students train on); a folder from another protocol is
    refused, never mixed into this one's tables."""

    def __init__(self, folder: Path, protocol: Optional[dict] = None):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        if protocol is not None:
            self._check_protocol(protocol)

    def _check_protocol(self, protocol: dict) -> None:
        from dmad.contract.runs import atomic_write_json

        path = self.folder / "protocol.json"
        if path.is_file():
            kept = json.loads(path.read_text(encoding="utf-8"))
            changed = sorted(k for k in set(kept) | set(protocol) if kept.get(k) != protocol.get(k))
            if changed:
                raise UserInputError(f"{self.folder}: its rows were scored under another protocol "
                                     f"({', '.join(changed)} differ); give a new --out or delete that folder")
        elif any(self.folder.glob("*.json")):
            raise UserInputError(f"{self.folder}: its rows do not say which protocol scored them; "
                                 "give a new --out or delete that folder")
        else:
            atomic_write_json(path, protocol)

    def path(self, key: RowKey) -> Path:
        return self.folder / f"{slug(key.label)}.json"

    def get(self, key: RowKey, make: Callable[[], tuple[Row, dict]]) -> tuple[Row, dict]:
        """The row of `key`: read back when its JSON is there, else `make()` -> (row, arrays), kept."""
        path = self.path(key)
        if path.is_file():
            doc = json.loads(path.read_text(encoding="utf-8"))
            with np.load(path.with_suffix(".npz")) as z:
                arrays = {k: z[k] for k in z.files}
            known = {f.name for f in fields(Row)}
            doc = {k: v for k, v in doc.items() if k in known}
            return Row(**{**doc, **asdict(key), "fd_real_ci": _tuple(doc.get("fd_real_ci"))}), arrays
        row, arrays = make()
        from dmad.contract.runs import atomic_write_bytes, atomic_write_json
        import io

        buf = io.BytesIO()
        np.savez(buf, **arrays)
        atomic_write_bytes(path.with_suffix(".npz"), buf.getvalue())
        atomic_write_json(path, row.to_dict())  # last: a row is finished when its JSON is there
        return row, arrays


def _tuple(v):
    return tuple(v) if v is not None else None


# ------------------------------------------------------------------------------- references

@dataclass
class References:
    """What every row is compared against: real renders of the full captions (FD_real's statistics,
    the items' caption strata) and of the under-specified captions (precision and recall)."""

    full_items: list
    under_items: list
    full_mu: np.ndarray
    full_cov: np.ndarray
    full_groups: list
    under_real: np.ndarray  # (len(under_items), D) features of real renders, one per item


def references_digest(refs: "References") -> str:
    """A short digest of the real references every row is scored against (rounded, so that the
    last bits of a CPU's float sums do not count)."""
    import hashlib

    h = hashlib.sha256()
    for a in (refs.full_mu, refs.full_cov, refs.under_real):
        h.update(np.round(np.asarray(a, dtype=np.float64), 3).tobytes())
    h.update(json.dumps([refs.full_items, refs.under_items], default=str).encode())
    return h.hexdigest()[:16]


def training_digest(config_paths: list, overrides: list[str]) -> str:
    """A short digest of what the bench's distillations train on: each config as it loads (every
    field, paths resolved) and the caption files and dataset.json of its data folder, so a rows
    folder is never scored against students of other settings or other data."""
    import hashlib

    from dmad.contract.config import load_config

    h = hashlib.sha256()
    for path in config_paths:
        cfg = load_config(path, list(overrides))
        h.update(cfg.model_dump_json().encode())
        data = Path(cfg.identity.train_data_dir)
        for f in sorted(data.glob("*.txt")) + sorted(data.glob("dataset.json")):
            h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def prompt_captions(items: list) -> list[str]:
    """The caption of each prompt of `items` (its first seed's), repeats kept: two prompts may draw
    the same caption (the held-out set's 64 full captions hold 59 distinct ones)."""
    return [c for c, _, j in items if j == 0]


def make_references(classifier, full_items: list, under_items: list, real_per_prompt: int, seed: int) -> References:
    from dmad.demo.bench_sets import groups_of, real_images
    from dmad.demo.metrics import feature_stats

    caps = prompt_captions(full_items)  # one entry per prompt: a caption drawn twice weighs twice, as in the items
    images, _ = real_images(caps, real_per_prompt, seed)
    mu, cov = feature_stats(_features(classifier, images))
    ucaps = prompt_captions(under_items)
    uimages, _ = real_images(ucaps, len(under_items) // len(ucaps), seed, first=10_000)
    return References(full_items, under_items, mu, cov, groups_of(full_items), _features(classifier, uimages))


def _features(classifier, images) -> np.ndarray:
    import torch

    with torch.no_grad():
        return torch.cat([classifier.features(images[a:a + 256]) for a in range(0, len(images), 256)]).numpy()


# ------------------------------------------------------------------------------- evaluation

def evaluate(classifier, refs: References, full_images, under_images, teacher_stats=None) -> tuple[dict, dict]:
    """The evaluator's reading of a model's samples of both parts: (numbers for a Row, arrays to keep)."""
    from dmad.demo.coverage import coverage_summary, precision_recall
    from dmad.demo.metrics import evaluate_images, fd_interval, feature_stats, frechet_distance_from_stats

    caps = [c for c, _, _ in refs.full_items]
    res = evaluate_images(classifier, full_images, caps)
    feats = res["features"].numpy()
    stats = feature_stats(feats)
    out = {"fd_real": frechet_distance_from_stats(*stats, refs.full_mu, refs.full_cov),
           "fd_real_ci": fd_interval(feats, refs.full_mu, refs.full_cov, groups=refs.full_groups),
           "fd_teacher": None if teacher_stats is None else frechet_distance_from_stats(*stats, *teacher_stats),
           "adherence": res["adherence"]["all"], "per_attribute": res["adherence"]["per_attribute"],
           "diversity": _diversity(feats, refs.full_groups)}
    arrays = {"full_features": feats, "full_correct": np.asarray(res["correct"], dtype=bool)}
    if under_images is not None:
        ucaps = [c for c, _, _ in refs.under_items]
        ures = evaluate_images(classifier, under_images, ucaps)
        cov = coverage_summary(ures["predictions"], ucaps)
        ufeats = ures["features"].numpy()
        precision, recall = precision_recall(ufeats, refs.under_real)
        out.update(tv=cov["tv"], tv_by_attribute=cov["tv_by_attribute"], stated_accuracy=cov["stated_accuracy"],
                   coverage=cov["coverage"], all_covered=cov["all_covered"],
                   missing={c: {a: v for a, v in r["missing"].items() if v} for c, r in cov["per_caption"].items()
                            if any(r["missing"].values())},
                   precision=precision, recall=recall,
                   under_diversity=_diversity(ufeats, _groups([c for c, _, _ in refs.under_items])))
        arrays["under_features"] = ufeats
    return out, arrays


def _groups(captions: list[str]) -> list[list[int]]:
    by: dict[str, list[int]] = {}
    for k, c in enumerate(captions):
        by.setdefault(c, []).append(k)
    return list(by.values())


def _diversity(feats: np.ndarray, groups: list) -> Optional[float]:
    import torch

    from dmad.demo.metrics import diversity

    if all(len(g) < 2 for g in groups):
        return None
    return diversity({str(k): torch.from_numpy(feats[g]) for k, g in enumerate(groups) if len(g) >= 2})
