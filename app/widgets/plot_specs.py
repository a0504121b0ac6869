"""Which metric goes in which plot, in which colour, under which words.

Keys are the metric event fields = metrics.csv columns (dmad/train/session.py METRIC_COLUMNS). The
losses are split the way DMAD trains them: the student (generator) steps only every K-th iteration
(`critic_updates_per_generator_update`), so its losses are logged only on those rows; the critic
(fake score + GAN head) steps every iteration. A metric keeps its colour in every plot and run.
An LCM run (distillation.method lcm) logs loss_lcm, grad_norm_g and lr_generator and leaves the DMAD
columns empty: METHOD_PLOTS says which plots each method fills, and the board shows only those (and
any plot another run compared with has data for).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from app.models.methods import DMD2, LCM

# Okabe-Ito-like hues brightened for the dark plot background: distinct for colour-blind readers.
SKY, ORANGE, GREEN, YELLOW, PINK, VERMILION, GREY = ((86, 180, 233), (230, 159, 0), (0, 190, 140), (240, 228, 66),
                                                     (220, 130, 190), (235, 95, 60), (170, 170, 170))
# A sum whose curve lies on its main term (loss_g ~ loss_dm) is drawn as a wide darker band under
# it, so both stay visible where they coincide. Opaque colours: a translucent or dashed pen leaves
# pyqtgraph's fast segmented-line path and costs ~2x per frame.
BAND_RED, BAND_GREEN = (150, 55, 55), (40, 110, 85)

FRAMEWORK_PEAK = "framework peak (torch allocator)"
DEVICE_USED = "device used (NVML / process RSS on CPU)"


@dataclass(frozen=True)
class CurveSpec:
    key: str
    label: str
    color: tuple
    band: bool = False  # wide, drawn under the other curves
    tip: str = ""


@dataclass(frozen=True)
class PlotSpec:
    name: str  # stable id (tests, export file names)
    title: str
    y_label: str
    curves: tuple[CurveSpec, ...]
    x_note: str = ""  # after the x axis label: what the reader must know about where the points are
    tip: str = ""  # the title's tooltip: how to read the plot
    y_fixed: Optional[tuple[float, float]] = None  # a fixed y range (accuracy: 0..1)
    y_guide: Optional[float] = None  # a dotted reference line (accuracy: 0.5, chance)
    y_from_zero: bool = False  # the y axis always includes 0 (memory: 30 MB of noise is not a swing)
    smooth: bool = True  # follows the smoothing control
    log_ok: bool = True  # follows the log-scale control

    def keys(self) -> list[str]:
        return [c.key for c in self.curves]


GENERATOR = PlotSpec(
    "generator", "Generator losses", "loss",
    (CurveSpec("loss_dm", "loss_dm", SKY, tip="distribution matching loss of the student"),
     CurveSpec("loss_g_gan", "loss_g_gan", ORANGE, tip="non-saturating GAN loss of the student"),
     CurveSpec("loss_g", "loss_g = loss_dm + w_g·loss_g_gan", BAND_RED, band=True,
               tip="the student's total loss; w_g = generator_gan_weight (1e-3 by default), so it lies on loss_dm")),
    x_note="points only on student updates (every K-th iteration)",
    tip="The student (generator) steps only every K-th iteration, K = critic_updates_per_generator_update; "
        "the critic steps every iteration. Generator losses are logged on the rows with a student update, "
        "so their curves can end a little before the critic's.")
CRITIC = PlotSpec(
    "critic", "Critic losses", "loss",
    (CurveSpec("loss_fake", "loss_fake", GREEN, tip="the fake score's denoising loss on student samples"),
     CurveSpec("loss_d_gan", "loss_d_gan", YELLOW, tip="GAN head's logistic loss, real vs student; 2 ln 2 = 1.39 at chance"),
     CurveSpec("loss_c", "loss_c = loss_fake + w_d·loss_d_gan", BAND_GREEN, band=True,
               tip="the critic's total loss; w_d = critic_gan_weight")))
ACCURACY = PlotSpec(
    "accuracy", "Discriminator accuracy", "fraction correct (0.5 = chance)",
    (CurveSpec("d_real_acc", "d_real_acc", SKY, tip="on real images: the share the GAN head calls real"),
     CurveSpec("d_fake_acc", "d_fake_acc", ORANGE, tip="on the student's images: the share it calls fake")),
    tip="The GAN head's accuracy on real images and on the student's. 0.5 = chance (dotted line); near 1 on "
        "both for long: the critic wins and the student's GAN signal fades.",
    y_fixed=(0.0, 1.0), y_guide=0.5, log_ok=False)
GRADIENTS = PlotSpec(
    "gradients", "Gradient norms", "norm",
    (CurveSpec("grad_norm_g", "grad_norm_g", SKY, tip="the student's total gradient norm, before clipping"),
     CurveSpec("grad_norm_c", "grad_norm_c", GREEN, tip="the critic's total gradient norm, before clipping"),
     CurveSpec("dm_grad_norm", "dm_grad_norm", PINK,
               tip="mean |distribution-matching gradient| on the student's samples (not a total norm)")),
    tip="grad_norm_g: student, grad_norm_c: critic (total norms before clipping); dm_grad_norm: mean absolute "
        "distribution-matching gradient")
LEARNING_RATE = PlotSpec(
    "lr", "Learning rates", "learning rate",
    (CurveSpec("lr_generator", "lr_generator", SKY), CurveSpec("lr_critic", "lr_critic", GREEN)),
    smooth=False)
MEMORY = PlotSpec(
    "memory", "Memory", "GiB",
    (CurveSpec("mem_peak_alloc_gb", FRAMEWORK_PEAK, SKY, tip="peak of the framework's allocator since the last row"),
     CurveSpec("mem_device_used_gb", DEVICE_USED, ORANGE, tip="the whole device as NVML sees it")),
    y_from_zero=True, smooth=False, log_ok=False)
STEP_TIME = PlotSpec(
    "step_time", "Step time", "seconds per iteration",
    (CurveSpec("step_time_s", "step time (s)", GREEN), CurveSpec("data_time_s", "data time (s)", YELLOW)),
    y_from_zero=True, smooth=False, log_ok=False)

CONSISTENCY = PlotSpec(
    "lcm", "Consistency loss (LCM)", "loss",
    (CurveSpec("loss_lcm", "loss_lcm", SKY,
               tip="consistency loss (lcm_loss_type: L2 or pseudo-Huber) between the student at t_n+k and the "
                   "EMA target at t_n after one guided DDIM step of the teacher"),),
    tip="Latent consistency distillation: d\u00b2 (lcm_loss_type l2) or sqrt(d\u00b2 + c\u00b2) \u2212 c "
        "(huber, c = lcm_huber_c) per latent element, averaged, between the student's output at t_n+k and "
        "the EMA target's at t_n, one guided DDIM step of the teacher apart (k = 1000 / lcm_ddim_timesteps). "
        "The student steps every iteration; there is no critic. The target follows the student "
        "(lcm_target_ema_decay), so this loss measures self-consistency: read it with the samples.")

LOSS_PLOTS = (GENERATOR, CRITIC, CONSISTENCY)
HEALTH_PLOTS = (ACCURACY, GRADIENTS, LEARNING_RATE)
# The plots each distillation method fills (PlotSpec names); a run of one method leaves the others'
# columns empty, so they are not shown for it (an empty critic plot would look like a broken run).
METHOD_PLOTS = {DMD2: ("generator", "critic", "accuracy", "gradients", "lr"),
                LCM: ("lcm", "gradients", "lr")}
