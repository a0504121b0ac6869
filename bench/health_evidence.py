"""Do the health signals see what the bench's evaluator sees? (issue 39, item 3)

Renders every checkpoint of a `dmad bench distill` folder's runs (DMAD, its parts and LCM) again with a health prompt set
(default: the demo's demo_v4, 4 seeds a prompt), and the teacher once at the same seeds, computes
the seven health signals of each checkpoint exactly as a run's validation does
(dmad.sample.health.health_signals), replays each run's checkpoints through the alert rule
(alerts_for, with the history before it), and joins the bench's own scores of the same
checkpoints (FD_real, adherence; 4-step rows). Prints a table and the rank correlation of each
signal with FD_real and adherence, and writes it all as JSON.

    python bench/health_evidence.py --bench /path/to/bench --out /tmp/health-evidence

Costs no training: on 2 CPU cores about 10 s per checkpoint (model load and 56 renders at 64 px).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dmad.contract.prompts import load_prompt_set  # noqa: E402
from dmad.sample import health  # noqa: E402
from dmad.sample.command import main_sample  # noqa: E402
from dmad.train.health_check import folder_images  # noqa: E402

ROW_NAME = {"dmad": "dmad-4-steps{at}-seed-{seed}", "dm_only": "dmad-dm-alone-4-steps{at}-seed-{seed}",
            "gan_only": "dmad-gan-alone-4-steps{at}-seed-{seed}"}
RUN = re.compile(r"^(dmad|dm_only|gan_only|lcm)-seed(\d+)$")  # LCM's checkpoints have no bench row of their own


def render(run: Path, checkpoint: str, prompt_set: Path, out: Path) -> Path:
    dest = out / ("teacher" if checkpoint == "teacher" else f"iter_{checkpoint}")
    if not (dest / "meta.json").is_file():
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            code = main_sample(run=run, checkpoint=checkpoint, prompt_set=prompt_set, out=out)
        if code != 0 or not (dest / "meta.json").is_file():
            raise SystemExit(f"health_evidence: dmad sample of {run} {checkpoint} failed ({code})")
    return dest


def bench_row(rows: Path, method: str, seed: int, it: int, final: int) -> dict:
    at = "" if it == final else f"-iter-{it}"
    if method not in ROW_NAME:
        return {}
    path = rows / (ROW_NAME[method].format(at=at, seed=seed) + ".json")
    if not path.is_file():
        return {}
    d = json.loads(path.read_text())
    return {"fd_real": d.get("fd_real"), "adherence": d.get("adherence")}


def spearman(xs: list[float], ys: list[float]) -> float | None:
    pairs = [(x, y) for x, y in zip(xs, ys) if x is not None and y is not None]
    if len(pairs) < 3:
        return None

    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        for k, i in enumerate(order):
            r[i] = float(k)
        return r

    rx, ry = ranks([p[0] for p in pairs]), ranks([p[1] for p in pairs])
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sx, sy = math.sqrt(sum((a - mx) ** 2 for a in rx)), math.sqrt(sum((b - my) ** 2 for b in ry))
    return cov / (sx * sy) if sx and sy else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", type=Path, required=True, help="a `dmad bench distill` --out folder")
    ap.add_argument("--out", type=Path, required=True, help="where the renders and the JSON go")
    ap.add_argument("--prompt-set", type=Path, default=REPO / "resources" / "prompt_sets" / "demo_v4.json")
    args = ap.parse_args()
    ps = load_prompt_set(args.prompt_set)
    runs = sorted(p for p in (args.bench / "runs").iterdir() if p.is_dir() and RUN.match(p.name))
    if not runs:
        raise SystemExit(f"health_evidence: no dmad / dm_only / gan_only / lcm runs in {args.bench / 'runs'}")
    t0 = time.process_time()
    teacher = folder_images(render(runs[0], "teacher", args.prompt_set, args.out / "teacher"), ps)
    levels = health.set_levels(teacher)
    table = []
    for run in runs:
        method, seed = RUN.match(run.name).group(1), int(RUN.match(run.name).group(2))
        iters = sorted(int(p.name[5:]) for p in (run / "checkpoints").iterdir() if re.fullmatch(r"iter_\d+", p.name))
        history: dict = {s: [] for s in health.SIGNALS}
        for it in iters:
            folder = render(run, str(it), args.prompt_set, args.out / run.name)
            signals = health.health_signals(folder_images(folder, ps), teacher, levels)
            alerts = [a.signal for a in health.alerts_for(signals, it, history)]
            for s, v in signals.items():
                history[s].append((it, v))
            row = {"run": run.name, "method": method, "seed": seed, "iter": it, **signals, "alerts": alerts,
                   **bench_row(args.bench / "rows", method, seed, it, iters[-1])}
            table.append(row)
            print(json.dumps(row), flush=True)
    scored = [r for r in table if r.get("fd_real") is not None]
    correlation = {s: {"fd_real": spearman([r.get(s) for r in scored], [r["fd_real"] for r in scored]),
                       "adherence": spearman([r.get(s) for r in scored], [r["adherence"] for r in scored])}
                   for s in health.SIGNALS}
    doc = {"bench": str(args.bench), "prompt_set": f"{ps.name}-{ps.version}", "health_seeds": ps.health_seeds,
           "thresholds": health.THRESHOLDS, "rows": table, "spearman": correlation, "scored": len(scored),
           "cpu_s": round(time.process_time() - t0, 1)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "health_evidence.json").write_text(json.dumps(doc, indent=2))
    print("\nSpearman rank correlation over", len(scored), "scored checkpoints:")
    for s, c in correlation.items():
        fmt = lambda v: "n/a" if v is None else f"{v:+.2f}"  # noqa: E731
        print(f"  {s:17s} FD_real {fmt(c['fd_real'])}  adherence {fmt(c['adherence'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
