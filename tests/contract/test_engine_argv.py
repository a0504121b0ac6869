"""One way to start the engine (dmad.contract.paths.engine_argv): `python -m dmad <command>` from a
source checkout; in the PyInstaller bundle (sys.frozen) the bundle's own executable with the engine
command, which packaging/entry.py must hand to the engine, not to the app. No bundle is built here
(bench/package.py builds one and runs its self-test)."""
from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from types import ModuleType, SimpleNamespace

import pytest

from dmad.contract.paths import engine_argv
from tests.conftest import REPO

BUNDLE = "/opt/dmad-studio/dmad-studio"  # what sys.executable is in the bundle
# Every command the app, the demo, the probe, the bench and command.txt start the engine with
STARTED = ("train", "sample", "check-data", "ledger", "probe", "probe-point", "cache", "export", "demo", "bench")


@pytest.fixture
def frozen(monkeypatch):
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "executable", BUNDLE)


def _bundle_entry() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bundle_entry", REPO / "packaging" / "entry.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_from_a_checkout_the_engine_is_the_dmad_module():
    assert engine_argv() == [sys.executable, "-m", "dmad"]
    assert engine_argv("train", "--config", "c.json") == [sys.executable, "-m", "dmad", "train", "--config", "c.json"]


def test_in_the_bundle_the_engine_is_the_bundle_itself_with_the_command(frozen):
    assert engine_argv() == [BUNDLE]
    assert engine_argv("train", "--config", "c.json") == [BUNDLE, "train", "--config", "c.json"]


def test_the_bundle_entry_hands_engine_commands_to_the_engine_and_the_rest_to_the_app(frozen, monkeypatch):
    import dmad.cli

    monkeypatch.setattr(dmad.cli, "main", lambda argv: ("engine", list(argv)))
    monkeypatch.setitem(sys.modules, "app.main", SimpleNamespace(main=lambda argv: ("app", list(argv))))
    entry = _bundle_entry()
    for command in STARTED:
        argv = engine_argv(command, "--help")
        assert argv[0] == BUNDLE and entry.main(argv[1:]) == ("engine", [command, "--help"])
    assert entry.main(["/runs/r1"]) == ("app", ["/runs/r1"])  # `dmad-studio RUN_DIR`


def test_command_txt_names_the_bundle_in_the_bundle(frozen, tmp_path):
    from dmad.cli import _canonical_argv

    config = tmp_path / "c.json"
    args = argparse.Namespace(config=str(config), resume="latest", set=["resources.train_batch_size=2"])
    pf = SimpleNamespace(run_dir=tmp_path / "run", resume_arg="latest")
    assert _canonical_argv(args, pf) == [BUNDLE, "train", "--config", str(config.resolve()), "--run-dir",
                                         str(tmp_path / "run"), "--resume", "latest",
                                         "--set", "resources.train_batch_size=2"]


def test_the_module_prefix_is_built_in_one_place():
    prefix = re.compile(r"""["']-m["']\s*,\s*["']dmad["']""")
    found = sorted(str(p.relative_to(REPO)) for folder in ("dmad", "app", "bench", "packaging")
                   for p in (REPO / folder).rglob("*.py") if prefix.search(p.read_text(encoding="utf-8")))
    assert found == ["dmad/contract/paths.py"]
