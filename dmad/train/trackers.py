"""observation.report_to: the run's metrics also in TensorBoard or Weights & Biases, through
accelerate's trackers as diffusers' training scripts do (`Accelerator(log_with=..., project_config=...)`,
`init_trackers(project, config=...)`, `log(values, step=iteration)`, then the trackers' finish). The
run folder's own files (metrics.csv, health.csv, events.jsonl) and the app's plots stay the record;
a tracker gets a copy of each metrics row at its iteration and each validation's health signals,
from rank 0 only.

Where they write (in the run folder; wandb keeps its own caches and settings in the user's home):
- tensorboard: <run>/logs/tensorboard/ (accelerate's <logging_dir>/<project>): the scalars, and each
  engine start's config as hyperparameters in sub-folders named by its start time (accelerate's
  layout: the hparams events, and hparams.yml). A resume (or a start again) purges what an earlier
  engine logged after the iteration it continues from (SummaryWriter's purge_step), as metrics.csv
  is cut back.
- wandb: <run>/logs/wandb/, one wandb run per engine start named after the run folder. Offline
  (nothing leaves the machine; `wandb sync` uploads later) unless the user set wandb up here:
  WANDB_MODE or WANDB_API_KEY in the environment, or `wandb login` (an API key in the netrc file
  or wandb's settings file); then wandb's own settings decide.

Torch-free at import: preflight (before torch loads) asks `tracker_problem`.
"""
from __future__ import annotations

import configparser
import contextlib
import importlib.util
import json
import netrc
import numbers
import os
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional
from urllib.parse import urlparse

# accelerate's tensorboard tracker takes torch.utils.tensorboard (the tensorboard package) or tensorboardX
PACKAGES = {"tensorboard": ("tensorboard", "tensorboardX"), "wandb": ("wandb",)}
TENSORBOARD_PROJECT = "tensorboard"  # the folder under <run>/logs
WANDB_PROJECT = "dmad-studio"
WANDB_HOST = "api.wandb.ai"


def tracker_problem(report_to: str) -> Optional[str]:
    """One line when the tracker observation.report_to names cannot run here (its package is not
    installed), else None. Looks for the package without importing it."""
    if report_to == "none":
        return None
    names = PACKAGES[report_to]
    if any(_installed(n) for n in names):
        return None
    return f'observation.report_to "{report_to}": the {names[0]} package is not installed (pip install {names[0]})'


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a broken install; a module in sys.modules without a spec
        return False


def accelerator_args(report_to: str, run_dir: Optional[Path]) -> dict:
    """The Accelerator's tracker arguments: none, or log_with and the run's logs folder (what
    accelerate's tensorboard tracker writes under)."""
    if report_to == "none" or run_dir is None:
        return {}
    from accelerate.utils import ProjectConfiguration

    return {"log_with": report_to,
            "project_config": ProjectConfiguration(project_dir=str(run_dir), logging_dir=str(Path(run_dir) / "logs"))}


def wandb_configured(environ: Mapping[str, str], home: Path) -> bool:
    """Whether the user set wandb up on this machine: WANDB_MODE / WANDB_API_KEY (or an identity
    token file) in the environment, or an API key stored by `wandb login` (the netrc file, or wandb's
    settings file). Only then may a run send anything."""
    if any(environ.get(k) for k in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE")):
        return True
    host = urlparse(environ.get("WANDB_BASE_URL") or f"https://{WANDB_HOST}").hostname or WANDB_HOST
    netrcs = [Path(environ["NETRC"])] if environ.get("NETRC") else [home / ".netrc", home / "_netrc"]
    if any(_netrc_has(p, host) for p in netrcs):
        return True
    config_dir = Path(environ.get("WANDB_CONFIG_DIR") or home / ".config" / "wandb")
    settings = configparser.ConfigParser(interpolation=None)
    try:
        settings.read(config_dir / "settings", encoding="utf-8")
    except (configparser.Error, UnicodeError):
        return False
    return bool(settings.get("default", "api_key", fallback=""))


def _netrc_has(path: Path, host: str) -> bool:
    if not path.is_file():
        return False
    try:
        return netrc.netrc(str(path)).authenticators(host) is not None
    except (netrc.NetrcParseError, OSError, UnicodeError):
        return False


def flat_config(cfg) -> dict[str, Any]:
    """The resolved config as "group.field" -> bool / int / float / str / None (what the trackers'
    hyperparameters take); a list or a nested group's value as JSON text."""
    out: dict[str, Any] = {}
    for group, fields in cfg.model_dump(mode="json").items():
        if not isinstance(fields, dict):
            out[group] = fields
            continue
        for name, value in fields.items():
            out[f"{group}.{name}"] = json.dumps(value) if isinstance(value, (list, dict)) else value
    return out


def _init_kwargs(report_to: str, run_dir: Path, iteration: int) -> tuple[str, dict]:
    """(project name, init_kwargs) for accelerate's init_trackers."""
    if report_to == "tensorboard":
        return TENSORBOARD_PROJECT, {"tensorboard": {"purge_step": iteration + 1}}
    kwargs: dict[str, Any] = {"dir": str(run_dir / "logs"), "name": run_dir.name, "group": run_dir.name,
                              "settings": {"console": "off"}}  # stdout is the event stream
    if not wandb_configured(os.environ, Path.home()):
        kwargs["mode"] = "offline"
    return WANDB_PROJECT, {"wandb": kwargs}


@contextlib.contextmanager
def tracking(accelerator, cfg, run_dir: Path, iteration: int) -> Iterator[None]:
    """The trackers of observation.report_to open (rank 0) from a run's start at `iteration` until it
    ends, however it ends. The trackers' own finish, not accelerator.end_training(): that also
    destroys the process group, which the engine releases itself (dmad.train.run_open) and which the
    other ranks may still be waiting in."""
    report_to = cfg.observation.report_to
    if report_to == "none" or not accelerator.is_main_process:
        yield
        return
    project, kwargs = _init_kwargs(report_to, Path(run_dir), iteration)
    accelerator.init_trackers(project, config=flat_config(cfg), init_kwargs=kwargs)
    try:
        yield
    finally:
        for tracker in accelerator.trackers:
            tracker.finish()
        accelerator.trackers = []
        if report_to == "wandb":  # its service process would outlive the run in a longer-lived process
            import wandb

            wandb.teardown()


def log_values(accelerator, values: Mapping[str, Any], step: int, prefix: str = "") -> None:
    """The numbers of `values` (a metrics row, health signals) at iteration `step`; empty cells left out."""
    if not accelerator.trackers:
        return
    row = {prefix + k: float(v) for k, v in values.items() if isinstance(v, numbers.Real) and not isinstance(v, bool)}
    if row:
        accelerator.log(row, step=step)
