"""The distillation methods (the config's distillation.method) as the app names and shows them, without Qt.

dmd2 is DMAD (distribution matching against the teacher's guided score and a trained fake score, plus
a GAN head: a critic that steps every iteration); lcm is latent consistency distillation, the peer
method (a consistency loss, L2 or pseudo-Huber, against an EMA target after one guided DDIM step of the teacher: no
fake score, no GAN head, no critic). Each method leaves some settings unused; the Config form greys
them out, the runs table and the config diff say so. A test checks every key here against the schema.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from dmad.contract.config import Distillation
from dmad.contract.jsonfile import read_json_or_problem

DMD2, LCM = "dmd2", "lcm"
METHOD_KEY = ("distillation", "method")
DEFAULT = Distillation.model_fields["method"].default  # what a config without the key means
SHORT = {DMD2: "DMAD", LCM: "LCM"}                      # a suffix, a column
LABELS = {DMD2: "DMAD (dmd2)", LCM: "LCM (lcm)"}        # the form's combo box: the name and the value
WHAT = {DMD2: "distribution matching + adversarial (DMD2): a fake score and a GAN head, the critic, "
              "train beside the student",
        LCM: "latent consistency distillation (LCM): a consistency loss (L2 or pseudo-Huber) against an EMA target "
             "after one guided DDIM step of the teacher; no fake score, no GAN head, no critic"}

_CRITIC = (("identity", "fake_score"), ("optimization", "critic_lr"),
           ("distillation", "critic_updates_per_generator_update"), ("distillation", "dm_weight"),
           ("distillation", "generator_gan_weight"),
           ("distillation", "critic_gan_weight"), ("distillation", "gan_head_placement"),
           ("distillation", "min_timestep"), ("distillation", "max_timestep"),
           ("resources", "share_frozen_base"))  # LCM's LoRA student is its own copy (no fake score to share with)
_LCM_ONLY = (("distillation", "lcm_ddim_timesteps"), ("distillation", "lcm_loss_type"),
             ("distillation", "lcm_huber_c"), ("distillation", "lcm_target_ema_decay"))
UNUSED: dict[str, tuple[tuple[str, ...], ...]] = {DMD2: _LCM_ONLY, LCM: _CRITIC}
# metrics.csv columns (= metric event fields) a run of the method leaves empty
EMPTY_COLUMNS = {DMD2: ("loss_lcm",),
                 LCM: ("loss_dm", "loss_g_gan", "loss_g", "loss_fake", "loss_d_gan", "loss_c", "dm_grad_norm",
                       "d_real_acc", "d_fake_acc", "grad_norm_c", "lr_critic")}


def method_of(config: Any) -> Any:
    """The method a raw config names: its distillation.method as written (an invalid value stays as it
    is, for the engine to reject), DEFAULT when the key is absent."""
    group = config.get("distillation") if isinstance(config, dict) else None
    return group.get("method", DEFAULT) if isinstance(group, dict) else DEFAULT


def short_name(method: Any) -> str:
    """"DMAD" / "LCM"; a value the app does not know is shown as it is."""
    return SHORT.get(method, str(method))


def label(method: Any) -> str:
    return LABELS.get(method, str(method))


def unused_note(method: Any) -> str:
    return f"unused with method {method}"


def unused_fields(method: Any) -> dict[tuple[str, ...], str]:
    """{key: "unused with method lcm"} for the settings `method` does not read ({} for an unknown one)."""
    return {key: unused_note(method) for key in UNUSED.get(method, ())}


def is_unused(method: Any, dotted: str) -> bool:
    """"optimization.critic_lr" is not read by method "lcm"."""
    return tuple(dotted.split(".")) in UNUSED.get(method, ())


def read_method(config_path: Path) -> Optional[str]:
    """The method of a config file (a run's config.json), None when it cannot be read. A few hundred
    bytes: read on the GUI thread like status.json, and as bounded (read_json_or_problem)."""
    raw, problem = read_json_or_problem(config_path)
    if problem:
        return None
    method = method_of(raw)
    return method if isinstance(method, str) else None
