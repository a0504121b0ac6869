"""The layer rules of DESIGN.md: import-linter contracts in pyproject.toml, and torch-free modules."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# What the app may import: every module of dmad.contract.
TORCH_FREE = sorted(f"dmad.contract.{p.stem}" for p in (REPO / "dmad" / "contract").glob("*.py") if p.stem != "__init__")
# The CLI must answer config errors without torch (dmad.train.loop is imported lazily).
FAST = TORCH_FREE + ["dmad.cli", "dmad.train.preflight", "dmad.errors", "dmad.contract.paths"]
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


def test_the_engine_top_level_holds_only_the_command_line_and_the_layers():
    """The folder names are the architecture: a module at dmad/'s top level would sit outside every
    layer of the import-linter contract, so only the entry points and the error types live there."""
    top = sorted(p.name for p in (REPO / "dmad").glob("*.py"))
    assert top == ["__init__.py", "__main__.py", "cli.py", "errors.py"], top
    packages = sorted(p.name for p in (REPO / "dmad").iterdir() if p.is_dir() and p.name != "__pycache__")
    assert packages == ["contract", "data", "demo", "memory", "methods", "models", "sample", "testing", "train"]
    for name in packages:
        assert (REPO / "dmad" / name / "__init__.py").is_file(), f"dmad/{name}/__init__.py is missing"


def test_the_app_top_level_holds_only_the_entry_points_and_the_window():
    top = sorted(p.name for p in (REPO / "app").glob("*.py"))
    assert top == ["__init__.py", "__main__.py", "main.py", "screenshots.py", "selftest.py", "window.py"], top
    packages = sorted(p.name for p in (REPO / "app").iterdir() if p.is_dir() and p.name != "__pycache__")
    assert packages == ["dialogs", "engine", "models", "panels", "widgets"]
    for name in packages:
        assert (REPO / "app" / name / "__init__.py").is_file(), f"app/{name}/__init__.py is missing"


def test_no_function_is_over_80_lines_and_the_training_panel_only_shows_its_run():
    """Issue 38's size rules, kept: a function a reader follows in one screen or two, and a Training
    panel that displays the run lifecycle (app/models/lifecycle.py) rather than holding it."""
    import ast

    long = []
    for package in ("dmad", "app"):
        for path in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 80:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} "
                                f"({node.end_lineno - node.lineno + 1} lines)")
    assert long == []
    tree = ast.parse((REPO / "app" / "panels" / "training.py").read_text(encoding="utf-8"))
    panel = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TrainingPanel")
    assert panel.end_lineno - panel.lineno + 1 <= 300
