"""Reading what `dmad probe` writes (the format: docs/memory.md; `dmad ledger --json` is read by
dmad.contract.memory.parse_ledger).

Plain Python, no Qt: the probe's probe.json is read in a pool worker (app/engine/background.py). These
are the engine's numbers; the app only checks their shape and keeps their memory scopes apart
(framework: torch's allocator in one process; device: NVML, every process on the GPU; process: host
RSS of the point's process).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from dmad.contract.memory import PROBE_FILE


@dataclass(frozen=True)
class ProbePoint:
    point: int
    kind: str
    batch: int
    grad_accum: int
    effective_batch: int
    resolution: int
    precision: str
    gradient_checkpointing: bool
    status: str
    oom_phase: str
    framework_peak_gb: Optional[float]
    device_peak_gb: Optional[float]
    process_peak_rss_gb: Optional[float]
    step_time_s: Optional[float]
    data_time_s: Optional[float]
    compute_time_s: Optional[float]
    ledger_gb: Optional[float]
    error: Optional[str]
    run_dir: str

    @property
    def is_oom(self) -> bool:
        return self.status == "oom"

    def status_text(self) -> str:
        if self.status == "oom":
            return f"OOM in {self.oom_phase}" if self.oom_phase and self.oom_phase != "none" else "OOM"
        if self.status == "error":
            return f"error: {self.error}" if self.error else "error"
        return self.status


@dataclass
class ProbeResult:
    folder: Path
    config: str
    steps: Optional[int]
    warmup: Optional[int]
    device: str
    device_total_gb: Optional[float]
    points: list[ProbePoint]
    fits: Optional[bool] = None
    config_changes: dict = field(default_factory=dict)
    steps_text: list[str] = field(default_factory=list)

    def memory_scope(self) -> str:
        """The one scope the peak-memory chart shows: framework when any point measured it (a GPU
        run), else process RSS (a CPU run). Never a mix."""
        return "framework" if any(p.framework_peak_gb is not None for p in self.points) else "process"


def _opt_float(v: Any) -> Optional[float]:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _point(d: dict) -> ProbePoint:
    batch = int(d["batch"])
    accum = int(d.get("grad_accum") or 1)
    return ProbePoint(
        point=int(d.get("point", 0)), kind=str(d.get("kind") or "train"), batch=batch, grad_accum=accum,
        effective_batch=int(d.get("effective_batch") or batch * accum), resolution=int(d["resolution"]),
        precision=str(d.get("precision") or ""), gradient_checkpointing=bool(d.get("gradient_checkpointing")),
        status=str(d.get("status") or "?"), oom_phase=str(d.get("oom_phase") or "none"),
        framework_peak_gb=_opt_float(d.get("framework_peak_gb")), device_peak_gb=_opt_float(d.get("device_peak_gb")),
        process_peak_rss_gb=_opt_float(d.get("process_peak_rss_gb")), step_time_s=_opt_float(d.get("step_time_s")),
        data_time_s=_opt_float(d.get("data_time_s")), compute_time_s=_opt_float(d.get("compute_time_s")),
        ledger_gb=_opt_float(d.get("ledger_gb")), error=d.get("error") if isinstance(d.get("error"), str) else None,
        run_dir=str(d.get("run_dir") or ""))


def load_probe(folder: Path) -> ProbeResult:
    """Worker side: DIR/probe.json (or the file itself). ValueError / OSError with one line."""
    folder = Path(folder)
    path = folder if folder.is_file() else folder / PROBE_FILE
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"no {PROBE_FILE} in {path.parent}") from None
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {path}: {e}") from None
    except RecursionError:
        raise ValueError(f"cannot read {path}: nested too deeply") from None
    if not isinstance(d, dict) or d.get("version") != 1 or not isinstance(d.get("points"), list):
        raise ValueError(f"{path} is not a probe result of version 1")
    try:
        points = [_point(p) for p in d["points"]]
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"malformed probe point in {path}: {type(e).__name__} {e}") from None
    machine = d.get("machine") if isinstance(d.get("machine"), dict) else {}
    rec = d.get("recommendation") if isinstance(d.get("recommendation"), dict) else {}
    changes = rec.get("config_changes") if isinstance(rec.get("config_changes"), dict) else {}
    steps = [str(s) for s in rec.get("steps") or [] if isinstance(s, str)]
    return ProbeResult(folder=path.parent, config=str(d.get("config") or ""), steps=d.get("steps"),
                       warmup=d.get("warmup"), device=str(machine.get("device") or "?"),
                       device_total_gb=_opt_float(machine.get("device_total_gb")), points=points,
                       fits=rec.get("fits") if isinstance(rec.get("fits"), bool) else None,
                       config_changes=changes, steps_text=steps)


def parse_int_list(text: str, what: str) -> list[int]:
    """"1, 2,4" -> [1, 2, 4]; ValueError (one line) on anything else."""
    items = [t for t in text.replace(" ", ",").split(",") if t]
    try:
        values = [int(t) for t in items]
    except ValueError:
        raise ValueError(f"{what}: whole numbers separated by commas, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise ValueError(f"{what}: at least one positive number, got {text!r}")
    return values
