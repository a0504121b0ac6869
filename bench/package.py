"""The desktop bundle: build dist/dmad-studio/ with PyInstaller from
packaging/dmad_studio.spec, then run the bundle's self-test (`dmad-studio --self-test`: the engine,
started from the bundle as a subprocess, dry-runs the demo config; the window is built off
screen). Prints build time, bundle size (files and bytes on disk) and self-test time; exit 1 if
the build or the self-test fails.

    python bench/package.py [--skip-build] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BUNDLE = REPO / "dist" / "dmad-studio"


def folder_size(path: Path) -> tuple[int, int]:
    files = size = 0
    for root, _, names in os.walk(path):
        for n in names:
            p = Path(root) / n
            if not p.is_symlink():
                files += 1
                size += p.stat().st_size
    return files, size


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-build", action="store_true", help="time only the self-test of an existing bundle")
    ap.add_argument("--json", metavar="OUT", help="also write the results as JSON")
    args = ap.parse_args(argv)
    out: dict = {"cpu_count": os.cpu_count(), "load_before": os.getloadavg()[0]}
    if not args.skip_build:
        t = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "PyInstaller", "--noconfirm", "--clean", "--log-level", "WARN",
                            "--distpath", str(REPO / "dist"), "--workpath", str(REPO / "build" / "pyinstaller"),
                            str(REPO / "packaging" / "dmad_studio.spec")], cwd=REPO)
        out["build_s"] = round(time.perf_counter() - t, 1)
        if r.returncode != 0:
            print(f"build failed (exit {r.returncode}) after {out['build_s']} s", file=sys.stderr)
            return 1
    files, size = folder_size(BUNDLE)
    out.update(files=files, size_mb=round(size / 2**20, 1))
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    t = time.perf_counter()
    r = subprocess.run([str(BUNDLE / "dmad-studio"), "--self-test"], env=env, capture_output=True, text=True,
                       timeout=900)
    out.update(self_test_s=round(time.perf_counter() - t, 1), self_test_exit=r.returncode,
               self_test=r.stdout.strip().splitlines(), load_after=os.getloadavg()[0])
    print(r.stdout.strip())
    print(f"build {out.get('build_s', '-')} s; bundle {files} files, {out['size_mb']} MiB; "
          f"self-test {out['self_test_s']} s, exit {r.returncode}; load {out['load_before']:.2f} -> "
          f"{out['load_after']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0 if r.returncode == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
