"""The rows of `dmad bench distill`: how a model samples the bench's items, what the evaluator reads
from those samples, and where each row is kept so an interrupted bench goes on where it stopped.

A row is one model at one step count (the teacher at 50 steps + CFG, a DMAD student of training
seed 1 at 4 steps, ...) over both parts of a set (dmad.demo.bench_sets): full captions (FD to
real renders with a seed-stratified interval, adherence, diversity) and under-specified captions
(total-variation distance to the data's conditional, coverage, stated accuracy, precision and
recall against real renders: dmad.demo.coverage). Rows are written as <rows>/<slug>.json (the
numbers) and <slug>.npz (the features and per-item readings), each atomically; a row whose JSON
exists is read back, not sampled again.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from dmad.errors import RunFailed, UserInputError


@dataclass
class Row:
    label: str
    model: str                      # "teacher" | "student" | "real"
    steps: Optional[int] = None
    nfe: Optional[int] = None       # network evaluations per image
    method: Optional[str] = None    # a student's: "dmad", "lcm", "gan_only", "dm_only"
    seed: Optional[int] = None      # a student's training seed
    budget: str = ""                # "final", "equal compute", "iter <N>" (a student's checkpoint rule)
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

    def get(self, label: str, make: Callable[[], tuple[Row, dict]]) -> tuple[Row, dict]:
        path = self.folder / f"{slug(label)}.json"
        if path.is_file():
            doc = json.loads(path.read_text(encoding="utf-8"))
            with np.load(self.folder / f"{slug(label)}.npz") as z:
                arrays = {k: z[k] for k in z.files}
            return Row(**{**doc, "fd_real_ci": _tuple(doc.get("fd_real_ci"))}), arrays
        row, arrays = make()
        from dmad.contract.runs import atomic_write_bytes, atomic_write_json
        import io

        buf = io.BytesIO()
        np.savez(buf, **arrays)
        atomic_write_bytes(self.folder / f"{slug(label)}.npz", buf.getvalue())
        atomic_write_json(path, asdict(row))  # last: a row is finished when its JSON is there
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
    from dmad.demo.metrics import diversity, evaluate_images, fd_interval, feature_stats, frechet_distance_from_stats

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


# ------------------------------------------------------------------------------- samplers

def sample_teacher(teacher, captions: list[str], noise, steps: int, cfg: float, batch: int, trailing: bool = False):
    """(N, 3, H, W) in [-1, 1], through the teacher family's own diffusers pipeline. `trailing`:
    the few-step baseline's spacing (a flow teacher's Euler sampler gets sigmas 1, ..., 1/steps:
    SD3's default spacing ends at 0.001, which makes 2 steps one step and a tiny one; DDIM gets
    "trailing" timesteps, its best setting at so few steps)."""
    import torch
    from diffusers import DDIMScheduler, FlowMatchEulerDiscreteScheduler

    from dmad.models.families import quiet_pipeline_logs
    from dmad.sample.render import sd_pipeline

    family, den = teacher.family, teacher.denoiser
    few = {}
    if family.flow:
        sched = FlowMatchEulerDiscreteScheduler.from_config(teacher.scheduler.config)
        if trailing:
            few = {"sigmas": [1.0 - i / steps for i in range(steps)]}
    else:
        spacing = {"timestep_spacing": "trailing"} if trailing else {}
        sched = DDIMScheduler.from_config(teacher.scheduler.config, **spacing)
    pipe = sd_pipeline(teacher, sched)
    h, w = noise.shape[-2:]
    f = 2 ** (len(teacher.vae.config.block_out_channels) - 1)
    out = []
    with torch.no_grad(), quiet_pipeline_logs():
        for a in range(0, len(captions), batch):
            lat = family.pipe_latents(noise[a:a + batch]).to(next(den.parameters()).dtype)
            kw = dict(latents=lat, num_inference_steps=steps, height=h * f, width=w * f, **few,
                      **family.pipe_call_kwargs(cfg, den), **family.pipe_prompt_kwargs(teacher.modules, captions[a:a + batch]))
            if family.decode_in_pipeline:
                out.append(pipe(output_type="pt", **kw).images.float() * 2 - 1)
            else:
                lat = pipe(output_type="latent", **kw).images
                out.append(family.decode(teacher.vae, family.unpack_pipe_latents(lat, h, w)))
    return torch.cat(out)


def student_timesteps_for(trained: list[int], steps: int) -> list[int]:
    """A `steps`-step schedule taken from the student's trained timesteps: evenly spaced indices
    from the first (999), e.g. 4 trained -> 1: [999], 2: [999, 499], 4: all."""
    if steps > len(trained) or len(trained) % steps:
        raise UserInputError(f"a {len(trained)}-step student cannot sample with {steps} steps "
                             f"(pick a divisor of {len(trained)})")
    return trained[:: len(trained) // steps]


def sample_student(student, teacher, captions: list[str], noise, timesteps: list[int], batch: int, resolution: int):
    """The student's own few-step sampler (dmad.methods.dmd2.sample_student), as the engine renders."""
    import torch

    from dmad.methods.dmd2 import sample_student as sample

    family = teacher.family
    schedule = family.schedule(teacher.scheduler, resolution)
    out = []
    with torch.no_grad():
        for a in range(0, len(captions), batch):
            cond = family.encode(teacher.modules, captions[a:a + batch], "cpu")
            gen = torch.Generator().manual_seed(a)  # re-noising between steps; fixed per batch

            def x0_fn(x_t, t, cond=cond):
                return family.x0(student, x_t, t, cond, schedule).float()

            x0 = sample(x0_fn, noise[a:a + batch].float(), timesteps, schedule, gen,
                        noise_fn=lambda like, gen=gen: family.fresh_noise(like, gen))
            out.append(family.decode(teacher.vae, x0))
    return torch.cat(out)


def load_student(run_dir: Path, teacher, checkpoint: Optional[Path] = None):
    """(student, training state) of a checkpoint of the run (default: its latest), as it samples."""
    from dmad.contract.config import load_config
    from dmad.contract.runs import RunFolder
    from dmad.models.checkpoint import load_student as load_checkpoint_student
    from dmad.models.checkpoint import read_training_state

    folder = RunFolder(run_dir)
    if checkpoint is None:
        latest = folder.latest_checkpoint()
        if latest is None:
            raise RunFailed(f"the distillation run {run_dir} left no checkpoint")
        checkpoint = latest[1]
    cfg = load_config(folder.config_json)
    student, _ = load_checkpoint_student(teacher, cfg.identity, checkpoint)
    return student, read_training_state(checkpoint)


def passes_total(state) -> Optional[float]:
    """A checkpoint's training compute in teacher-denoiser image-passes (dmad.train.passes), or None
    for a checkpoint written before passes were counted."""
    counts = state.network_passes or {}
    if not counts:
        return None
    return round(sum((c["forward"] + 2 * c["backward"]) * c.get("weight", 1.0) for c in counts.values()), 1)


def timed(fn: Callable):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0
