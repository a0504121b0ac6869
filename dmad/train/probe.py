"""`dmad probe --config FILE [--batch 1,2,4] [--resolution 512,768] [--steps 10] [--warmup 3]
[--out DIR]`: measure what fits, instead of guessing. Torch-free: every point
runs in a process of its own (`dmad probe-point`, dmad/train/probe_point.py), so no allocator state,
cache or fragmentation carries over from one point to the next.

Point 0 is an inference-only baseline (the same networks, no backward) at the first batch and
resolution: what the models and one forward cost before training adds gradients, optimizer
state and saved activations. Then every (batch, resolution) pair, trained for warmup + steps
iterations. Each point records the effective batch, precision, gradient checkpointing, the
framework peak (torch allocator), the device peak (NVML, whole GPU) and the process peak RSS
(three scopes, three columns), the mean step time after warm-up split into data and compute,
the ledger's estimate, and where it ran out of memory (none | loading | vae-encode |
first-forward | first-backward | step-N).

Output in DIR: probe.json (rewritten after every point), probe.csv, probe.md (the trade-off
table and the recommendation). Recommendation order (the field notes' triage): gradient
checkpointing on if it is off; batch size 1 until it runs; the largest resolution that fits with
a margin; gradient accumulation to restore the config's effective batch. docs/memory.md
documents the columns.
"""
from __future__ import annotations

import csv
import io
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from dmad.contract.config import TrainConfig, field_most, load_config
from dmad.contract.memory import PROBE_FILE
from dmad.contract.paths import engine_argv
from dmad.errors import UserInputError
from dmad.contract.runs import atomic_write_json, atomic_write_text

PROBE_VERSION = 1
MARGIN = 0.10  # a point fits when its peak leaves this share of the device free
COLUMNS = ["point", "kind", "pid", "batch", "grad_accum", "effective_batch", "resolution", "precision",
           "gradient_checkpointing", "status", "oom_phase", "framework_peak_gb", "device_peak_gb",
           "process_peak_rss_gb", "step_time_s", "data_time_s", "compute_time_s", "ledger_gb", "error", "run_dir"]


# --batch and --resolution set these config fields; their values must be what the config accepts
PROBED_FIELDS = {"batch": "train_batch_size", "resolution": "resolution"}


def _most(what: str) -> Optional[int]:
    """The config's own upper bound of the field --`what` sets (resources.train_batch_size: 4096)."""
    return field_most("resources", PROBED_FIELDS[what]) if what in PROBED_FIELDS else None


def parse_ints(text: Optional[str], what: str, multiple_of: int = 1) -> Optional[list[int]]:
    if text is None:
        return None
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserInputError(f"--{what} {text!r}: expected comma-separated whole numbers, e.g. 1,2,4") from None
    most = _most(what)
    bad = [v for v in values if v < 1 or v % multiple_of or (most is not None and v > most)]
    if not values or bad:
        need = f"positive multiples of {multiple_of}" if multiple_of > 1 else "positive"
        need += f", at most {most}" if most is not None else ""
        first = str(bad[0]) if bad else ""
        first = first if len(first) <= 20 else first[:20] + "..."  # a 4,000-digit number is not one line
        raise UserInputError(f"--{what} {text[:100]!r}: values must be {need}" + (f" (not {first})" if bad else ""))
    return sorted(set(values))


def _ledger_gb(cfg: TrainConfig, batch: int, resolution: int, info) -> Optional[float]:
    from dmad.memory.ledger import config_ledger, ledger_total

    c = cfg.model_copy(deep=True)
    c.resources.train_batch_size, c.resources.resolution = batch, resolution
    try:
        return round(ledger_total(config_ledger(c, info)), 4)
    except Exception:  # noqa: BLE001 - the estimate is a column, never a reason to stop
        return None


def run_point(config: Path, sets: list[str], kind: str, batch: int, resolution: int, steps: int, warmup: int,
              folder: Path, log) -> dict:
    """One point in a process of its own (`dmad probe-point`): its result.json as a dict, or an error
    result when the process left none (the tail of its stderr.log in `error`)."""
    folder.mkdir(parents=True, exist_ok=True)
    result = folder / "result.json"
    cmd = engine_argv("probe-point", "--config", str(config), "--kind", kind, "--batch", str(batch),
                      "--resolution", str(resolution), "--steps", str(steps), "--warmup", str(warmup),
                      "--run-dir", str(folder / "run"), "--result", str(result))
    for s in sets:
        cmd += ["--set", s]
    with open(folder / "stderr.log", "wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        pid = proc.pid
        code = proc.wait()
    import json

    try:
        found = json.loads(result.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        tail = (folder / "stderr.log").read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:]
        found = {"status": "error", "oom_phase": "none",
                 "error": f"point process exited {code}" + (f": {tail[0]}" if tail else "")}
    found["pid"] = found.get("pid") or pid
    log(f"point {folder.name}: {found['status']}" + (f" ({found['oom_phase']})" if found["status"] == "oom" else ""))
    return found


def fits(p: dict) -> bool:
    """Ran, and (when the device total is known) left MARGIN of the device free."""
    if p.get("status") != "ok":
        return False
    peak, total = p.get("device_peak_gb") or p.get("framework_peak_gb"), p.get("device_total_gb")
    return peak is None or total is None or peak <= (1 - MARGIN) * total


def recommend(points: list[dict], cfg: TrainConfig) -> dict:
    """What to set, in the triage order; `config_changes` are dotted config keys."""
    r = cfg.resources
    target = r.train_batch_size * r.gradient_accumulation_steps
    train = [p for p in points if p["kind"] == "train"]
    ok = [p for p in train if fits(p)]
    steps: list[str] = []
    changes: dict = {}
    if not r.gradient_checkpointing and (not ok or any(p["status"] == "oom" for p in train)):
        steps.append("Turn on gradient checkpointing (resources.gradient_checkpointing): activations are recomputed "
                     "in backward, much less memory for ~30% more time" + ("; then probe again" if not ok else ""))
        changes["resources.gradient_checkpointing"] = True
    if not ok:
        smallest = min((p["batch"] for p in train), default=1)
        if smallest > 1:
            steps.append(f"Use batch size 1 (the smallest probed, {smallest}, did not fit) and probe again")
            changes["resources.train_batch_size"] = 1
        else:
            low = min((p["resolution"] for p in train), default=r.resolution)
            steps.append(f"Even batch 1 at resolution {low} did not fit: probe lower resolutions, or shrink the "
                         f"models (mixed_precision bf16, LoRA student and fake score; see `dmad ledger`)")
        return {"fits": False, "config_changes": changes, "steps": steps}
    best_res = max(p["resolution"] for p in ok)
    best_batch = max(p["batch"] for p in ok if p["resolution"] == best_res)
    accum = max(1, math.ceil(target / best_batch))
    steps.append(f"Batch size {best_batch}: the largest that fits at resolution {best_res}")
    steps.append(f"Resolution {best_res}: the largest that fits" + (f" with a {MARGIN:.0%} margin" if any(
        p.get("device_total_gb") for p in ok) else " (no device total known: ran without running out)"))
    steps.append(f"Gradient accumulation {accum}: effective batch {best_batch} x {accum} = {best_batch * accum} "
                 f"per process (the config asks for {target})")
    changes.update({"resources.train_batch_size": best_batch, "resources.resolution": best_res,
                    "resources.gradient_accumulation_steps": accum})
    return {"fits": True, "config_changes": changes, "steps": steps}


def _fmt(v, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def markdown(report: dict) -> str:
    """The trade-off table and the recommendation (probe.md)."""
    head = ["#", "kind", "batch", "accum", "eff. batch", "res", "precision", "ckpt", "result", "framework peak GiB",
            "device peak GiB", "process peak RSS GiB", "step s", "data s", "compute s", "ledger GiB"]
    lines = [f"# dmad probe: {report['config']}", "",
             f"Device: {report['machine']['device']}; {report['warmup']} warm-up + {report['steps']} measured "
             f"iterations per point; every point in its own process. Memory columns are separate scopes: framework "
             f"(torch allocator peak), device (NVML, whole GPU, all processes), process (host RAM of the point's "
             f"process).", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in report["points"]:
        result = p["status"] if p["status"] != "oom" else f"oom: {p['oom_phase']}"
        lines.append("| " + " | ".join([
            str(p["point"]), p["kind"], str(p["batch"]), str(p["grad_accum"]), str(p["effective_batch"]),
            str(p["resolution"]), p["precision"], "on" if p["gradient_checkpointing"] else "off", result,
            _fmt(p.get("framework_peak_gb")), _fmt(p.get("device_peak_gb")), _fmt(p.get("process_peak_rss_gb")),
            _fmt(p.get("step_time_s"), 3), _fmt(p.get("data_time_s"), 3), _fmt(p.get("compute_time_s"), 3),
            _fmt(p.get("ledger_gb"))]) + " |")
    rec = report.get("recommendation") or {}
    lines += ["", "## Recommendation", ""] + [f"{i}. {s}" for i, s in enumerate(rec.get("steps", []), 1)]
    return "\n".join(lines) + "\n"


def _csv(points: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for p in points:
        w.writerow({k: ("" if p.get(k) is None else p.get(k)) for k in COLUMNS})
    return buf.getvalue()


def _machine() -> dict:
    """The first GPU the points will use (torch numbering), or the CPU."""
    from dmad.train.env import _gpus, cpu_name

    gpus = _gpus()
    if gpus:
        return {"device": gpus[0]["name"], "device_total_gb": gpus[0]["total_memory_gb"]}
    return {"device": f"cpu ({cpu_name()})", "device_total_gb": None}


def run_probe(config: Path, sets: list[str], batches: Optional[list[int]], resolutions: Optional[list[int]],
              steps: int, warmup: int, out: Path, progress: bool = False) -> dict:
    cfg = load_config(config, sets)
    r = cfg.resources
    batches = batches or [r.train_batch_size]
    resolutions = resolutions or [r.resolution]
    from dmad.models.teacher import inspect_teacher  # configs only: the ledger column

    ident = cfg.identity
    info = inspect_teacher(ident.pretrained_model_name_or_path, ident.model_family, ident.teacher_config_dir)
    plan = [("baseline", batches[0], resolutions[0])] + [("train", b, res) for res in resolutions for b in batches]
    out.mkdir(parents=True, exist_ok=True)
    report = {"version": PROBE_VERSION, "config": str(config.resolve()), "steps": steps, "warmup": warmup,
              "machine": _machine(), "points": [], "recommendation": None}

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    world = 1
    for i, (kind, batch, res) in enumerate(plan):
        if progress:
            print(f"progress {i} {len(plan)}", file=sys.stderr, flush=True)
        folder = out / "points" / f"p{i:02d}_{kind}_b{batch}_r{res}"
        found = run_point(Path(config).resolve(), sets, kind, batch, res, steps, warmup, folder, log)
        point = {"point": i, "kind": kind, "batch": batch, "grad_accum": r.gradient_accumulation_steps,
                 "effective_batch": batch * r.gradient_accumulation_steps * world, "resolution": res,
                 "precision": r.mixed_precision, "gradient_checkpointing": r.gradient_checkpointing,
                 "ledger_gb": _ledger_gb(cfg, batch, res, info), "run_dir": str(folder / "run"), **found}
        report["points"].append(point)
        atomic_write_json(out / PROBE_FILE, report)
    report["recommendation"] = recommend(report["points"], cfg)
    atomic_write_json(out / PROBE_FILE, report)
    atomic_write_text(out / "probe.csv", _csv(report["points"]))
    atomic_write_text(out / "probe.md", markdown(report))
    if progress:
        print(f"progress {len(plan)} {len(plan)}", file=sys.stderr, flush=True)
    return report


def main_probe(*, config: str | Path, batch: Optional[str] = None, resolution: Optional[str] = None, steps: int = 10,
               warmup: int = 3, out: Optional[str | Path] = None, overrides: Sequence[str] = (),
               progress: bool = False) -> int:
    """`dmad probe`. `batch`, `resolution`: comma-separated values as typed after --batch and
    --resolution (None: the config's); `out` None: probes/<config>_<time>; `overrides`: --set items."""
    config = Path(config).expanduser()
    batches = parse_ints(batch, "batch")
    resolutions = parse_ints(resolution, "resolution", multiple_of=8)
    if steps < 1 or warmup < 0:
        raise UserInputError("--steps must be at least 1 and --warmup at least 0")
    out = Path(out).expanduser() if out else Path("probes") / f"{config.stem}_{time.strftime('%Y%m%d-%H%M%S')}"
    if out.exists() and any(out.iterdir()):
        raise UserInputError(f"--out {out}: the folder exists and is not empty (a probe never overwrites results)")
    report = run_probe(config, list(overrides), batches, resolutions, steps, warmup, out, progress=progress)
    print(markdown(report), end="")
    print(f"written: {out / PROBE_FILE}, probe.csv, probe.md")
    return 0
