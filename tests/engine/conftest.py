"""Fixtures shared by the engine's run-folder reliability tests (test_run_folder_guards,
test_disk_full, test_hostile_run_folder): one finished tiny run per test session, copied per test."""
from __future__ import annotations

import json
import shutil

import pytest


@pytest.fixture(scope="session")
def trained(tmp_path_factory, tiny_teacher, tiny_data, tiny_prompt_set):
    """(config, a finished 4-iteration run with checkpoints iter_2 and iter_4). Never changed: tests
    take run_copy."""
    from dmad.cli import main
    from tests.conftest import tiny_config_dict

    base = tmp_path_factory.mktemp("trained")
    cfg = tiny_config_dict(tiny_teacher, tiny_data, tiny_prompt_set, base / "runs")
    cfg["optimization"]["max_train_steps"] = 4
    config = base / "config.json"
    config.write_text(json.dumps(cfg))
    assert main(["train", "--config", str(config), "--run-dir", str(base / "run")]) == 0
    return config, base / "run"


@pytest.fixture
def run_copy(trained, tmp_path):
    config, run = trained
    copy = tmp_path / "run"
    shutil.copytree(run, copy, symlinks=True)
    return config, copy
