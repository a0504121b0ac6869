"""What `dmad bench distill` concludes from its rows: means and spreads over training seeds, the
"beats" tests, and the tables (the targets: dmad.demo.bench_targets).

A comparison of two methods is made per training seed on the same items (same captions, same
initial noise), d_s = metric(A, seed s) - metric(B, seed s), and its interval is Student's t over
those differences: mean +- t(0.975, n - 1) * sd / sqrt(n). Each d_s carries both the evaluation
noise of its rows and the run-to-run variance of training, so an interval that excludes 0 says the
gap survives another training run, not only another draw of images. With 3 seeds t is 4.30: only
a gap several times the seed spread passes.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from dmad.demo.bench_rows import Row, RowKey

SUMMARY_METRICS = ("fd_real", "adherence", "tv", "coverage", "stated_accuracy", "precision", "recall", "diversity",
                   "under_diversity", "network_passes", "iteration")
# two-sided 95% quantiles of Student's t, by degrees of freedom (no scipy here)
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def t975(df: int) -> float:
    """The 97.5% quantile of Student's t with `df` degrees of freedom (between table entries, the
    next smaller df's: a slightly wider interval); 1.96 beyond 30."""
    if df < 1:
        raise ValueError("a t interval needs at least 2 values")
    if df > 30:
        return 1.96
    return _T975[max(k for k in _T975 if k <= df)]


def student_groups(rows: list[Row]) -> dict[tuple, list[Row]]:
    """Student rows by (method, steps, checkpoint rule), one row per training seed, in row order."""
    groups: dict[tuple, list[Row]] = {}
    for r in rows:
        if r.model == "student":
            groups.setdefault((r.method, r.steps, r.budget), []).append(r)
    return groups


def group_name(method: str, steps: int, budget: str) -> str:
    """"DMAD 4 steps", "DMAD 1 step @ iter 800": a student group over training seeds."""
    return RowKey("student", steps, method, budget=budget).group


def summarize(rows: list[Row]) -> list[dict]:
    """Students grouped by (method, steps, checkpoint rule) across training seeds: each metric's
    mean, standard deviation (n - 1) and per-seed values; and whether every seed covered every
    needed value."""
    groups = student_groups(rows)
    out = []
    for (method, steps, budget), rs in groups.items():
        entry = {"name": group_name(method, steps, budget), "method": method, "steps": steps, "budget": budget,
                 "seeds": [r.seed for r in rs], "all_covered": all(bool(r.all_covered) for r in rs)}
        for m in SUMMARY_METRICS:
            vals = [getattr(r, m) for r in rs if getattr(r, m) is not None]
            if vals:
                entry[m] = {"mean": float(np.mean(vals)), "sd": float(np.std(vals, ddof=1)) if len(vals) > 1 else None,
                            "values": vals}
        out.append(entry)
    return out


def comparison_pairs(methods, steps) -> list[tuple[tuple, tuple, str]]:
    """(A group, B group, what it asks), A expected better: DMAD against its peer at both budgets, and
    against each of its parts alone, at the most and the fewest student steps."""
    from dmad.demo.bench_runs import PARTS, PEER

    out = []
    for k in sorted({min(steps), max(steps)}, reverse=True):
        a = ("dmad", k, "final")
        if PEER in methods:
            out += [(a, (PEER, k, "same wall clock"), "same wall clock"),
                    (a, (PEER, k, "equal compute"), "equal training compute")]
        for part, what in PARTS.items():
            if part in methods:
                out.append((a, (part, k, "final"), f"against {what}"))
    return out


def seed_difference(a: list[Row], b: list[Row], metric: str) -> Optional[dict]:
    """A - B per training seed present in both, its mean and t interval (None below 2 seeds)."""
    by_a = {r.seed: getattr(r, metric) for r in a if getattr(r, metric) is not None}
    by_b = {r.seed: getattr(r, metric) for r in b if getattr(r, metric) is not None}
    seeds = sorted(set(by_a) & set(by_b))
    if not seeds:
        return None
    d = np.array([by_a[s] - by_b[s] for s in seeds], dtype=float)
    mean = float(d.mean())
    ci = None
    if len(d) >= 2:
        half = t975(len(d) - 1) * float(d.std(ddof=1)) / math.sqrt(len(d))
        ci = (mean - half, mean + half)
    return {"seeds": seeds, "per_seed": d.tolist(), "mean": mean, "ci": ci}


def compare_seeds(rows: list[Row], s) -> list[dict]:
    groups = student_groups(rows)
    out = []
    for a, b, what in comparison_pairs(s.methods, s.student_steps):
        if a in groups and b in groups:
            out.append({"a": group_name(*a), "b": group_name(*b), "what": what,
                        **{m: seed_difference(groups[a], groups[b], m)
                           for m in ("fd_real", "tv", "adherence", "coverage")}})
    return out


# ------------------------------------------------------------------------------- tables

def _f(v, fmt: str = ".2f") -> str:
    return "-" if v is None else format(v, fmt)


def _ms(e: dict, metric: str, fmt: str) -> str:
    if metric not in e:
        return "-"
    m = e[metric]
    return format(m["mean"], fmt) + ("" if m["sd"] is None else f" ± {format(m['sd'], fmt)}")


def format_tables(r) -> str:
    s, m = r.settings, r.machine
    seeds = s["seeds"]
    lines = [
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['gpu'] or 'no GPU'}, torch {m['torch']} "
        f"({m['torch_threads']} thread{'s' if m['torch_threads'] != 1 else ''}), Python {m['python']}.",
        f"Set: {s['set']} (captions seed {seeds['captions']}, under-specified {seeds['under']}, noise "
        f"{seeds['noise_a']}, real renders {seeds['real']}). Full captions: {s['prompts']} x {s['seeds_per_prompt']} "
        f"seeds = {s['prompts'] * s['seeds_per_prompt']} images a row, FD against {s['prompts'] * s['real_per_prompt']} "
        f"real renders of the same captions, interval: bootstrap of seeds within each caption. Under-specified: "
        f"{s['under_captions']} x {s['under_seeds']} seeds. Teacher CFG {s['cfg']}. Training seeds "
        f"{', '.join(map(str, s['training_seeds']))}; checkpoint rule: {s['checkpoint_rule']}.",
        "", "| row | NFE | FD_real [95%] | adherence | TV | stated | covered | precision / recall | diversity | "
            "compute | notes |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for x in r.rows:
        ci = "" if x.fd_real_ci is None else f" [{x.fd_real_ci[0]:.2f}, {x.fd_real_ci[1]:.2f}]"
        pr = "-" if x.precision is None else f"{x.precision:.2f} / {x.recall:.2f}"
        cov = "-" if x.coverage is None else f"{x.coverage:.0%}" + ("" if x.all_covered else " (gaps)")
        lines.append(f"| {x.label} | {_f(x.nfe, 'd')} | {x.fd_real:.2f}{ci} | {x.adherence:.1%} | {_f(x.tv, '.3f')} | "
                     f"{_f(x.stated_accuracy, '.1%')} | {cov} | {pr} | {_f(x.diversity, '.3f')} / "
                     f"{_f(x.under_diversity, '.3f')} | {_f(x.network_passes, '.3g')} | {x.notes} |")
    if r.summary:
        lines += ["", "Students over training seeds (mean ± SD):", "",
                  "| student | seeds | FD_real | adherence | TV | covered | stated | precision | recall | compute |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for e in r.summary:
            lines.append(f"| {e['name']} | {len(e['seeds'])} | {_ms(e, 'fd_real', '.2f')} | {_ms(e, 'adherence', '.1%')} | "
                         f"{_ms(e, 'tv', '.3f')} | {_ms(e, 'coverage', '.0%')}{'' if e['all_covered'] else ' (gaps)'} | "
                         f"{_ms(e, 'stated_accuracy', '.1%')} | {_ms(e, 'precision', '.2f')} | {_ms(e, 'recall', '.2f')} | "
                         f"{_ms(e, 'network_passes', '.3g')} |")
    if r.runs:
        lines += ["", "| run | iterations | wall s | CPU s | compute (teacher-denoiser image-passes) | stopped by |",
                  "|---|---:|---:|---:|---:|---|"]
        for name, run in r.runs.items():
            lines.append(f"| {name} | {run['iterations']} | {run['wall_time_s']:.0f} | {run.get('cpu_time_s', 0):.0f} | "
                         f"{_f(run.get('network_passes'), '.4g')} | "
                         f"{'wall clock at ' + str(run['stop_sent_at_s']) + ' s' if run.get('stop_sent_at_s') else 'its step count'} |")
    if r.comparisons:
        lines += ["", "A - B per training seed on the same items; 95% t interval over seeds:", "",
                  "| A | B | budget | FD_real | TV | adherence |", "|---|---|---|---:|---:|---:|"]
        for c in r.comparisons:
            lines.append(f"| {c['a']} | {c['b']} | {c['what']} | {_diff(c['fd_real'], '.2f')} | {_diff(c['tv'], '.3f')} | "
                         f"{_diff(c['adherence'], '+.1%')} |")
    if r.targets:
        lines += ["", "| target | met | measured |", "|---|---|---|"]
        lines += [f"| {t['target']} | {met_text(t['met'])} | {t['measured']} |" for t in r.targets]
    return "\n".join(lines)


def met_text(met: Optional[bool]) -> str:
    """A target's verdict (dmad.demo.bench_targets): None is a target whose rows this bench lacks."""
    return "not measured" if met is None else "yes" if met else "NO"


def _diff(d: Optional[dict], fmt: str) -> str:
    if d is None:
        return "-"
    f = fmt if fmt.startswith("+") else "+" + fmt
    ci = "" if d["ci"] is None else f" [{format(d['ci'][0], f)}, {format(d['ci'][1], f)}]"
    return format(d["mean"], f) + ci


def to_json(r) -> dict:
    return {"settings": r.settings, "machine": r.machine, "rows": [x.to_dict() for x in r.rows], "runs": r.runs,
            "summary": r.summary, "comparisons": r.comparisons, "targets": r.targets, "wall_time_s": r.wall_time_s}
