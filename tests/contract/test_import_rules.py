"""The layer rules of DESIGN.md: import-linter contracts in pyproject.toml, and torch-free modules."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TORCH_FREE = ["dmad.config", "dmad.events", "dmad.runs", "dmad.prompts"]  # what the app may import
# The CLI must answer config errors without torch (dmad.train is imported lazily).
FAST = TORCH_FREE + ["dmad.cli", "dmad.preflight", "dmad.errors", "dmad.paths"]
HEAVY = ["torch", "diffusers", "transformers", "accelerate", "peft", "PySide6", "pyqtgraph"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


def _lint_imports() -> list[str]:
    exe = Path(sys.executable).parent / ("lint-imports.exe" if os.name == "nt" else "lint-imports")
    return [str(exe)] if exe.is_file() else [shutil.which("lint-imports") or "lint-imports"]


def test_import_linter_contracts_hold():
    for package in ("dmad", "app"):  # import-linter needs both root packages to exist
        assert (REPO / package / "__init__.py").is_file(), f"{package}/__init__.py is missing"
    proc = subprocess.run([*_lint_imports(), str(REPO / "pyproject.toml"), "--no-cache"], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " 0 broken" in proc.stdout, proc.stdout[-4000:]


def test_app_facing_modules_do_not_import_heavy_packages():
    code = (f"import sys\nimport {', '.join(FAST)}\n"
            f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_env(), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"importing {FAST} pulled in: {proc.stdout.strip()}"
