"""`dmad bench distill`: does distillation keep the teacher's quality *and* its distribution, and
how does DMAD compare with its peer and with its own parts? The protocol (docs/benchmarks.md):

1. A set (dmad.demo.bench_sets): the held-out set by default (captions, noise and real references
   nothing was tuned on), or the tuning set where defaults are chosen. Each has full captions
   (FD to real renders, adherence) and under-specified ones (total-variation distance to the
   data's conditional, coverage, stated accuracy, precision and recall: dmad.demo.coverage).
2. The teacher: 50 steps + CFG (noise set A; again with set B: the noise floor), and 1, 2, 4
   steps + CFG (the equal-cost baseline). Real renders of the same captions: the floor of every
   FD and every total-variation distance at this sample size.
3. For each training seed (resources.seed) and method: a distillation through the real command
   line (`dmad train`, a subprocess, timed wall to wall), its final checkpoint (the rule, fixed in
   advance) sampled at 1, 2 and 4 steps, and its earlier checkpoints at 4 steps (the learning
   curve). Methods (bench_runs.METHODS): DMAD (resources/configs/demo.json); its peer, latent
   consistency distillation (bench_runs.PEER), stopped when DMAD's wall time of the same seed has
   passed and also read at the checkpoint where its counted training compute (every network pass:
   dmad.train.passes) equals DMAD's; and DMAD's two parts alone: the GAN without distribution
   matching (gan_only) and distribution matching without the GAN (dm_only).
4. dmad.demo.bench_report: per-row numbers, means and standard deviations over training seeds,
   "beats" tests whose intervals carry the training-seed variance, and the targets.

Every model sees the same initial noise per item, so rows are paired item by item. Rows and
training runs are kept in the output folder (--out): the same command run again goes on from the
first row or run that is not finished.
"""
from __future__ import annotations

import json
import math
import os
import platform
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional

from dmad.contract.paths import resource
from dmad.demo.bench_rows import Row, RowKey, RowStore, evaluate, prompt_captions
from dmad.demo.bench_runs import METHODS, PARTS, PEER, Method, legacy_manifest, passes_total, peer_readings, plan_peer, train
from dmad.demo.bench_sampling import load_student, sample_student, sample_teacher, student_timesteps_for, timed
from dmad.errors import UserInputError


@dataclass(frozen=True)
class BenchSettings:
    set: str = "heldout"            # dmad.demo.bench_sets.SETS
    prompts: int = 64               # full captions
    seeds_per_prompt: int = 8       # samples of each (512 images: at 128 the noise floor was as large as the gaps)
    under_captions: int = 16        # under-specified captions
    under_seeds: int = 64           # samples of each (1,024 images: TV's floor ~0.08 at 64)
    real_per_prompt: int = 80       # real renders of each full caption: FD_real's reference (5,120)
    teacher_steps: int = 50
    baseline_steps: tuple[int, ...] = (1, 2, 4)
    student_steps: tuple[int, ...] = (1, 2, 4)
    batch_size: int = 64
    train_overrides: tuple[str, ...] = ()   # --set items for every distillation
    methods: tuple[str, ...] = ("dmad",)    # of METHODS; dmad is always first (budgets and comparisons are its)
    training_seeds: tuple[int, ...] = (0, 1, 2)
    peer_step_cap: int = 100                # the peer's max_train_steps, in equal-compute iterations (the wall clock stops it first)
    peer_budget_s: Optional[float] = None   # the peer's wall-clock budget; None: DMAD's wall time of the same seed
    teacher_cfg: Optional[float] = None     # the teacher rows' guidance scale; None: teacher_guidance's default


# The bench's distillations validate with demo_v3, the demo's prompt set without health seeds
# (demo_v4 renders each prompt 4 times for the health signals): the bench scores students with its
# own evaluator, and the peer's "same wall clock" budget is DMAD's training time, which extra validation
# renders would inflate.
NO_HEALTH = (f"observation.prompt_set={resource('prompt_sets', 'demo_v3.json')}",)
FULL = BenchSettings(train_overrides=NO_HEALTH)
QUICK = BenchSettings(prompts=16, seeds_per_prompt=2, under_captions=4, under_seeds=16, real_per_prompt=32,
                      batch_size=32, training_seeds=(0,),
                      train_overrides=NO_HEALTH + ("optimization.max_train_steps=60", "observation.checkpointing_steps=60",
                                                   "observation.validation_steps=60", "observation.log_every_steps=10"))


@dataclass
class BenchResult:
    settings: dict
    machine: dict
    rows: list[Row] = field(default_factory=list)
    runs: dict = field(default_factory=dict)        # "<method>-seed<k>" -> the distillation's facts
    summary: list[dict] = field(default_factory=list)
    comparisons: list[dict] = field(default_factory=list)
    targets: list[dict] = field(default_factory=list)
    wall_time_s: float = 0.0


def machine_info() -> dict:
    import torch

    from dmad.train.env import cpu_name

    return {"cpu": cpu_name(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(), "platform": platform.platform(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


# ------------------------------------------------------------------------------- the bench

@dataclass
class _Bench:
    """What every step of a bench shares."""

    s: BenchSettings
    out: Path
    log: Callable[[str], None]
    teacher: object
    classifier: object
    refs: object
    noise: dict           # "A" / "B" -> (full noise, under noise)
    store: RowStore
    result: BenchResult
    cfg_scale: float
    resolution: int
    teacher_stats: Optional[tuple] = None
    grid: list = field(default_factory=list)   # (label, first seed's image of the first GRID_PROMPTS prompts)

    def add(self, key: RowKey, make_images: Callable, **facts) -> Row:
        """The row of `key`, from the store or by sampling `make_images()` -> (full, under, seconds);
        `facts`: the row's own (nfe, iteration, notes, ...)."""
        def make():
            (full, under), sec = timed(make_images)
            numbers, arrays = evaluate(self.classifier, self.refs, full, under, self.teacher_stats)
            from dmad.demo.bench_pictures import GRID_PROMPTS

            arrays["grid"] = full[:: self.s.seeds_per_prompt][:GRID_PROMPTS].numpy()  # the first seed of each
            n = len(full) + (0 if under is None else len(under))
            return Row.at(key, **facts, **numbers, seconds_per_image=sec / n), arrays

        made, arrays = self.store.get(key, make)
        self.result.rows.append(made)
        if "grid" in arrays:
            self.grid.append((made.key, arrays["grid"]))
        self.log(f"  {made.label:<44} FD_real {made.fd_real:7.2f}  adherence {made.adherence:6.1%}"
                 + (f"  TV {made.tv:.3f}  covered {made.coverage:.0%}" if made.tv is not None else ""))
        return made


def teacher_guidance(s: BenchSettings, prompt_set, cfg) -> float:
    """The guidance scale of the teacher rows (and of the baselines at 1/2/4 steps): --teacher-cfg,
    else the prompt set's that the distillations validate with (after the bench's own overrides:
    demo_v3, CFG 3), else the config's real-score scale. The students keep their config's."""
    if s.teacher_cfg is not None:
        return s.teacher_cfg
    return prompt_set.cfg if prompt_set is not None and prompt_set.cfg else cfg.distillation.real_guidance_scale


def run_bench(s: BenchSettings, out: Path, config: Optional[Path] = None, peer_config: Optional[Path] = None,
              log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)) -> BenchResult:
    import torch

    from dmad.contract.config import load_config
    from dmad.contract.paths import resource
    from dmad.contract.prompts import load_prompt_set
    from dmad.demo.bench_report import compare_seeds, summarize
    from dmad.demo.bench_rows import make_references, references_digest, training_digest
    from dmad.demo.bench_sets import SETS, full_items, initial_noise, under_items
    from dmad.demo.evaluator import load_evaluator
    from dmad.models.teacher import load_identity_teacher
    from dmad.sample.render import latent_shape

    t_start = time.perf_counter()
    config = Path(config) if config else resource("configs", "demo.json")
    cfg = load_config(config, list(s.train_overrides))
    teacher = load_identity_teacher(cfg.identity, dtype=torch.float32)
    ps = load_prompt_set(cfg.observation.prompt_set) if cfg.observation.prompt_set else None
    cfg_scale = teacher_guidance(s, ps, cfg)
    sset = SETS[s.set]
    full, under = full_items(sset, s.prompts, s.seeds_per_prompt), under_items(sset, s.under_captions, s.under_seeds)
    classifier = load_evaluator()
    log(f"bench distill ({s.set} set): {len(full)} full-caption and {len(under)} under-specified images a row; "
        f"references rendered")
    shape = latent_shape(teacher.vae, cfg.resources.resolution, cfg.resources.resolution)
    noise = {k: (initial_noise(full, base, shape), initial_noise(under, base, shape))
             for k, base in (("A", sset.noise_a), ("B", sset.noise_b))}
    result = BenchResult(settings={**asdict(s), "config": str(config), "teacher": cfg.identity.pretrained_model_name_or_path,
                                   "cfg": cfg_scale, "seeds": asdict(sset), "checkpoint_rule": "final"},
                         machine=machine_info())
    refs = make_references(classifier, full, under, s.real_per_prompt, sset.real)
    # what bench.json's settings cannot see (_check_out compares those before any work): the sets'
    # seeds, the teacher and guidance as loaded, what the references and the students are made of
    protocol = {"seeds": asdict(sset), "teacher": cfg.identity.pretrained_model_name_or_path, "cfg": cfg_scale,
                "references": references_digest(refs),
                "training": training_digest([config, peer_config or resource("configs", METHODS[PEER].config)],
                                            list(s.train_overrides))}
    b = _Bench(s, out, log, teacher, classifier, refs, noise, RowStore(out / "rows", protocol), result, cfg_scale,
               cfg.resources.resolution)
    _teacher_rows(b)
    _real_row(b, sset)
    for seed in s.training_seeds:
        dmad = _train(b, METHODS["dmad"], seed, config)
        _student_rows(b, METHODS["dmad"], seed, dmad, curve=True)
        for key in PARTS:
            if key in s.methods:
                _student_rows(b, METHODS[key], seed, _train(b, METHODS[key], seed, config))
        if PEER in s.methods:
            _peer(b, seed, dmad, peer_config)
    result.summary = summarize(result.rows)
    result.comparisons = compare_seeds(result.rows, s)
    from dmad.demo.bench_targets import check_targets

    result.targets = check_targets(result, s)
    from dmad.demo.bench_pictures import GRID_PROMPTS, write_grid, write_under_grid

    write_grid(out / "grid.png", b.grid, [c for c, _, _ in full][:: s.seeds_per_prompt][:GRID_PROMPTS],
               s.training_seeds[0], (RowKey("teacher", s.teacher_steps), RowKey("teacher", max(s.baseline_steps))),
               (min(s.student_steps), max(s.student_steps)))
    write_under_grid(b, out / "grid_under.png", sset)
    result.wall_time_s = round(time.perf_counter() - t_start, 1)
    return result


def _teacher_rows(b: _Bench) -> None:
    """The teacher's own sampler + CFG: at its steps on noise set A (every FD_teacher's reference) and
    B (FD's noise floor), and at each baseline step count (the equal-cost baseline)."""
    s = b.s
    full_caps = [c for c, _, _ in b.refs.full_items]
    under_caps = [c for c, _, _ in b.refs.under_items]

    def teacher_images(noise_key: str, steps: int, trailing: bool = False, under: bool = True):
        nf, nu = b.noise[noise_key]
        return (sample_teacher(b.teacher, full_caps, nf, steps, b.cfg_scale, s.batch_size, trailing),
                sample_teacher(b.teacher, under_caps, nu, steps, b.cfg_scale, s.batch_size, trailing) if under else None)

    top = RowKey("teacher", s.teacher_steps)
    ref = b.add(top, lambda: teacher_images("A", s.teacher_steps), nfe=2 * s.teacher_steps,
                notes="reference (noise set A)")
    import numpy as np

    from dmad.demo.metrics import feature_stats

    with np.load(b.store.path(top).with_suffix(".npz")) as z:
        b.teacher_stats = feature_stats(z["full_features"])
    b.result.rows[-1] = replace(ref, fd_teacher=0.0)
    b.add(replace(top, noise="B"), lambda: teacher_images("B", s.teacher_steps, under=False), nfe=2 * s.teacher_steps,
          notes="FD's noise floor: the same model, noise set B (full captions only)")
    spacing = "Euler, sigmas 1 .. 1/k" if b.teacher.family.flow else "DDIM, trailing"
    for k in s.baseline_steps:
        b.add(RowKey("teacher", k), lambda k=k: teacher_images("A", k, trailing=True), nfe=2 * k,
              notes=f"equal-cost baseline ({spacing})")


def _real_row(b: _Bench, sset) -> None:
    """Other real renders of the same captions, as many as a model's row has: the floor of FD_real,
    of TV (a finite sample of the data itself), and the data's own diversity, precision and recall."""
    from dmad.demo.bench_sets import real_images

    s = b.s
    full_caps = prompt_captions(b.refs.full_items)
    under_caps = prompt_captions(b.refs.under_items)
    b.add(RowKey("real"),
          lambda: (real_images(full_caps, s.seeds_per_prompt, sset.real, first=s.real_per_prompt)[0],
                   real_images(under_caps, s.under_seeds, sset.real, first=20_000)[0]),
          notes=f"other real renders of the same captions: {s.seeds_per_prompt} and {s.under_seeds} a caption")


def _student_rows(b: _Bench, method: Method, seed: int, run: dict, curve: bool = False,
                  checkpoint: Optional[Path] = None, budget: str = "final", steps: Optional[tuple] = None) -> None:
    """A distillation's final checkpoint (or `checkpoint`, read under `budget`) at every student step
    count (or `steps`), and with `curve` its earlier checkpoints at the most steps."""
    from dmad.contract.runs import RunFolder

    run_dir = Path(run["run_dir"])
    student, state = load_student(run_dir, b.teacher, checkpoint)
    _score(b, method, seed, student, state, steps or b.s.student_steps, budget)
    if curve:
        for it, ckpt in RunFolder(run_dir).list_checkpoints():
            if it != state.iter:
                early, st = load_student(run_dir, b.teacher, ckpt)
                _score(b, method, seed, early, st, (max(b.s.student_steps),), f"iter {it}")


def _score(b: _Bench, method: Method, seed: int, student, state, steps, budget: str) -> None:
    s = b.s
    full_caps = [c for c, _, _ in b.refs.full_items]
    under_caps = [c for c, _, _ in b.refs.under_items]
    nf, nu = b.noise["A"]
    for k in steps:
        ts = student_timesteps_for(list(state.student_timesteps), k)
        b.add(RowKey("student", k, method.key, seed, budget),
              lambda ts=ts: (sample_student(student, b.teacher, full_caps, nf, ts, s.batch_size, b.resolution),
                             sample_student(student, b.teacher, under_caps, nu, ts, s.batch_size, b.resolution)),
              nfe=k, iteration=state.iter, network_passes=passes_total(state), notes=f"timesteps {ts}")


# ------------------------------------------------------------------------------- distillations

def _train(b: _Bench, method: Method, seed: int, config: Path, extra: tuple[str, ...] = (),
           control: Optional[Callable] = None, facts_extra: Optional[dict] = None) -> dict:
    run = train(b.out, method, seed, config, b.log, b.s.train_overrides, extra, control, facts_extra)
    b.result.runs[f"{method.key}-seed{seed}"] = run
    return run


def _peer(b: _Bench, seed: int, dmad: dict, peer_config: Optional[Path]) -> None:
    """The peer (bench_runs.PEER) with two budgets in one run (dmad.demo.bench_runs.plan_peer): both budgets' checkpoints read
    at every step count, the others at the most steps (its learning curve)."""
    from dmad.contract.paths import resource
    from dmad.demo.bench_runs import two_budgets

    method = METHODS[PEER]
    plan = plan_peer(Path(peer_config) if peer_config else resource("configs", method.config), b.s.train_overrides,
                    dmad, not b.teacher.family.guidance_embedded(b.teacher.denoiser), b.s.peer_step_cap, b.s.peer_budget_s)
    run = _train(b, method, seed, plan.config, plan.overrides(), control=two_budgets(plan.budget_s, plan.equal),
                 facts_extra=plan.facts(dmad))
    budgets, others = peer_readings(run, plan.equal)
    for budget, it, ckpt in budgets:
        if ckpt is not None:
            _student_rows(b, method, seed, run, checkpoint=ckpt, budget=budget)
        else:
            b.log(f"{method.name}, seed {seed}: no checkpoint at iteration {it} ({budget})")
    for it, ckpt in others.items():
        _student_rows(b, method, seed, run, checkpoint=ckpt, budget=f"iter {it}", steps=(max(b.s.student_steps),))


# ------------------------------------------------------------------------------- command line

def parse_methods(text: str) -> tuple[str, ...]:
    """--methods: a comma-separated list of METHODS (dmad is always run: every budget and comparison is its)."""
    methods = tuple(m.strip() for m in text.split(",") if m.strip())
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise UserInputError(f"--methods {text!r}: unknown method {unknown[0] if unknown else '(none)'!r}; "
                             f"choose from {', '.join(METHODS)}")
    if "dmad" not in methods:
        raise UserInputError(f"--methods {text!r}: must include dmad (the budgets and comparisons are DMAD's)")
    return tuple(m for m in METHODS if m in methods)


def parse_seeds(text: str) -> tuple[int, ...]:
    try:
        seeds = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        seeds = ()
    if not seeds or any(x < 0 or x > 2**31 for x in seeds) or len(set(seeds)) != len(seeds):
        raise UserInputError(f"--seeds {text!r}: a comma-separated list of distinct training seeds, e.g. 0,1,2")
    return seeds


def parse_guidance(text: str) -> float:
    """--teacher-cfg: a finite scale >= 1 (1: no guidance)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value < 1:
        raise UserInputError(f"--teacher-cfg {text!r}: a finite guidance scale of at least 1 (1: no guidance)")
    return value


def main_distill(quick: bool, json_out: Optional[str], out_dir: Optional[str], config: Optional[str],
                 methods: str = "dmad", peer_config: Optional[str] = None, set_name: str = "heldout",
                 seeds: Optional[str] = None, teacher_cfg: Optional[str] = None) -> int:
    """The `dmad bench distill` command: prints the tables on stdout, progress on stderr. Outputs
    are checked before any work (the JSON's folder exists; --out is new, or an earlier bench of the
    same settings to go on with)."""
    from dmad.contract.diskspace import reporting_disk_full
    from dmad.contract.jsonfile import check_output_file, check_output_folder
    from dmad.contract.runs import atomic_write_json
    from dmad.demo.bench_report import format_tables
    from dmad.demo.bench_sets import SETS

    if set_name not in SETS:
        raise UserInputError(f"--set {set_name!r}: choose from {', '.join(SETS)}")
    s = replace(QUICK if quick else FULL, methods=parse_methods(methods), set=set_name)
    if seeds is not None:
        s = replace(s, training_seeds=parse_seeds(seeds))
    if teacher_cfg is not None:
        s = replace(s, teacher_cfg=parse_guidance(teacher_cfg))
    if peer_config and PEER not in s.methods:
        raise UserInputError(f"--peer-config needs {PEER} in --methods")
    if json_out:
        check_output_file(Path(json_out).expanduser().resolve(), "--json")
    if out_dir:
        out = Path(out_dir).expanduser().resolve()
        check_output_folder(out, "--out", new=False)  # below a file, /proc, unwritable: before the work
        _check_out(out, s, config, peer_config)
        result = run_bench(s, out, Path(config) if config else None, Path(peer_config) if peer_config else None)
    else:
        with tempfile.TemporaryDirectory(prefix="dmad-bench-") as tmp:
            result = run_bench(s, Path(tmp), Path(config) if config else None,
                               Path(peer_config) if peer_config else None)
    from dmad.demo.bench_report import to_json

    if json_out:
        target = Path(json_out).expanduser().resolve()
        with reporting_disk_full(f"--json {target.name}", target.parent):
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(target, to_json(result))
    print(format_tables(result), flush=True)
    return 0


def _check_out(out: Path, s: BenchSettings, config: Optional[str], peer_config: Optional[str]) -> None:
    """--out: a new folder, or the folder of an earlier bench with the same settings (it goes on from
    there; its finished rows are read back). The methods and training seeds may grow or change: each
    row and run is kept under its own name, so more seeds or methods only add rows. Anything else is
    refused before the work starts, naming what differs."""
    from dmad.contract.runs import atomic_write_json

    manifest = out / "bench.json"
    wanted = {"settings": asdict(s), "config": config, "peer_config": peer_config}
    wanted = json.loads(json.dumps(wanted))  # tuples as lists, as read back
    if out.exists() and any(out.iterdir()):
        try:
            found = legacy_manifest(json.loads(manifest.read_text(encoding="utf-8")))
        except (OSError, ValueError, RecursionError, AttributeError):
            raise UserInputError(f"--out {out}: folder exists, is not empty and is not a bench's") from None
        growable = {"methods", "training_seeds"}
        have, want = found.get("settings", {}), wanted["settings"]
        differ = sorted(k for k in set(have) | set(want) if k not in growable and have.get(k) != want.get(k))
        differ += [k for k in ("config", "peer_config") if found.get(k) != wanted.get(k)]
        if differ:
            raise UserInputError(f"--out {out}: holds a bench with other settings ({', '.join(differ)}); "
                                 "choose a new folder")
        if found != wanted:
            atomic_write_json(manifest, wanted)
        return
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(manifest, wanted)
