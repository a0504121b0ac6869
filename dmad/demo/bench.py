"""`dmad bench distill`: does distillation work? One run, everything side by side.

1. The shipped demo teacher samples a fixed set of prompts x seeds with its own 50-step DDIM
   sampler and CFG (seed set A), again with other seeds (set B: the noise floor of every FD), and
   at 1, 2 and 4 steps with CFG: the equal-cost baseline. Few-step DDIM uses "trailing"
   timestep spacing (999, 499, ... rather than 1, 501, ...), its best setting at so few steps; a
   flow teacher's Euler sampler gets sigmas 1, ..., 1/k (SD3's default spacing ends at 0.001, which
   makes 2 steps one step and a tiny one).
2. The default demo config (resources/configs/demo.json) distils a 4-step student through the
   real command line (`dmad train`, a subprocess, timed wall to wall).
3. The student samples the same prompts and seeds at 1, 2 and 4 steps: its own timesteps
   (999), (999, 499) and (999, 749, 499, 249), each a prefix-spaced subset of what it trained on.
With --methods dmad,lcm, latent consistency distillation (resources/configs/demo_lcm.json, the
peer method) distils the same teacher on the same data after DMAD, under DMAD's wall-clock
budget: the bench starts it with no step limit of its own and sends it the `stop` control command
(checkpoint, then stop) when DMAD's wall time has passed. Its checkpoint at the iteration where it
has used as many teacher evaluations as DMAD did (DMAD: one CFG teacher pass per student step, on
the student's batch; LCM: one per iteration) is evaluated too: the second, equal-teacher-evaluation
budget. LCM's student samples at LCMScheduler's timesteps (999), (999, 499), (999, 759, 499, 259).
4. The shipped evaluator (dmad.demo.evaluator) scores every set: FD to held-out real renders of
   the same captions (a conditional FD: the reference shares the samples' captions),
   FD to the teacher's 50-step set A, prompt adherence, per-prompt diversity; plus network
   evaluations (NFE) and sampling wall time per image.

Every model sees exactly the same initial noise per (prompt, seed). Nothing here is tuned to the
result: prompts, seeds and reference images come from fixed seeds of their own.
"""
from __future__ import annotations

import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional


from dmad.errors import RunFailed, UserInputError

PROMPT_SEED = 2_000_001   # captions of the bench prompts: attributes_for(i, PROMPT_SEED)
NOISE_SEED_A = 3_000_000  # initial noise of (prompt i, seed j): NOISE_SEED_A + i * 1000 + j
NOISE_SEED_B = 4_000_000  # the teacher's second seed set (noise floor)


@dataclass(frozen=True)
class BenchSettings:
    # 512 images per row: at 128 the teacher's own seed-to-seed FD (the noise floor) was as large
    # as the gaps the targets talk about; every FD also gets a bootstrap interval
    prompts: int = 64              # distinct captions
    seeds_per_prompt: int = 8      # samples per caption (diversity needs >= 2)
    real_per_prompt: int = 80      # real renders of each bench caption: FD_real's reference (5,120)
    teacher_steps: int = 50
    baseline_steps: tuple[int, ...] = (1, 2, 4)
    student_steps: tuple[int, ...] = (1, 2, 4)
    batch_size: int = 64
    train_overrides: tuple[str, ...] = ()   # --set items for the distillation (each method's)
    methods: tuple[str, ...] = ("dmad",)   # "dmad", and "lcm" for the peer method beside it
    lcm_step_cap: int = 100   # LCM's max_train_steps, in equal-teacher-pass iterations (DMAD's wall clock stops it first)
    lcm_budget_s: Optional[float] = None   # LCM's wall-clock budget; None: DMAD's wall time (the comparison)


FULL = BenchSettings()
QUICK = BenchSettings(prompts=16, seeds_per_prompt=2, real_per_prompt=32, batch_size=32,
                      train_overrides=("optimization.max_train_steps=60", "observation.checkpointing_steps=60",
                                       "observation.validation_steps=60", "observation.log_every_steps=10"))


@dataclass
class Row:
    model: str                 # "teacher" | "student" | "real"
    label: str
    steps: Optional[int]
    nfe: Optional[int]         # network evaluations per image
    fd_real: float
    fd_teacher: Optional[float]
    adherence: float
    per_attribute: dict
    diversity: Optional[float]
    seconds_per_image: Optional[float]
    notes: str = ""
    fd_real_ci: Optional[tuple] = None     # 95% bootstrap interval (dmad.demo.metrics.fd_interval)
    fd_teacher_ci: Optional[tuple] = None


@dataclass
class BenchResult:
    settings: dict
    machine: dict
    rows: list[Row] = field(default_factory=list)
    distill: dict = field(default_factory=dict)
    distill_lcm: dict = field(default_factory=dict)
    targets: list[dict] = field(default_factory=list)
    wall_time_s: float = 0.0
    comparisons: list[dict] = field(default_factory=list)   # paired differences of rows (compare_rows)
    # label -> (features, per-image correctness) of each row drawn from seed set A: the paired
    # comparisons' inputs (not written to the JSON)
    samples: dict = field(default_factory=dict, repr=False)

    def row(self, label: str) -> Row:
        return next(r for r in self.rows if r.label == label)


def machine_info() -> dict:
    import torch

    from dmad.train.env import cpu_name

    cpu = cpu_name()
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(), "platform": platform.platform(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


# ------------------------------------------------------------------------------- prompts and noise

def bench_prompts(s: BenchSettings) -> list[tuple[str, int, int]]:
    """(caption, prompt index, seed index) for every image, prompt-major."""
    from dmad.demo.shapes import attributes_for, caption

    caps = [caption(attributes_for(i, PROMPT_SEED)) for i in range(s.prompts)]
    return [(caps[i], i, j) for i in range(s.prompts) for j in range(s.seeds_per_prompt)]


def initial_noise(items: list[tuple[str, int, int]], base: int, shape: tuple[int, int, int]):
    """(N, C, h, w) float32: each item's noise from its own CPU generator, so any batch split or
    model sees the same numbers."""
    import torch

    out = torch.empty((len(items), *shape))
    for k, (_, i, j) in enumerate(items):
        out[k] = torch.randn(shape, generator=torch.Generator().manual_seed(base + i * 1000 + j))
    return out


# ------------------------------------------------------------------------------- samplers

def sample_teacher(teacher, captions: list[str], noise, steps: int, cfg: float, batch: int, trailing: bool = False):
    """(N, 3, H, W) in [-1, 1], through the teacher family's own diffusers pipeline."""
    import torch

    from diffusers import DDIMScheduler, FlowMatchEulerDiscreteScheduler

    from dmad.models.families import quiet_pipeline_logs
    from dmad.sample.render import sd_pipeline

    family, den = teacher.family, teacher.denoiser
    few = {}
    if family.flow:  # a flow teacher's own Euler sampler
        sched = FlowMatchEulerDiscreteScheduler.from_config(teacher.scheduler.config)
        if trailing:  # SD3's default spacing ends at sigma 0.001, so 2 steps are 1 step and a tiny one;
            # sigmas 1, ..., 1/steps (the scheduler shifts them as usual, then appends 0) use every step
            few = {"sigmas": [1.0 - i / steps for i in range(steps)]}
    else:  # the teacher's own DDIM config for the reference; trailing spacing for the few-step baselines
        spacing = {"timestep_spacing": "trailing"} if trailing else {}
        sched = DDIMScheduler.from_config(teacher.scheduler.config, **spacing)
    pipe = sd_pipeline(teacher, sched)
    h, w = noise.shape[-2:]
    f = 2 ** (len(teacher.vae.config.block_out_channels) - 1)
    out = []
    with torch.no_grad(), quiet_pipeline_logs():
        for a in range(0, len(captions), batch):
            lat = family.pipe_latents(noise[a:a + batch]).to(next(den.parameters()).dtype)
            kw = dict(latents=lat, num_inference_steps=steps, height=h * f, width=w * f, **few, **family.pipe_call_kwargs(cfg, den),
                      **family.pipe_prompt_kwargs(teacher.modules, captions[a:a + batch]))
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


def sample_student_images(student, teacher, captions: list[str], noise, timesteps: list[int], batch: int,
                          resolution: int):
    """The student's own few-step sampler (dmad.methods.dmd2.sample_student), as the engine renders."""
    import torch

    from dmad.methods.dmd2 import sample_student

    family = teacher.family
    schedule = family.schedule(teacher.scheduler, resolution)
    out = []
    with torch.no_grad():
        for a in range(0, len(captions), batch):
            cond = family.encode(teacher.modules, captions[a:a + batch], "cpu")
            gen = torch.Generator().manual_seed(a)  # re-noising between steps; fixed per batch

            def x0_fn(x_t, t, cond=cond):
                return family.x0(student, x_t, t, cond, schedule).float()

            x0 = sample_student(x0_fn, noise[a:a + batch].float(), timesteps, schedule, gen,
                                noise_fn=lambda like, gen=gen: family.fresh_noise(like, gen))
            out.append(family.decode(teacher.vae, x0))
    return torch.cat(out)


def load_student(run_dir: Path, teacher, checkpoint: Optional[Path] = None):
    """The student of a checkpoint of the run (default: its latest), full or LoRA, as a UNet in
    eval mode; with the checkpoint's training state and iteration."""
    from dmad.models.checkpoint import load_student as load_checkpoint_student
    from dmad.models.checkpoint import read_training_state
    from dmad.contract.config import load_config
    from dmad.contract.runs import RunFolder

    folder = RunFolder(run_dir)
    if checkpoint is None:
        latest = folder.latest_checkpoint()
        if latest is None:
            raise RunFailed(f"the distillation run {run_dir} left no checkpoint")
        checkpoint = latest[1]
    cfg = load_config(folder.config_json)
    student, _ = load_checkpoint_student(teacher, cfg.identity, checkpoint)
    state = read_training_state(checkpoint)
    return student, state, state.iter


# ------------------------------------------------------------------------------- evaluation

def _evaluate(classifier, images, items, real_stats, teacher_stats) -> dict:
    from dmad.demo.metrics import diversity, evaluate_images, fd_interval, feature_stats, frechet_distance_from_stats

    captions = [c for c, _, _ in items]
    res = evaluate_images(classifier, images, captions)
    feats = res["features"]
    stats = feature_stats(feats)
    by_prompt: dict[str, list[int]] = {}
    for k, (_, i, _) in enumerate(items):
        by_prompt.setdefault(str(i), []).append(k)
    return {
        "stats": stats, "features": feats, "correct": res["correct"],
        "fd_real": frechet_distance_from_stats(*stats, *real_stats),
        "fd_real_ci": fd_interval(feats, *real_stats),
        "fd_teacher_ci": None if teacher_stats is None else fd_interval(feats, *teacher_stats),
        "fd_teacher": None if teacher_stats is None else frechet_distance_from_stats(*stats, *teacher_stats),
        "adherence": res["adherence"]["all"], "per_attribute": res["adherence"]["per_attribute"],
        "diversity": diversity({p: feats[idx] for p, idx in by_prompt.items()}) if len(items) > len(by_prompt) else 0.0,
    }


def run_distillation(out: Path, s: BenchSettings, config: Path, log: Callable[[str], None], name: str = "run",
                     extra: tuple[str, ...] = (), stop_after_s: Optional[float] = None) -> dict:
    """`dmad train` in a subprocess, timed wall to wall. Events go to the run folder; stderr to a log.
    `stop_after_s`: send the run the `stop` control command (checkpoint, then stop) once that much
    wall time has passed since it started: a wall-clock budget."""
    from dmad.contract.runlog import append_control

    run_dir = out / name
    argv = [sys.executable, "-m", "dmad", "train", "--config", str(config), "--run-dir", str(run_dir)]
    for item in (*s.train_overrides, *extra):
        argv += ["--set", item]
    log(f"distilling: {' '.join(argv[2:])}" + (f" (stopped after {stop_after_s:.0f} s)" if stop_after_s else ""))
    stderr_path = out / f"{name}.stderr.log" if name != "run" else out / "train.stderr.log"
    t0 = time.perf_counter()
    stop_sent = None
    with open(stderr_path, "wb") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
        while proc.poll() is None:
            time.sleep(0.5)
            if stop_after_s is not None and stop_sent is None and time.perf_counter() - t0 >= stop_after_s:
                if (run_dir / "config.json").is_file():  # the run folder exists: the engine reads control.jsonl
                    append_control(run_dir, "stop")
                    stop_sent = round(time.perf_counter() - t0, 1)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = stderr_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        raise RunFailed(f"the distillation exited with {proc.returncode}: {tail[0]} (log: {stderr_path})")
    return {"wall_time_s": round(wall, 1), "run_dir": str(run_dir), "command": " ".join(argv),
            **({"stop_sent_at_s": stop_sent} if stop_after_s is not None else {})}


def teacher_passes(cfg, state) -> int:
    """Images the guided teacher was run on in a distillation (each is one CFG pass, 2 network
    evaluations for a CFG teacher): DMAD's student steps (generator_steps) x effective batch, or
    LCM's iterations x effective batch."""
    steps = state.iter if cfg.distillation.method == "lcm" else state.generator_steps
    return steps * cfg.effective_batch()


def student_label(k: int, prefix: str = "", suffix: str = "") -> str:
    """"student 1 step", "LCM student 4 steps @ iter 400", ...: a student row's label."""
    return f"{prefix}student {k} step{'s' if k > 1 else ''}{suffix}"


def earlier_checkpoints(run_dir: Path, teacher, final_iter: int):
    """(iteration, student, training state) of each checkpoint of a run before its final one,
    oldest first: the learning curve's points."""
    from dmad.contract.runs import RunFolder

    for it, ckpt in RunFolder(run_dir).list_checkpoints():
        if it != final_iter:
            yield (it, *load_student(run_dir, teacher, ckpt)[:2])


def run_lcm(out: Path, s: BenchSettings, lcm_config: Optional[Path], dmad_cfg, dmad_state, dmad_dist: dict,
            result: BenchResult, teacher, score: Callable, log: Callable[[str], None]) -> None:
    """The peer method: LCM on DMAD's wall-clock budget (stopped when DMAD's wall time has passed),
    with a checkpoint at the iteration where its teacher passes equal DMAD's; both evaluated at
    1, 2 and 4 steps, and the other checkpoints at 4 steps (its learning curve). `score(student,
    state, label_of_k, steps, note)` adds a student's rows (run_bench's)."""
    from dmad.contract.config import load_config
    from dmad.contract.paths import resource

    path = Path(lcm_config) if lcm_config else resource("configs", "demo_lcm.json")
    lcm_cfg = load_config(path, list(s.train_overrides))
    if lcm_cfg.distillation.method != "lcm":
        raise UserInputError(f"--lcm-config {path}: distillation.method is {lcm_cfg.distillation.method!r}, not 'lcm'")
    passes = teacher_passes(dmad_cfg, dmad_state)
    equal = max(1, round(passes / lcm_cfg.effective_batch()))  # LCM iteration with DMAD's teacher passes
    every = equal // 2 if equal % 2 == 0 else equal
    extra = (f"optimization.max_train_steps={s.lcm_step_cap * equal}", f"observation.checkpointing_steps={every}",
             f"observation.validation_steps={every}")
    budget = dmad_dist["wall_time_s"] if s.lcm_budget_s is None else s.lcm_budget_s
    dist = run_distillation(out, s, path, log, name="run_lcm", extra=extra, stop_after_s=budget)
    run_dir = Path(dist["run_dir"])
    student, state, iteration = load_student(run_dir, teacher)
    dist.update(iterations=iteration, student_timesteps=state.student_timesteps, config=str(path),
                teacher_passes=teacher_passes(lcm_cfg, state), dmad_teacher_passes=passes,
                equal_teacher_passes_iter=equal)
    result.distill_lcm = dist
    log(f"LCM: {iteration} iterations in {dist['wall_time_s']:.0f} s (DMAD: {dmad_dist['wall_time_s']:.0f} s); "
        f"equal teacher passes ({passes}) at iteration {equal}")
    at_equal = " @ equal teacher passes"
    equal_note = f"iteration {equal}: {passes} teacher passes, as DMAD's"
    score(student, state, lambda k: student_label(k, "LCM "), s.student_steps, f"{iteration} iterations, DMAD's wall clock")
    if equal == iteration:  # the same student: its rows again under the equal-budget label, not sampled twice
        for k in s.student_steps:
            ts = student_timesteps_for(list(state.student_timesteps), k)
            result.rows.append(replace(result.row(student_label(k, "LCM ")), label=student_label(k, "LCM ", at_equal),
                                       notes=f"timesteps {ts}; {equal_note}"))
            result.samples[student_label(k, "LCM ", at_equal)] = result.samples[student_label(k, "LCM ")]
    elif equal > iteration:
        log(f"LCM stopped at iteration {iteration}, before the equal-teacher-pass iteration {equal}")
    for it, early, st in earlier_checkpoints(run_dir, teacher, iteration):
        if it == equal:
            score(early, st, lambda k: student_label(k, "LCM ", at_equal), s.student_steps, equal_note)
        else:
            score(early, st, lambda k, it=it: student_label(k, "LCM ", f" @ iter {it}"), (max(s.student_steps),),
                  "earlier checkpoint")


def run_bench(s: BenchSettings, out: Path, config: Optional[Path] = None,
              log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True),
              lcm_config: Optional[Path] = None) -> BenchResult:
    import torch

    from dmad.contract.config import load_config
    from dmad.demo.evaluator import (HELDOUT_DATA_SEED, load_evaluator, real_attrs_for_captions, render_real_attrs,
                                     to_unit)
    from dmad.demo.metrics import evaluate_images, fd_interval, feature_stats, frechet_distance_from_stats
    from dmad.demo.shapes import caption as caption_of
    from dmad.models.teacher import load_teacher
    from dmad.contract.paths import resource
    from dmad.contract.prompts import load_prompt_set
    from dmad.sample.render import latent_shape

    t_start = time.perf_counter()
    config = Path(config) if config else resource("configs", "demo.json")
    cfg = load_config(config, list(s.train_overrides))
    teacher = load_teacher(cfg.identity.pretrained_model_name_or_path, cfg.identity.model_family,
                           cfg.identity.teacher_config_dir, dtype=torch.float32)
    ps = load_prompt_set(cfg.observation.prompt_set) if cfg.observation.prompt_set else None
    cfg_scale = ps.cfg if ps is not None and ps.cfg else cfg.distillation.real_guidance_scale
    classifier = load_evaluator()
    result = BenchResult(settings={**asdict(s), "config": str(config), "teacher": cfg.identity.pretrained_model_name_or_path,
                                   "cfg": cfg_scale, "prompt_seed": PROMPT_SEED, "noise_seeds": [NOISE_SEED_A, NOISE_SEED_B],
                                   "real_seed": HELDOUT_DATA_SEED, "real_reference": "renders of the bench captions"},
                         machine=machine_info())

    items = bench_prompts(s)
    captions = [c for c, _, _ in items]
    shape = latent_shape(teacher.vae, cfg.resources.resolution, cfg.resources.resolution)
    noise_a, noise_b = initial_noise(items, NOISE_SEED_A, shape), initial_noise(items, NOISE_SEED_B, shape)

    # real reference: renders of the bench's own captions (a conditional FD compares like with like),
    # with held-out offsets the evaluator never trained on
    def real_renders(per_caption: int, first: int):
        attrs = real_attrs_for_captions(captions[:: s.seeds_per_prompt], per_caption, HELDOUT_DATA_SEED, first)
        return evaluate_images(classifier, to_unit(render_real_attrs(attrs)), [caption_of(a) for a in attrs])

    real_stats = feature_stats(real_renders(s.real_per_prompt, 0)["features"])

    grid: list[tuple[str, object]] = []  # (column label, the first seed's image of the first GRID_PROMPTS prompts)

    def add(model: str, label: str, steps, nfe, images, seconds, teacher_stats, notes="", paired: bool = True) -> dict:
        """A row of `images` (one per item); `paired`: drawn from seed set A, as every row but the
        noise floor's, so it can be compared item by item with the others."""
        if label in grid_labels:
            grid.append((label.replace(" + CFG", "+CFG"), images[:: s.seeds_per_prompt][:GRID_PROMPTS]))
        ev = _evaluate(classifier, images, items, real_stats, teacher_stats)
        if paired:
            result.samples[label] = (ev["features"], ev["correct"])
        result.rows.append(Row(model, label, steps, nfe, ev["fd_real"], ev["fd_teacher"], ev["adherence"],
                               ev["per_attribute"], ev["diversity"],
                               None if seconds is None else seconds / len(items), notes,
                               ev["fd_real_ci"], ev["fd_teacher_ci"]))
        r = result.rows[-1]
        log(f"  {label:<34} FD_real {r.fd_real:8.3f}  FD_teacher {'-' if r.fd_teacher is None else f'{r.fd_teacher:8.3f}'}"
            f"  adherence {r.adherence:6.1%}  diversity {r.diversity:.3f}")
        return ev

    def timed(fn):
        t0 = time.perf_counter()
        images = fn()
        return images, time.perf_counter() - t0

    log(f"bench distill: {len(items)} images per model ({s.prompts} prompts x {s.seeds_per_prompt} seeds), "
        f"teacher CFG {cfg_scale}")
    ref_label = f"teacher {s.teacher_steps} steps + CFG"
    grid_labels = {ref_label, f"teacher {max(s.baseline_steps)} steps + CFG",
                   *(f"student {k} step{'s' if k > 1 else ''}" for k in s.student_steps)}
    if "lcm" in s.methods:
        grid_labels |= {f"LCM student {k} step{'s' if k > 1 else ''}" for k in (min(s.student_steps), max(s.student_steps))}
    images, sec = timed(lambda: sample_teacher(teacher, captions, noise_a, s.teacher_steps, cfg_scale, s.batch_size))
    ref = add("teacher", ref_label, s.teacher_steps, 2 * s.teacher_steps, images, sec, None, "reference (seed set A)")
    ref_stats = ref["stats"]
    result.rows[-1].fd_teacher = 0.0
    images, sec = timed(lambda: sample_teacher(teacher, captions, noise_b, s.teacher_steps, cfg_scale, s.batch_size))
    add("teacher", f"{ref_label}, other seeds", s.teacher_steps, 2 * s.teacher_steps, images, sec, ref_stats,
        "noise floor: same model, seed set B", paired=False)
    for k in s.baseline_steps:
        images, sec = timed(lambda k=k: sample_teacher(teacher, captions, noise_a, k, cfg_scale, s.batch_size,
                                                            trailing=True))
        add("teacher", f"teacher {k} step{'s' if k > 1 else ''} + CFG", k, 2 * k, images, sec, ref_stats,
            "equal-cost baseline (Euler, sigmas 1 .. 1/k)" if teacher.family.flow else "equal-cost baseline (DDIM, trailing)")

    # the scale of FD_real at this N: as many other real renders of the same captions as each row has
    more_eval = real_renders(s.seeds_per_prompt, s.real_per_prompt)
    more_stats = feature_stats(more_eval["features"])
    result.rows.append(Row("real", "real renders (held-out)", None, None,
                           frechet_distance_from_stats(*more_stats, *real_stats),
                           frechet_distance_from_stats(*more_stats, *ref_stats), more_eval["adherence"]["all"],
                           more_eval["adherence"]["per_attribute"], None, None,
                           f"FD_real floor at N = {len(items)}: other real renders of the same captions",
                           fd_interval(more_eval["features"], *real_stats),
                           fd_interval(more_eval["features"], *ref_stats)))

    dist = run_distillation(out, s, config, log)
    student, state, iteration = load_student(Path(dist["run_dir"]), teacher)
    dist.update(iterations=iteration, student_timesteps=state.student_timesteps)
    result.distill = dist
    log(f"distilled {iteration} iterations in {dist['wall_time_s']:.0f} s")
    def score(net, st, label_of: Callable[[int], str], steps, note: str = "") -> None:
        """One student's rows at each of `steps`, on its own trained timesteps."""
        for k in steps:
            ts = student_timesteps_for(list(st.student_timesteps), k)
            images, sec = timed(lambda ts=ts: sample_student_images(net, teacher, captions, noise_a, ts, s.batch_size,
                                                                     cfg.resources.resolution))
            add("student", label_of(k), k, k, images, sec, ref_stats, f"timesteps {ts}" + (f"; {note}" if note else ""))

    score(student, state, student_label, s.student_steps)
    # the learning curve: every earlier checkpoint at the student's full step count
    for it, early, st in earlier_checkpoints(Path(dist["run_dir"]), teacher, iteration):
        score(early, st, lambda k, it=it: student_label(k, suffix=f" @ iter {it}"), (max(s.student_steps),),
              "earlier checkpoint")

    if "lcm" in s.methods:
        run_lcm(out, s, lcm_config, cfg, state, dist, result, teacher, score, log)

    result.comparisons = compare_rows(result, real_stats, s)
    result.targets = check_targets(result, s)
    write_grid(out / "grid.png", grid, captions[:: s.seeds_per_prompt][:GRID_PROMPTS])
    log(f"grid: {out / 'grid.png'}")
    result.wall_time_s = round(time.perf_counter() - t_start, 1)
    return result


# ------------------------------------------------------------------------------- targets and report

GRID_PROMPTS = 8
SHEET = (185, 185, 185)  # unlike every demo background (black, gray 100, white)


def write_grid(path: Path, columns: list[tuple[str, object]], captions: list[str], scale: int = 2) -> None:
    """A picture of the bench: one row per prompt (its first seed), one column per model in the
    order sampled (teacher first), a label above each column and the caption left of each row.
    Images (N, 3, H, W) in [-1, 1], drawn `scale` times larger; written atomically."""
    import textwrap

    from PIL import Image, ImageDraw

    from dmad.demo.shapes import png_bytes
    from dmad.contract.runs import atomic_write_bytes

    if not columns:
        return
    n, side = len(captions), columns[0][1].shape[-1] * scale
    label_w, head_h, pad = 250, 18, 4
    sheet = Image.new("RGB", (label_w + len(columns) * (side + pad), head_h + n * (side + pad)), SHEET)
    draw = ImageDraw.Draw(sheet)
    for c, (label, images) in enumerate(columns):
        x = label_w + c * (side + pad)
        draw.text((x, 3), label, fill=(0, 0, 0))
        arr = ((images[:n].clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 1).cpu().numpy()
        for r in range(len(arr)):
            tile = Image.fromarray(arr[r]).resize((side, side), Image.NEAREST)
            sheet.paste(tile, (x, head_h + r * (side + pad)))
    for r, cap in enumerate(captions):
        draw.multiline_text((4, head_h + r * (side + pad) + 4), "\n".join(textwrap.wrap(cap, 38)), fill=(0, 0, 0))
    atomic_write_bytes(path, png_bytes(sheet))


def comparison_pairs(s: BenchSettings) -> list[tuple[str, str]]:
    """The rows the targets compare, (A, B) with A expected better: DMAD's students against the
    teacher and against LCM's, and LCM's against the teacher's few-step sampling."""
    t4, top = f"teacher {max(s.student_steps)} steps + CFG", f"teacher {s.teacher_steps} steps + CFG"
    pairs = []
    for k in sorted({min(s.student_steps), max(s.student_steps)}, reverse=True):
        pairs += [(student_label(k), student_label(k, "LCM ")),
                  (student_label(k), student_label(k, "LCM ", " @ equal teacher passes"))]
    return pairs + [(student_label(max(s.student_steps)), top), (student_label(max(s.student_steps)), t4),
                    (student_label(max(s.student_steps), "LCM "), t4)]


def compare_rows(r: BenchResult, real_stats, s: BenchSettings) -> list[dict]:
    """Each pair of comparison_pairs whose rows both exist: the paired bootstrap of their FD_real
    and adherence differences (dmad.demo.metrics.fd_difference_interval; the rows share every
    item's caption and initial noise). A difference whose interval excludes 0 is beyond chance
    at this N."""
    from dmad.demo.metrics import fd_difference_interval

    out = []
    for a, b in comparison_pairs(s):
        if a in r.samples and b in r.samples:
            d = fd_difference_interval(r.samples[a][0], r.samples[b][0], *real_stats, r.samples[a][1], r.samples[b][1])
            out.append({"a": a, "b": b, **d})
    return out


def _comparison(r: BenchResult, a: str, b: str) -> Optional[dict]:
    return next((c for c in r.comparisons if c["a"] == a and c["b"] == b), None)


def _paired_text(c: Optional[dict]) -> str:
    if c is None:
        return ""
    lo, hi = c["diff_ci"]
    alo, ahi = c["adherence_diff_ci"]
    return (f"; paired A - B: FD_real {c['diff']:+.2f} [{lo:+.2f}, {hi:+.2f}], "
            f"adherence {c['adherence_diff']:+.1%} [{alo:+.1%}, {ahi:+.1%}]")


def check_targets(r: BenchResult, s: BenchSettings) -> list[dict]:
    """What the demo distillation is meant to reach (the teacher's adherence, the student's adherence
    and FD against the teacher's, the saving in network evaluations), each with its measured numbers;
    targets whose rows are absent are skipped."""
    labels = {x.label: x for x in r.rows}
    teacher = labels.get(f"teacher {s.teacher_steps} steps + CFG")
    out = []

    def target(name: str, ok: bool, measured: str) -> None:
        out.append({"target": name, "met": bool(ok), "measured": measured})

    s4, s1, t4 = labels.get("student 4 steps"), labels.get("student 1 step"), labels.get("teacher 4 steps + CFG")
    if teacher:
        target("teacher adherence >= 90%, every attribute >= 95%",
               teacher.adherence >= 0.9 and min(teacher.per_attribute.values()) >= 0.95,
               f"{teacher.adherence:.1%}; " + ", ".join(f"{k} {v:.1%}" for k, v in teacher.per_attribute.items()))
    if teacher and s4:
        target("4-step student adherence >= teacher's - 3 points", s4.adherence >= teacher.adherence - 0.03,
               f"{s4.adherence:.1%} vs {teacher.adherence:.1%}")
        target("4-step student FD_real <= 1.1 x teacher's", s4.fd_real <= 1.1 * teacher.fd_real,
               f"{s4.fd_real:.2f} vs {teacher.fd_real:.2f} ({s4.fd_real / max(teacher.fd_real, 1e-12):.2f}x)")
        target(">= 25x fewer network evaluations than the teacher with CFG", teacher.nfe / s4.nfe >= 25,
               f"{teacher.nfe} / {s4.nfe} = {teacher.nfe / s4.nfe:.0f}x; sampling "
               f"{teacher.seconds_per_image / s4.seconds_per_image:.1f}x faster per image")
    if s4 and t4:
        target("4-step student FD_real <= 0.5 x teacher's own at 4 steps + CFG", s4.fd_real <= 0.5 * t4.fd_real,
               f"{s4.fd_real:.2f} vs {t4.fd_real:.2f} ({s4.fd_real / max(t4.fd_real, 1e-12):.2f}x)")
    if s1:
        target("1-step student adherence >= 80%", s1.adherence >= 0.8, f"{s1.adherence:.1%}")
    if r.distill:
        target("distillation within 20 minutes", r.distill["wall_time_s"] <= 1200,
               f"{r.distill['wall_time_s'] / 60:.1f} min")
    l4, l1 = labels.get("LCM student 4 steps"), labels.get("LCM student 1 step")
    e4 = labels.get("LCM student 4 steps @ equal teacher passes")

    def beats(a: Row, b: Row, what: str) -> None:
        # beyond chance too, where the rows were compared item by item: both paired intervals exclude 0
        c = _comparison(r, a.label, b.label)
        paired = c is None or (c["diff_ci"][1] < 0 and c["adherence_diff_ci"][0] > 0)
        target(f"DMAD {what} beats LCM's on FD_real and adherence (paired 95% intervals)",
               a.fd_real < b.fd_real and a.adherence > b.adherence and paired,
               f"FD_real {a.fd_real:.2f} vs {b.fd_real:.2f}; adherence {a.adherence:.1%} vs {b.adherence:.1%}"
               + _paired_text(c))

    if s4 and l4:
        beats(s4, l4, "4-step, same wall clock,")
    if s4 and e4:
        beats(s4, e4, "4-step, same teacher passes,")
    if s1 and l1:
        # "a wide margin": LCM's 1-step FD_real at least twice DMAD's, and DMAD's adherence higher
        target("DMAD 1-step beats LCM's by a wide margin (FD_real <= 0.5x LCM's, adherence higher)",
               s1.fd_real <= 0.5 * l1.fd_real and s1.adherence > l1.adherence,
               f"FD_real {s1.fd_real:.2f} vs {l1.fd_real:.2f} ({s1.fd_real / max(l1.fd_real, 1e-12):.2f}x); "
               f"adherence {s1.adherence:.1%} vs {l1.adherence:.1%}" + _paired_text(_comparison(r, s1.label, l1.label)))
    c = _comparison(r, l4.label, t4.label) if l4 and t4 else None
    if c is not None:
        # "clearly": beyond chance, item by item: the paired 95% intervals of both differences exclude 0
        target("LCM 4-step clearly beats the teacher's 4 steps + CFG (paired 95% intervals: FD_real lower, "
               "adherence higher)", c["diff_ci"][1] < 0 and c["adherence_diff_ci"][0] > 0,
               f"FD_real {l4.fd_real:.2f} vs {t4.fd_real:.2f}" + _paired_text(c))
    if l4 and t4:
        # the stricter reading, kept beside it: LCM's own 95% interval lies wholly below the teacher's
        hi, lo = (l4.fd_real_ci or (l4.fd_real, l4.fd_real))[1], (t4.fd_real_ci or (t4.fd_real, t4.fd_real))[0]
        target("LCM 4-step beats the teacher's 4 steps + CFG with the rows' own FD_real intervals apart (stricter)",
               hi < lo, f"{l4.fd_real:.2f} (upper {hi:.2f}) vs {t4.fd_real:.2f} (lower {lo:.2f})")
    return out


def format_table(r: BenchResult) -> str:
    s = r.settings
    m = r.machine
    lines = [
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['gpu'] or 'no GPU'}, torch {m['torch']} "
        f"({m['torch_threads']} thread{'s' if m['torch_threads'] != 1 else ''}), Python {m['python']}.",
        f"{s['prompts']} prompts x {s['seeds_per_prompt']} seeds = {s['prompts'] * s['seeds_per_prompt']} images per row, "
        f"same initial noise per (prompt, seed) in every row; FD on the evaluator's {128}-d features against "
        f"{s['prompts'] * s['real_per_prompt']} held-out real renders of the same {s['prompts']} captions "
        f"({s['real_per_prompt']} each; FD_real) and against the first row (FD_teacher), each with its "
        f"95% bootstrap interval over the row's images. Teacher CFG {s['cfg']}.",
        "",
        "| model | NFE / image | FD_real | FD_teacher | adherence | diversity | sampling s / image | notes |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    def fd(v, ci) -> str:
        return "-" if v is None else f"{v:.2f}" + ("" if ci is None else f" [{ci[0]:.2f}, {ci[1]:.2f}]")

    for x in r.rows:
        fdr, fdt = fd(x.fd_real, x.fd_real_ci), fd(x.fd_teacher, x.fd_teacher_ci)
        spi = "-" if x.seconds_per_image is None else f"{x.seconds_per_image:.4f}"
        div = "-" if x.diversity is None else f"{x.diversity:.3f}"
        nfe = "-" if x.nfe is None else str(x.nfe)
        lines.append(f"| {x.label} | {nfe} | {fdr} | {fdt} | {x.adherence:.1%} | {div} | {spi} | {x.notes} |")
    if r.distill:
        d = r.distill
        lines += ["", f"Distillation: {d['iterations']} iterations, student timesteps {d['student_timesteps']}, "
                      f"{d['wall_time_s']:.0f} s wall ({d['wall_time_s'] / 60:.1f} min). Whole bench: {r.wall_time_s:.0f} s."]
    if r.distill_lcm:
        d = r.distill_lcm
        lines += [f"LCM ({Path(d['config']).name}): {d['iterations']} iterations, student timesteps "
                  f"{d['student_timesteps']}, {d['wall_time_s']:.0f} s wall ("
                  + (f"stop sent at {d['stop_sent_at_s']} s, DMAD's wall time" if d.get("stop_sent_at_s") is not None
                     else "ended by its step cap before the wall-clock budget")
                  + f"); {d['teacher_passes']} teacher passes against DMAD's {d['dmad_teacher_passes']}, "
                  f"equal at iteration {d['equal_teacher_passes_iter']}."]
    if r.comparisons:
        lines += ["", "Paired differences (A - B over the same items: caption and initial noise; 95% paired "
                      "bootstrap intervals; an interval that excludes 0 is a difference beyond chance at this N):", "",
                  "| A | B | FD_real A - B | adherence A - B |", "|---|---|---:|---:|"]
        lines += [f"| {c['a']} | {c['b']} | {c['diff']:+.2f} [{c['diff_ci'][0]:+.2f}, {c['diff_ci'][1]:+.2f}] | "
                  f"{c['adherence_diff']:+.1%} [{c['adherence_diff_ci'][0]:+.1%}, {c['adherence_diff_ci'][1]:+.1%}] |"
                  for c in r.comparisons]
    if r.targets:
        lines += ["", "| target | met | measured |", "|---|---|---|"]
        lines += [f"| {t['target']} | {'yes' if t['met'] else 'NO'} | {t['measured']} |" for t in r.targets]
    return "\n".join(lines)


def to_json(r: BenchResult) -> dict:
    return {"settings": r.settings, "machine": r.machine, "rows": [asdict(x) for x in r.rows],
            "distill": r.distill, "distill_lcm": r.distill_lcm, "targets": r.targets, "wall_time_s": r.wall_time_s,
            "comparisons": r.comparisons}


METHODS = ("dmad", "lcm")


def parse_methods(text: str) -> tuple[str, ...]:
    """--methods: a comma-separated list that includes dmad (every comparison is against it)."""
    methods = tuple(m.strip() for m in text.split(",") if m.strip())
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise UserInputError(f"--methods {text!r}: unknown method {unknown[0] if unknown else '(none)'!r}; "
                             f"choose from {', '.join(METHODS)}")
    if "dmad" not in methods:
        raise UserInputError(f"--methods {text!r}: must include dmad (the budget and comparison are DMAD's)")
    return tuple(m for m in METHODS if m in methods)


def main_distill(quick: bool, json_out: Optional[str], out_dir: Optional[str], config: Optional[str],
                 methods: str = "dmad", lcm_config: Optional[str] = None) -> int:
    """The `dmad bench distill` command: prints the table on stdout, progress on stderr."""
    from dataclasses import replace

    from dmad.contract.runs import atomic_write_json

    s = replace(QUICK if quick else FULL, methods=parse_methods(methods))
    if lcm_config and "lcm" not in s.methods:
        raise UserInputError("--lcm-config needs --methods dmad,lcm")
    if out_dir:
        out = Path(out_dir).expanduser().resolve()
        if out.exists() and any(out.iterdir()):
            raise UserInputError(f"--out {out}: folder exists and is not empty")
        out.mkdir(parents=True, exist_ok=True)
        result = run_bench(s, out, Path(config) if config else None, lcm_config=Path(lcm_config) if lcm_config else None)
    else:
        with tempfile.TemporaryDirectory(prefix="dmad-bench-") as tmp:
            result = run_bench(s, Path(tmp), Path(config) if config else None,
                               lcm_config=Path(lcm_config) if lcm_config else None)
    if json_out:
        atomic_write_json(Path(json_out), to_json(result))
    print(format_table(result), flush=True)
    return 0
