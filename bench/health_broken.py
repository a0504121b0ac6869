"""Do the health alerts fire before the damage? (issue 39, item 3 and its first target)

Scores every checkpoint of deliberately broken demo runs (and a healthy one beside them) with the
bench's own evaluator on the held-out set, exactly as `dmad bench distill` scores a student: the
student's own few-step sampler at its trained steps, 512 full-caption images against real renders
(FD_real, adherence) and 1,024 under-specified ones (total-variation distance to the data's
conditional, coverage). It joins each checkpoint with the health row the run itself wrote at that
iteration (health.csv: the signals, and the alerts as they fired live), replays the alert rule
over those rows with today's THRESHOLDS (dmad.sample.health.alerts_for, each row with the rows
before it, as in a run), and reads off, per run:

- the best FD_real, and the first later checkpoint whose FD_real is at least twice it ("doubled");
- the first validation that raised one of the run's expected alerts (given on the command line);
- the lead: how many validations the alert came before the doubling (the target: at least one);
- the same for the distribution's damage, which FD_real does not see: the first checkpoint whose
  coverage of the data's attribute values on under-specified captions is lost (the share missing
  at least doubled against the run's best, and at least 0.1 below it).

and over all checkpoints of all the runs, the Spearman rank correlation of each signal with FD_real,
adherence, TV and coverage. A run's checkpoints must sit at its validations (checkpointing_steps =
validation_steps), so that each checkpoint has a health row.

    python bench/health_broken.py --out /tmp/health-broken \\
        --run collapse:/tmp/broken/highlr:diversity \\
        --run overguided:/tmp/broken/overguide:saturation+colourfulness+brightness+contrast

Each checkpoint's scores are kept in --out (the same command goes on where it stopped).
About 50 s a checkpoint on 2 CPU cores.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from health_evidence import spearman  # noqa: E402

from dmad.contract.runlog import HEALTH_SIGNALS, read_health  # noqa: E402
from dmad.contract.runs import RunFolder  # noqa: E402
from dmad.sample import health  # noqa: E402


def parse_run(text: str) -> tuple[str, Path, tuple[str, ...]]:
    parts = text.split(":")
    if len(parts) != 3 or not parts[0] or not parts[1]:
        raise argparse.ArgumentTypeError(f"--run wants NAME:RUN_DIR:SIGNALS (SIGNALS may be empty); got {text!r}")
    name, path, signals = parts
    expected = tuple(s for s in signals.split("+") if s)
    for s in expected:
        if s not in HEALTH_SIGNALS:
            raise argparse.ArgumentTypeError(f"--run {text!r}: {s!r} is not a health signal ({', '.join(HEALTH_SIGNALS)})")
    if not (Path(path) / "config.json").is_file():
        raise argparse.ArgumentTypeError(f"--run {text!r}: {path} is not a run folder (no config.json)")
    return name, Path(path), expected


class Scorer:
    """The bench's evaluator, references and noise, built once (dmad.demo.bench's protocol)."""

    def __init__(self, run_dir: Path, set_name: str):
        import torch

        from dmad.contract.config import load_config
        from dmad.demo.bench import FULL
        from dmad.demo.bench_rows import make_references
        from dmad.demo.bench_sets import SETS, full_items, initial_noise, under_items
        from dmad.demo.evaluator import load_evaluator
        from dmad.models.teacher import load_identity_teacher
        from dmad.sample.render import latent_shape

        cfg = load_config(RunFolder(run_dir).config_json)
        self.s = FULL
        self.resolution = cfg.resources.resolution
        self.teacher = load_identity_teacher(cfg.identity, dtype=torch.float32)
        sset = SETS[set_name]
        full = full_items(sset, self.s.prompts, self.s.seeds_per_prompt)
        under = under_items(sset, self.s.under_captions, self.s.under_seeds)
        self.classifier = load_evaluator()
        self.refs = make_references(self.classifier, full, under, self.s.real_per_prompt, sset.real)
        shape = latent_shape(self.teacher.vae, self.resolution, self.resolution)
        self.noise = (initial_noise(full, sset.noise_a, shape), initial_noise(under, sset.noise_a, shape))

    def score(self, run_dir: Path, checkpoint: Path) -> dict:
        from dmad.demo.bench_rows import evaluate
        from dmad.demo.bench_sampling import load_student, sample_student

        student, state = load_student(run_dir, self.teacher, checkpoint)
        ts = list(state.student_timesteps)
        full_caps = [c for c, _, _ in self.refs.full_items]
        under_caps = [c for c, _, _ in self.refs.under_items]
        full = sample_student(student, self.teacher, full_caps, self.noise[0], ts, self.s.batch_size, self.resolution)
        under = sample_student(student, self.teacher, under_caps, self.noise[1], ts, self.s.batch_size, self.resolution)
        numbers, _ = evaluate(self.classifier, self.refs, full, under)
        return {"iter": state.iter, "steps": len(ts), "fd_real": numbers["fd_real"], "adherence": numbers["adherence"],
                "tv": numbers["tv"], "coverage": numbers["coverage"]}


def verdict(rows: list[dict], expected: tuple[str, ...]) -> dict:
    """Best FD_real, where it doubled, where one of the `expected` alerts first fired, and the lead
    in validations. With nothing expected (a healthy run): met when no alert fired at all."""
    best = min(rows, key=lambda r: r["fd_real"])
    doubled = next((r["iter"] for r in rows if r["iter"] > best["iter"] and r["fd_real"] >= 2 * best["fd_real"]), None)
    fired_row = next((r for r in rows if set(expected) & set(r["alerts"])), None)
    fired = None if fired_row is None else fired_row["iter"]
    any_alert = next((r["iter"] for r in rows if r["alerts"]), None)
    iters = [r["iter"] for r in rows]
    lead = None
    if doubled is not None and fired is not None:
        lead = iters.index(doubled) - iters.index(fired)
    # the distribution's damage, which FD_real on full captions does not see (a collapsed student
    # can score its run's best FD_real): coverage of the data's attribute values on under-specified
    # captions lost, i.e. the share missing at least doubled against the run's best coverage and at
    # least 0.1 below it (the floor keeps a healthy 0.99 -> 0.98 from counting)
    top = max(rows, key=lambda r: r["coverage"])
    lost = next((r["iter"] for r in rows if r["iter"] > top["iter"] and 1 - r["coverage"] >= 2 * (1 - top["coverage"])
                 and r["coverage"] <= top["coverage"] - 0.1), None)
    lead_coverage = None if lost is None or fired is None else iters.index(lost) - iters.index(fired)
    return {"best_iter": best["iter"], "best_fd_real": best["fd_real"], "doubled_at": doubled,
            "expected_alerts": list(expected), "fired_at": fired,
            "fired": [] if fired_row is None else sorted(set(expected) & set(fired_row["alerts"])),
            "first_alert_at": any_alert, "lead_validations": lead,
            "best_coverage_iter": top["iter"], "best_coverage": top["coverage"], "coverage_lost_at": lost,
            "lead_validations_coverage": lead_coverage,
            # a broken run whose FD_real never doubled has nothing to be early for: n/a (None)
            "met": (None if doubled is None else lead is not None and lead >= 1) if expected else any_alert is None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=parse_run, action="append", required=True,
                    help="NAME:RUN_DIR:SIGNALS, the run and the alerts that match its failure, joined by + "
                         "(empty: a healthy run, which should raise none)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--set", default="heldout", choices=("heldout", "tuning"))
    args = ap.parse_args()
    import torch

    torch.set_num_threads(max(1, torch.get_num_threads()))
    t0, c0 = time.perf_counter(), time.process_time()
    scorer = None
    report: dict = {"set": args.set, "thresholds": health.THRESHOLDS, "runs": {}}
    everything: list[dict] = []
    for name, run_dir, expected in args.run:
        written = {r["iter"]: r for r in read_health(RunFolder(run_dir).health_csv)}
        rows: list[dict] = []
        history: dict = {s: [] for s in HEALTH_SIGNALS}
        for it, ckpt in RunFolder(run_dir).list_checkpoints():
            cache = args.out / name / f"iter_{it}.json"
            if cache.is_file():
                scored = json.loads(cache.read_text())
            else:
                if scorer is None:
                    scorer = Scorer(run_dir, args.set)
                scored = scorer.score(run_dir, ckpt)
                cache.parent.mkdir(parents=True, exist_ok=True)
                tmp = cache.with_suffix(".tmp")
                tmp.write_text(json.dumps(scored))
                tmp.replace(cache)
            h = written.get(it)
            if h is None:
                raise SystemExit(f"health_broken: {run_dir} has a checkpoint at iteration {it} but no health row there "
                                 f"(set checkpointing_steps = validation_steps)")
            signals = {s: h[s] for s in HEALTH_SIGNALS if h.get(s) is not None}
            # the alert rule replayed with today's THRESHOLDS over the run's own history (what the run
            # would raise now), beside the alerts it raised live (the thresholds it ran with)
            replayed = [a.signal for a in health.alerts_for(signals, it, history)]
            for sig, v in signals.items():
                history[sig].append((it, v))
            row = {**scored, **{s: h.get(s) for s in HEALTH_SIGNALS}, "alerts": replayed,
                   "alerts_live": h.get("alerts") or []}
            rows.append(row)
            everything.append({"run": name, **row})
            print(f"{name:12s} {it:5d}  FD_real {row['fd_real']:7.2f}  adherence {row['adherence']:6.1%}  "
                  f"TV {row['tv']:.3f}  " + "  ".join(f"{s[:6]} {row[s]:.2f}" for s in HEALTH_SIGNALS if row[s] is not None)
                  + f"  alerts {','.join(row['alerts']) or '-'} (live {','.join(row['alerts_live']) or '-'})", flush=True)
        if rows:
            report["runs"][name] = {"run_dir": str(run_dir), "rows": rows, **verdict(rows, expected)}
            print(f"{name}: {json.dumps({k: v for k, v in report['runs'][name].items() if k not in ('rows', 'run_dir')})}",
                  flush=True)
    report["spearman"] = {s: {m: spearman([r[s] for r in everything], [r[m] for r in everything])
                              for m in ("fd_real", "adherence", "tv", "coverage")} for s in HEALTH_SIGNALS}
    report["checkpoints"] = len(everything)
    report["wall_s"], report["cpu_s"] = round(time.perf_counter() - t0, 1), round(time.process_time() - c0, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "health_broken.json").write_text(json.dumps(report, indent=2))
    print(f"\nSpearman rank correlation over {len(everything)} checkpoints:")
    for s, c in report["spearman"].items():
        fmt = lambda v: "n/a" if v is None else f"{v:+.2f}"  # noqa: E731
        print(f"  {s:17s} FD_real {fmt(c['fd_real'])}  adherence {fmt(c['adherence'])}  TV {fmt(c['tv'])}  "
              f"coverage {fmt(c['coverage'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
