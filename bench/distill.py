"""Distillation quality on the built-in demo: `dmad bench distill`, writing its table and JSON.

    python bench/distill.py [--quick] [--methods dmad,lcm] [--out DIR]

Writes DIR/bench_distill.json and DIR/bench_distill.md (default DIR: bench/results/) and prints the
table. The full run takes ~25-30 min on 2 CPU cores (of which the distillation itself is timed
separately), ~50 with --methods dmad,lcm (LCM gets DMAD's wall clock); --quick ~4 min. Paste the markdown into docs/benchmarks.md with the commit.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dmad.contract.paths import engine_argv  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--methods", default="dmad", help="dmad, or dmad,lcm to put LCM beside DMAD")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cmd = engine_argv("bench", "distill", "--json", str(out / "bench_distill.json"), "--methods", args.methods)
    if args.quick:
        cmd.append("--quick")
    r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    (out / "bench_distill.md").write_text(r.stdout, encoding="utf-8")
    print(r.stdout, end="")
    return r.returncode


if __name__ == "__main__":
    raise SystemExit(main())
