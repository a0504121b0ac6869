"""Which metric goes in which plot, in which colour, under which words.

Keys are the metric event fields = metrics.csv columns (dmad.contract.methods.METRIC_COLUMNS). Each
distillation method describes the plots its own columns go in (dmad.contract.methods: DMAD's
generator, critic and accuracy plots; the peer method's consistency-loss plot); the plots every
method fills (gradient norms, learning rates, memory, step time) are defined here. A metric keeps its
colour in every plot and run. METHOD_PLOTS says which plots each method fills; the board shows only
those (and any plot another run compared with has data for).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from app.models.health import ABSOLUTE, LABELS, SIGNALS
from dmad.contract.methods import METHODS, Plot

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
    page: str = "health"  # the board's page: "losses", or "health" (accuracy, gradients, learning rates)
    word: str = ""  # what the page's tab title says for it

    def keys(self) -> list[str]:
        return [c.key for c in self.curves]


GRADIENTS = PlotSpec(
    "gradients", "Gradient norms", "norm",
    (CurveSpec("grad_norm_g", "grad_norm_g", SKY, tip="the student's total gradient norm, before clipping"),
     CurveSpec("grad_norm_c", "grad_norm_c", GREEN, tip="the critic's total gradient norm, before clipping"),
     CurveSpec("dm_grad_norm", "dm_grad_norm", PINK,
               tip="mean |distribution-matching gradient| on the student's samples (not a total norm)")),
    tip="grad_norm_g: student, grad_norm_c: critic (total norms before clipping); dm_grad_norm: mean absolute "
        "distribution-matching gradient", word="gradients")
LEARNING_RATE = PlotSpec(
    "lr", "Learning rates", "learning rate",
    (CurveSpec("lr_generator", "lr_generator", SKY), CurveSpec("lr_critic", "lr_critic", GREEN)),
    smooth=False, word="LR")
MEMORY = PlotSpec(
    "memory", "Memory", "GiB",
    (CurveSpec("mem_peak_alloc_gb", FRAMEWORK_PEAK, SKY, tip="peak of the framework's allocator since the last row"),
     CurveSpec("mem_device_used_gb", DEVICE_USED, ORANGE, tip="the whole device as NVML sees it")),
    y_from_zero=True, smooth=False, log_ok=False)
STEP_TIME = PlotSpec(
    "step_time", "Step time", "seconds per iteration",
    (CurveSpec("step_time_s", "step time (s)", GREEN), CurveSpec("data_time_s", "data time (s)", YELLOW)),
    y_from_zero=True, smooth=False, log_ok=False,
    tip="Training steps only. Checkpoint writes, validation and sample-now renders and pauses are not steps: "
        "each is a dashed mark at its iteration with what it was and how long it took.")

COLOURS = {"sky": SKY, "orange": ORANGE, "green": GREEN, "yellow": YELLOW, "pink": PINK, "vermilion": VERMILION,
           "grey": GREY, "band_red": BAND_RED, "band_green": BAND_GREEN}


def spec_of(plot: Plot) -> PlotSpec:
    """A method's plot (dmad.contract.methods.Plot) as the board draws it."""
    curves = tuple(CurveSpec(c.key, c.label, COLOURS[c.colour], band=c.band, tip=c.tip) for c in plot.curves)
    return PlotSpec(plot.name, plot.title, plot.y_label, curves, x_note=plot.x_note, tip=plot.tip,
                    y_fixed=plot.y_fixed, y_guide=plot.y_guide, log_ok=plot.log_ok, page=plot.page, word=plot.word)


# Every method's own plots, in the registry's order, then the plots every method fills.
METHOD_OWN_PLOTS = tuple(spec_of(plot) for m in METHODS.values() for plot in m.plots)
SHARED_PLOTS = (GRADIENTS, LEARNING_RATE)
# The plots each distillation method fills (PlotSpec names); a run of one method leaves the others'
# columns empty, so they are not shown for it (an empty critic plot would look like a broken run).
METHOD_PLOTS = {name: tuple(p.name for p in m.plots) + tuple(p.name for p in SHARED_PLOTS)
                for name, m in METHODS.items()}


# The Health page (issue 39): one plot per health signal of the run's samples against the teacher's,
# fed from `health` events and <run>/health.csv (app/models/health.py) as series "health.<signal>";
# the points that raised an alert are the series "health_alert.<signal>".
def health_key(signal: str) -> str:
    return "health." + signal


def health_alert_key(signal: str) -> str:
    return "health_alert." + signal


_HEALTH_TIPS = {
    "diversity": "mean distance between a prompt's images across seeds, student / teacher: low = collapse",
    "saturation": "mean HSV saturation, student / teacher: high = over-saturated, low = washed out",
    "brightness": "mean luma, student / teacher",
    "contrast": "luma standard deviation, student / teacher",
    "colourfulness": "Hasler-Suesstrunk colourfulness, student / teacher",
    "detail": "high-frequency (Laplacian) energy, student / teacher: low = blur, high = over-sharpened",
    "teacher_distance": "mean distance of each image to the teacher's same-prompt same-seed image (0 = identical)",
}
_HEALTH_COLOURS = (SKY, ORANGE, GREEN, YELLOW, PINK, VERMILION, SKY)


def _health_spec(signal: str, colour: tuple) -> PlotSpec:
    ratio = signal not in ABSOLUTE
    tip = _HEALTH_TIPS[signal] + (". Dotted: the teacher's level (1.0)" if ratio else "") + \
        ". Dashed: this run's first health row. Red marks: an alert"
    return PlotSpec("health_" + signal, LABELS[signal], "ratio" if ratio else "distance",
                    (CurveSpec(health_key(signal), LABELS[signal].lower(), colour, tip=_HEALTH_TIPS[signal]),),
                    tip=tip, smooth=False, log_ok=False, page="signals", word="health")


HEALTH_PLOTS = tuple(_health_spec(s, c) for s, c in zip(SIGNALS, _HEALTH_COLOURS))
