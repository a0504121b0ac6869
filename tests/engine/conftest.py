"""Fixtures shared by the engine's run-folder reliability tests (test_run_folder_guards,
test_disk_full, test_hostile_run_folder): one finished tiny run per test session, copied per test."""
from __future__ import annotations

import shutil

import pytest


@pytest.fixture(scope="session")
def trained(tmp_path_factory, tiny_teacher, tiny_data, tiny_prompt_set):
    """(config, a finished 4-iteration run with checkpoints iter_2 and iter_4). Never changed: tests
    take run_copy."""
    from tests.conftest import train_tiny_run

    return train_tiny_run(tmp_path_factory.mktemp("trained"), tiny_teacher, tiny_data, tiny_prompt_set, 4)


@pytest.fixture
def run_copy(trained, tmp_path):
    config, run = trained
    copy = tmp_path / "run"
    shutil.copytree(run, copy, symlinks=True)
    return config, copy
