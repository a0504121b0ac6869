"""The distillation methods as the app and the engine both describe them, torch-free: each method's
name and label, the metrics.csv columns its iterations log and the plots they go in, its optimizers,
its settings (and so the settings it does not read); and the config group that chooses and tunes
them (`Distillation`, the config's distillation section).

METHODS is the registry of these descriptions. The engine's half of a method (its networks, its
iteration, its checkpoint files, its memory ledger lines) is the unit of the same name in
dmad/methods/ (dmad.methods.UNITS); the app reads only this module (the Config form's method combo
and greyed-out settings, the Training plots, the runs table, the config diff).

dmad is DMAD: distribution matching against the teacher's guided score and a trained fake score,
plus a GAN head (the critic: fake score + GAN head, stepping every iteration; the student every
K-th). lcm is latent consistency distillation, the peer method: a consistency loss against an EMA
target after one guided DDIM step of the teacher; no fake score, no GAN head, no critic.

Until 2026-12 DMAD's value was "dmd2" (the paper it follows); configs, run folders and samples
written then still say so, and `canonical_method` reads that word as "dmad" everywhere.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal, Optional

from pydantic import Field, field_validator, model_validator

from dmad.contract.group import Group

Key = tuple[str, str]  # (group, field) of the config


@dataclass(frozen=True)
class Curve:
    key: str     # a metrics.csv column (= metric event field)
    label: str
    colour: str  # the app's palette: sky, orange, green, yellow, pink, vermilion, grey, band_red, band_green
    band: bool = False  # drawn wide, under the other curves (a sum that lies on its main term)
    tip: str = ""


@dataclass(frozen=True)
class Plot:
    name: str    # stable id (tests, export file names)
    title: str
    y_label: str
    curves: tuple[Curve, ...]
    page: Literal["losses", "health"] = "losses"  # the Training panel's page: losses | accuracy, gradients, LR
    word: str = "losses"  # what the page's tab title says for it
    x_note: str = ""  # after the x axis label: where the points are
    tip: str = ""  # how to read the plot
    y_fixed: Optional[tuple[float, float]] = None
    y_guide: Optional[float] = None  # a dotted reference line
    log_ok: bool = True  # follows the log-scale control


@dataclass(frozen=True)
class MethodInfo:
    name: str    # distillation.method
    short: str   # in a column, after a preset's name ("CPU demo · DMAD")
    what: str    # one line: what it trains (tooltips)
    columns: tuple[str, ...]  # the metrics.csv columns its iterations log, in METRIC_COLUMNS' order
    optimizers: tuple[str, ...]  # lr_<name> columns, optimizer_<name> checkpoint files
    plots: tuple[Plot, ...]  # where its columns are drawn (the app adds gradients, LR, memory, step time)
    settings: tuple[Key, ...]  # what it alone reads; the other methods leave these unused
    article: str = "a"  # "a DMAD run", "an LCM run"

    @property
    def label(self) -> str:
        """The name and the value: "DMAD (dmad)", "LCM (lcm)"."""
        return f"{self.short} ({self.name})"

    def a_run(self) -> str:
        return f"{self.article} {self.short} run"


# --------------------------------------------------------------------------- DMAD

GENERATOR = Plot(
    "generator", "Generator losses", "loss",
    (Curve("loss_dm", "loss_dm", "sky", tip="distribution matching loss of the student"),
     Curve("loss_g_gan", "loss_g_gan", "orange", tip="non-saturating GAN loss of the student"),
     Curve("loss_reg", "loss_reg", "pink",
           tip="regression loss (regression_weight > 0): the student's x0 against the guided teacher's ODE end "
               "from the same input, mean squared error in latent space"),
     Curve("loss_g", "loss_g = loss_dm + w_g·loss_g_gan + w_r·loss_reg", "band_red", band=True,
           tip="the student's total loss; w_g = generator_gan_weight (1e-3 by default), w_r = regression_weight "
               "(0 by default), so it lies on loss_dm unless the regression loss is on")),
    x_note="points only on student updates (every K-th iteration)",
    tip="The student (generator) steps only every K-th iteration, K = critic_updates_per_generator_update; "
        "the critic steps every iteration. Generator losses are logged on the rows with a student update, "
        "so their curves can end a little before the critic's.")
CRITIC = Plot(
    "critic", "Critic losses", "loss",
    (Curve("loss_fake", "loss_fake", "green", tip="the fake score's denoising loss on student samples"),
     Curve("loss_d_gan", "loss_d_gan", "yellow", tip="GAN head's logistic loss, real vs student; 2 ln 2 = 1.39 at chance"),
     Curve("loss_c", "loss_c = loss_fake + w_d·loss_d_gan", "band_green", band=True,
           tip="the critic's total loss; w_d = critic_gan_weight")))
ACCURACY = Plot(
    "accuracy", "Discriminator accuracy", "fraction correct (0.5 = chance)",
    (Curve("d_real_acc", "d_real_acc", "sky", tip="on real images: the share the GAN head calls real"),
     Curve("d_fake_acc", "d_fake_acc", "orange", tip="on the student's images: the share it calls fake")),
    page="health", word="accuracy",
    tip="The GAN head's accuracy on real images and on the student's. 0.5 = chance (dotted line); near 1 on "
        "both for long: the critic wins and the student's GAN signal fades.",
    y_fixed=(0.0, 1.0), y_guide=0.5, log_ok=False)

DMAD = MethodInfo(
    name="dmad", short="DMAD",
    what="distribution matching + adversarial (DMD2): a fake score and a GAN head, the critic, train beside the "
         "student",
    columns=("loss_dm", "loss_g_gan", "loss_g", "loss_fake", "loss_d_gan", "loss_c", "dm_grad_norm", "d_real_acc",
             "d_fake_acc", "grad_norm_g", "grad_norm_c", "loss_reg"),
    optimizers=("generator", "critic"),
    plots=(GENERATOR, CRITIC, ACCURACY),
    settings=(("identity", "fake_score"), ("optimization", "critic_lr"),
              ("distillation", "critic_updates_per_generator_update"), ("distillation", "dm_weight"),
              ("distillation", "generator_gan_weight"), ("distillation", "critic_gan_weight"),
              ("distillation", "gan_head_placement"), ("distillation", "min_timestep"),
              ("distillation", "max_timestep"), ("distillation", "real_guidance_max_timestep"),
              ("distillation", "regression_weight"),
              ("distillation", "regression_images"), ("distillation", "regression_teacher_steps"),
              ("resources", "share_frozen_base")))  # the student and fake score on one frozen base

# --------------------------------------------------------------------------- LCM

CONSISTENCY = Plot(
    "lcm", "Consistency loss (LCM)", "loss",
    (Curve("loss_lcm", "loss_lcm", "sky",
           tip="consistency loss (lcm_loss_type: L2 or pseudo-Huber) between the student at t_n+k and the "
               "EMA target at t_n after one guided DDIM step of the teacher"),),
    tip="Latent consistency distillation: d\u00b2 (lcm_loss_type l2) or sqrt(d\u00b2 + c\u00b2) \u2212 c "
        "(huber, c = lcm_huber_c) per latent element, averaged, between the student's output at t_n+k and "
        "the EMA target's at t_n, one guided DDIM step of the teacher apart (k = 1000 / lcm_ddim_timesteps). "
        "The student steps every iteration; there is no critic. The target follows the student "
        "(lcm_target_ema_decay), so this loss measures self-consistency: read it with the samples.")

LCM = MethodInfo(
    name="lcm", short="LCM", article="an",
    what="latent consistency distillation (LCM): a consistency loss (L2 or pseudo-Huber) against an EMA target "
         "after one guided DDIM step of the teacher; no fake score, no GAN head, no critic",
    columns=("loss_lcm", "grad_norm_g"),
    optimizers=("generator",),
    plots=(CONSISTENCY,),
    settings=(("distillation", "lcm_ddim_timesteps"), ("distillation", "lcm_loss_type"),
              ("distillation", "lcm_huber_c"), ("distillation", "lcm_target_ema_decay")))

# --------------------------------------------------------------------------- the registry

# distillation.method -> its description; the order is the app's (combo box, plots) and the columns'.
METHODS: dict[str, MethodInfo] = {m.name: m for m in (DMAD, LCM)}
DEFAULT_METHOD = DMAD.name  # what a config without distillation.method means
LEGACY_NAMES = {"dmd2": DMAD.name}  # older files' words for a method


def canonical_method(name):
    """The method a config, a run folder or a samples meta.json names, older words ("dmd2") read as
    today's ("dmad"); anything else as it is (an unknown value stays for the validator to reject)."""
    return LEGACY_NAMES.get(name, name) if isinstance(name, str) else name


def _union(parts) -> list[str]:
    return list(dict.fromkeys(x for part in parts for x in part))


# metrics.csv: the same columns for every method (a row leaves another method's empty), one row every
# log_every_steps; the metric event carries the same fields (and mem_device_total_gb).
# Columns added after runs were first written go at the end (ADDED_COLUMNS, oldest first), so every
# older column keeps its place and a run an older engine started goes on with its own header
# (dmad.contract.runlog.CsvAppender.continued).
ADDED_COLUMNS = ["loss_reg"]
LOSS_COLUMNS = [c for c in _union(m.columns for m in METHODS.values()) if c not in ADDED_COLUMNS]
LR_COLUMNS = [f"lr_{name}" for name in _union(m.optimizers for m in METHODS.values())]
METRIC_COLUMNS = (["iter"] + LOSS_COLUMNS + ["step_time_s", "data_time_s", "mem_peak_alloc_gb",
                                              "mem_device_used_gb"] + LR_COLUMNS + ADDED_COLUMNS)


def filled_columns(info: MethodInfo) -> tuple[str, ...]:
    return info.columns + tuple(f"lr_{name}" for name in info.optimizers)


def empty_columns(method: str) -> tuple[str, ...]:
    """The loss and learning-rate columns a run of `method` leaves empty (another method's); () for
    an unknown one."""
    info = METHODS.get(method)
    if info is None:
        return ()
    filled = set(filled_columns(info))
    return tuple(c for c in LOSS_COLUMNS + LR_COLUMNS if c not in filled)


def own_columns(method: str) -> tuple[str, ...]:
    """The columns only `method` fills: a logged value in one of them says which method ran."""
    others = {c for name, m in METHODS.items() if name != method for c in filled_columns(m)}
    return tuple(c for c in filled_columns(METHODS[method]) if c not in others)


def unused_settings(method: str) -> tuple[Key, ...]:
    """The settings `method` does not read: every other method's own ({} for an unknown method)."""
    info = METHODS.get(method)
    if info is None:
        return ()
    own = set(info.settings)
    return tuple(dict.fromkeys(k for m in METHODS.values() if m is not info for k in m.settings if k not in own))


# --------------------------------------------------------------------------- the config group

def lcm_grid(num_ddim_timesteps: int, num_train_timesteps: int = 1000) -> list[int]:
    """The skipping-step grid latent consistency distillation trains on, ascending: k * (T // N) - 1
    for k = 1 .. N (diffusers' DDIMSolver and LCMScheduler: N = 50 gives 19, 39, ..., 999)."""
    step = num_train_timesteps // num_ddim_timesteps
    return [k * step - 1 for k in range(1, num_ddim_timesteps + 1)]


def lcm_sampling_timesteps(steps: int, num_ddim_timesteps: int, num_train_timesteps: int = 1000) -> list[int]:
    """What LCMScheduler.set_timesteps(steps) picks from that grid (original_inference_steps = N):
    indices floor(linspace(0, N, steps, endpoint=False)) of the grid read from 999 down
    (N = 50, 4 steps: 999, 759, 499, 259)."""
    grid = lcm_grid(num_ddim_timesteps, num_train_timesteps)[::-1]
    return [grid[int(i * num_ddim_timesteps / steps)] for i in range(steps)]


class Distillation(Group):
    """How the student is made: DMAD = distribution matching + adversarial (DMD2), or latent
    consistency distillation (LCM) as the peer method."""

    method: Literal[tuple(METHODS)] = Field(  # type: ignore[valid-type]  # the registry's names
        DEFAULT_METHOD, description="Distillation method. dmad: DMAD (distribution matching against the teacher's guided "
                            "score and a trained fake score, plus a GAN term). lcm: latent consistency distillation "
                            "(LCM paper, diffusers' train_lcm_distill scripts): a skipping-step DDIM solver with the "
                            "guided teacher, a consistency loss (L2 or pseudo-Huber) against an EMA target of the student; no fake "
                            "score, no GAN, critic settings unused.")
    student_steps: int = Field(1, ge=1, le=4, description="Sampling steps of the student (1-4).")
    student_timesteps: Optional[list[Annotated[int, Field(ge=0, le=999)]]] = Field(
        None, min_length=1, max_length=4, description="The student's timesteps, descending, in [0, 999]. Empty: evenly spaced from 999 "
                          "(4 steps: 999, 749, 499, 249); with lcm, what LCMScheduler picks from the solver's grid "
                          "(4 steps: 999, 759, 499, 259).")
    real_guidance_scale: float = Field(3.0, ge=1.0, le=100.0, description="CFG scale of the teacher (real score); "
                                                                           "with lcm, the solver's fixed guidance scale.")
    # DMAD's
    critic_updates_per_generator_update: int = Field(
        5, ge=1, le=100, description="Two-time-scale rule: the critic steps every iteration, the student every K-th (DMD2: 5).")
    dm_weight: float = Field(1.0, ge=0.0, le=100.0, description="Weight of the distribution-matching loss in the "
                                                                "student loss; 0: the GAN alone trains the student "
                                                                "(an ablation: the teacher then only shapes the critic's "
                                                                "start).")
    generator_gan_weight: float = Field(1e-3, ge=0.0, le=100.0, description="Weight of the GAN loss in the student loss.")
    critic_gan_weight: float = Field(1e-2, ge=0.0, le=100.0, description="Weight of the GAN loss in the critic loss.")
    gan_head_placement: Literal["fake_score_bottleneck", "teacher_bottleneck"] = Field(
        "fake_score_bottleneck", description="Where the GAN head reads features: the fake score's UNet bottleneck "
                                             "(trained with it) or the frozen teacher's.")
    min_timestep: int = Field(20, ge=0, le=999, description="Lowest timestep for distribution matching and fake-score training.")
    max_timestep: int = Field(980, ge=1, le=999, description="Highest timestep for distribution matching and fake-score training.")
    real_guidance_max_timestep: int = Field(
        999, ge=0, le=999, description="Distribution matching guides the teacher (real_guidance_scale) only at "
                                       "timesteps up to this one; above it the real score is the teacher's plain "
                                       "conditional prediction (a guidance interval). 999: guided everywhere, as "
                                       "DMD2. What a caption leaves open (background, colour) is decided at the "
                                       "highest noise levels, where guidance narrows it most.")
    ema_decay: Optional[float] = Field(None, gt=0.0, lt=1.0, description="Student EMA decay (e.g. 0.999); empty: no EMA.")
    regression_weight: float = Field(
        0.0, ge=0.0, le=100.0, description="Weight of the regression loss in the student loss (DMD's paired loss): "
                                           "the student's x0 against where the guided teacher's own ODE takes the "
                                           "same input, squared error in latent space. 0: off.")
    regression_images: int = Field(2, ge=1, le=4096, description="How many images of each student micro-batch get "
                                                                 "the teacher's ODE target (its cost: the teacher's "
                                                                 "CFG passes along the ODE, per image).")
    regression_teacher_steps: int = Field(25, ge=1, le=1000, description="The teacher's ODE steps over the whole "
                                                                         "range (999 to 0); from a lower student "
                                                                         "timestep the same spacing, fewer steps.")
    # LCM's
    lcm_ddim_timesteps: int = Field(50, ge=2, le=1000, description="lcm: timesteps of the skipping-step DDIM solver "
                                                                   "(N; each solver step skips 1000 / N timesteps).")
    lcm_loss_type: Literal["huber", "l2"] = Field(
        "huber", description="lcm: the consistency loss (the scripts' --loss_type). l2: the squared error; huber: "
                             "the pseudo-Huber sqrt(d^2 + c^2) - c with c = lcm_huber_c.")
    lcm_huber_c: float = Field(0.001, gt=0.0, le=10.0, description="lcm: c of the pseudo-Huber consistency loss "
                                                                   "sqrt(d^2 + c^2) - c (lcm_loss_type huber).")
    lcm_target_ema_decay: float = Field(0.95, ge=0.0, lt=1.0, description="lcm: decay of the target network, an EMA "
                                                                          "of the student updated after each step.")

    @field_validator("method", mode="before")
    @classmethod
    def _today_s_name(cls, v):
        return canonical_method(v)  # "dmd2" in an older config or run folder is "dmad"

    @model_validator(mode="after")
    def _consistent(self) -> "Distillation":
        if self.min_timestep >= self.max_timestep:
            raise ValueError(f"min_timestep ({self.min_timestep}) must be below max_timestep ({self.max_timestep})")
        if self.method == DMAD.name and self.dm_weight == 0 and self.generator_gan_weight == 0:
            raise ValueError("dm_weight and generator_gan_weight are both 0: nothing would train the student")
        ts = self.student_timesteps
        if ts is not None:
            if len(ts) != self.student_steps:
                raise ValueError(f"student_timesteps has {len(ts)} entries but student_steps is {self.student_steps}")
            if any(t < 0 or t > 999 for t in ts) or any(a <= b for a, b in zip(ts, ts[1:])):
                raise ValueError(f"student_timesteps must be strictly descending within [0, 999]; got {ts}")
            if self.method == "lcm":
                grid = set(lcm_grid(self.lcm_ddim_timesteps))
                off = [t for t in ts if t not in grid]
                if off:
                    near = [min(sorted(grid), key=lambda g: abs(g - t)) for t in off]  # a tie: the lower
                    raise ValueError(f"with method lcm, student_timesteps must lie on the solver's grid of "
                                     f"{self.lcm_ddim_timesteps} timesteps (k * {1000 // self.lcm_ddim_timesteps} - 1); "
                                     f"{off} are not (nearest {near})")
        return self

    def resolved_student_timesteps(self) -> list[int]:
        if self.student_timesteps is not None:
            return list(self.student_timesteps)
        if self.method == "lcm":
            return lcm_sampling_timesteps(self.student_steps, self.lcm_ddim_timesteps)
        return [999 - i * 1000 // self.student_steps for i in range(self.student_steps)]
