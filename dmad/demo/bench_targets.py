"""The targets of `dmad bench distill` (issue 37's, on the bench's set): each names the rows it
reads, and one whose rows this bench did not make says "not measured" instead of vanishing. The
step counts are the targets' own (the 4-step and the 1-step student), not the bench's settings.
Students are read as means over their training seeds; "beats" needs an interval over training
seeds (dmad.demo.bench_report.seed_difference) that excludes 0."""
from __future__ import annotations

from typing import Callable, Optional, Union

from dmad.demo.bench_rows import RowKey
from dmad.demo.bench_runs import PEER

FEW, MOST = 1, 4                 # the 1-step and the 4-step student of the targets
DISTILL_MINUTES = 20
Need = Union[RowKey, tuple]      # one row, or a student group (method, steps, budget) over seeds


def _need_label(n: Need) -> str:
    if isinstance(n, RowKey):
        return n.label
    method, steps, budget = n
    return RowKey("student", steps, method, budget=budget).group


def check_targets(r, s) -> list[dict]:
    """[{target, met (True / False / None: not measured), measured, needs}] for the bench result `r`."""
    from dmad.demo.bench_report import seed_difference, student_groups

    rows = {x.key: x for x in r.rows}
    groups = {(e["method"], e["steps"], e["budget"]): e for e in r.summary}
    seeds_of = student_groups(r.rows)
    out: list[dict] = []

    def target(name: str, needs: list[Need], check: Callable[[], tuple[bool, str]]) -> None:
        absent = [n for n in needs if (rows.get(n) if isinstance(n, RowKey) else groups.get(n)) is None]
        if absent:
            out.append({"target": name, "met": None, "needs": [_need_label(n) for n in needs],
                        "measured": f"not measured (no {', '.join(_need_label(n) for n in absent)} rows)"})
            return
        met, measured = check()
        out.append({"target": name, "met": bool(met), "needs": [_need_label(n) for n in needs], "measured": measured})

    teacher, real = RowKey("teacher", s.teacher_steps), RowKey("real")
    t = rows.get(teacher)
    floor = rows.get(real)

    def mean(group: tuple, metric: str) -> Optional[float]:
        e = groups[group]
        return e[metric]["mean"] if metric in e else None

    target("teacher full-caption adherence >= 95%", [teacher],
           lambda: (t.adherence >= 0.95, f"{t.adherence:.1%}"))
    target("teacher stated-attribute accuracy >= 95% (under-specified captions)", [teacher, real],
           lambda: (t.stated_accuracy >= 0.95, f"{t.stated_accuracy:.1%}"))
    target("teacher mean TV <= its sampling floor + 0.05", [teacher, real],
           lambda: (t.tv <= floor.tv + 0.05, f"{t.tv:.3f} (floor {floor.tv:.3f})"))
    d4, d1 = ("dmad", MOST, "final"), ("dmad", FEW, "final")
    n4, n1 = _need_label(d4), _need_label(d1)

    def floor_note() -> str:
        return f"; floor {floor.tv:.3f}" if floor is not None and floor.tv is not None else ""

    target(f"{n4}: mean TV <= teacher's + 0.05", [teacher, d4],
           lambda: (mean(d4, "tv") <= t.tv + 0.05, f"{mean(d4, 'tv'):.3f} vs {t.tv:.3f}{floor_note()}"))

    def covered() -> tuple[bool, str]:
        missing = sorted({f"{a}={v}" for x in seeds_of[d4] for m in x.missing.values() for a, vs in m.items() for v in vs})
        ok = groups[d4]["all_covered"]
        return ok, "all appear" if ok else f"missing: {', '.join(missing[:8])}"

    target(f"{n4}: every value with data probability >= 5% appears (every seed)", [d4], covered)
    target(f"{n4}: full-caption adherence >= teacher's - 2 points", [teacher, d4],
           lambda: (mean(d4, "adherence") >= t.adherence - 0.02, f"{mean(d4, 'adherence'):.1%} vs {t.adherence:.1%}"))
    target(f"{n4}: FD_real <= 1.1x teacher's", [teacher, d4],
           lambda: (mean(d4, "fd_real") <= 1.1 * t.fd_real, f"{mean(d4, 'fd_real'):.2f} vs {t.fd_real:.2f} "
                                                              f"({mean(d4, 'fd_real') / max(t.fd_real, 1e-12):.2f}x)"))
    target(f"{n1}: mean TV <= teacher's + 0.10", [teacher, d1],
           lambda: (mean(d1, "tv") <= t.tv + 0.10, f"{mean(d1, 'tv'):.3f} vs {t.tv:.3f}{floor_note()}"))
    for k in (MOST, FEW):
        a = ("dmad", k, "final")
        for budget, what in (("same wall clock", "same wall clock"), ("equal compute", "equal training compute")):
            b = (PEER, k, budget)
            for metric in ("fd_real", "tv"):
                def beats(a=a, b=b, metric=metric) -> tuple[bool, str]:
                    d = seed_difference(seeds_of[a], seeds_of[b], metric)
                    if d is None:
                        return False, f"no {metric} on both"
                    ci = "n/a (one seed)" if d["ci"] is None else f"[{d['ci'][0]:+.3f}, {d['ci'][1]:+.3f}]"
                    return (d["ci"] is not None and d["ci"][1] < 0,
                            f"A - B {d['mean']:+.3f} {ci}; per seed {', '.join(f'{x:+.3f}' for x in d['per_seed'])}")

                target(f"{_need_label(a)} beats {_need_label(b)} on {metric} ({what}; interval over training seeds "
                       "excludes 0)", [a, b], beats)
    dmad_runs = {name: run for name, run in r.runs.items() if name.startswith("dmad-")}
    if not dmad_runs:
        out.append({"target": f"distillation within {DISTILL_MINUTES} minutes", "met": None, "needs": ["dmad runs"],
                    "measured": "not measured (no DMAD run)"})
    for name, run in dmad_runs.items():
        out.append({"target": f"distillation within {DISTILL_MINUTES} minutes ({name})", "needs": [name],
                    "met": run["wall_time_s"] <= DISTILL_MINUTES * 60, "measured": f"{run['wall_time_s'] / 60:.1f} min"})
    return out
