"""The run config: defaults, --set overrides, migration, path resolution, student timesteps."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dmad.contract.config import (CONFIG_VERSION, Distillation, TrainConfig, apply_overrides, load_config, migrate,
                         parse_override, validate_config)
from dmad.errors import UserInputError

MINIMAL = {"identity": {"pretrained_model_name_or_path": "/abs/teacher", "train_data_dir": "/abs/data"}}


def _write(path: Path, raw: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(raw), encoding="utf-8")
    return path


def test_defaults_fill_in_every_field():
    cfg = validate_config(json.loads(json.dumps(MINIMAL)))
    dumped = cfg.model_dump(mode="json")
    assert dumped["config_version"] == CONFIG_VERSION
    for group in ("identity", "resources", "optimization", "distillation", "observation"):
        model = type(getattr(cfg, group))
        assert set(dumped[group]) == set(model.model_fields), group  # the resolved config names every field
    assert cfg.resources.train_batch_size == 1 and cfg.resources.resolution == 512
    assert cfg.identity.output_dir == "runs" and cfg.identity.run_name is None
    assert cfg.distillation.student_steps == 1 and cfg.distillation.critic_updates_per_generator_update == 5
    assert cfg.observation.resume_from_checkpoint is None
    # The resolved config round-trips: what a run folder's config.json holds loads back the same.
    assert TrainConfig.model_validate(dumped) == cfg


@pytest.mark.parametrize("item,keys,value", [
    ("optimization.generator_lr=2e-5", ["optimization", "generator_lr"], 2e-5),
    ("resources.gradient_checkpointing=true", ["resources", "gradient_checkpointing"], True),
    ("distillation.student_timesteps=[999, 500]", ["distillation", "student_timesteps"], [999, 500]),
    ("observation.validation_steps=null", ["observation", "validation_steps"], None),
    ("identity.run_name=my-run", ["identity", "run_name"], "my-run"),  # not JSON: a plain string
    ("identity.run_name=a=b", ["identity", "run_name"], "a=b"),        # only the first '=' splits
])
def test_parse_override_reads_json_values(item, keys, value):
    assert parse_override(item) == (keys, value)


def test_overrides_apply_with_dotted_paths(tmp_path):
    path = _write(tmp_path / "c.json", MINIMAL)
    cfg = load_config(path, ["optimization.generator_lr=2e-5", "distillation.student_steps=2",
                             "distillation.student_timesteps=[999,500]", "resources.train_batch_size=4",
                             "resources.train_batch_size=8"])  # a later --set wins
    assert cfg.optimization.generator_lr == 2e-5
    assert cfg.distillation.resolved_student_timesteps() == [999, 500]
    assert cfg.resources.train_batch_size == 8  # the group was absent from the file: created


def test_apply_overrides_leaves_its_input_alone():
    raw = {"resources": {"resolution": 64}}
    out = apply_overrides(raw, ["resources.resolution=128"])
    assert raw == {"resources": {"resolution": 64}} and out["resources"]["resolution"] == 128


def test_bad_override_names_the_set_item(tmp_path):
    path = _write(tmp_path / "c.json", MINIMAL)
    with pytest.raises(UserInputError, match=r"^--set resources\.resolution=30: .*multiple of 8"):
        load_config(path, ["resources.resolution=30"])
    with pytest.raises(UserInputError, match=r"^--set distillation\.student_step=2: unknown key .*'student_steps'"):
        load_config(path, ["distillation.student_step=2"])
    with pytest.raises(UserInputError, match=r"expected key=value"):
        load_config(path, ["=3"])


def test_file_without_version_migrates(tmp_path):
    raw = json.loads(json.dumps(MINIMAL))
    assert "config_version" not in raw
    migrated = migrate(raw)
    assert migrated["config_version"] == CONFIG_VERSION and "config_version" not in raw
    assert load_config(_write(tmp_path / "old.json", raw)).config_version == CONFIG_VERSION


@pytest.mark.parametrize("version", [0, CONFIG_VERSION + 1, "1"])
def test_unsupported_version_is_rejected(version):
    with pytest.raises(UserInputError, match="config_version .* is not supported"):
        migrate({**MINIMAL, "config_version": version})


def test_relative_paths_resolve_against_the_config_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the shell's folder must not matter
    raw = {"identity": {"pretrained_model_name_or_path": "models/teacher", "train_data_dir": "../data",
                        "teacher_config_dir": None},
           "observation": {"prompt_set": "prompts/p.json", "resume_from_checkpoint": "latest"}}
    cfg = load_config(_write(tmp_path / "project" / "configs" / "c.json", raw))
    base = (tmp_path / "project" / "configs").resolve()
    assert cfg.identity.pretrained_model_name_or_path == str(base / "models" / "teacher")
    assert cfg.identity.train_data_dir == str((base / ".." / "data").resolve())
    assert cfg.identity.output_dir == str(base / "runs")  # the default, also relative to the file
    assert cfg.observation.prompt_set == str(base / "prompts" / "p.json")
    assert cfg.identity.teacher_config_dir is None
    assert cfg.observation.resume_from_checkpoint == "latest"  # a keyword, not a path


def test_absolute_paths_stay(tmp_path):
    data = tmp_path / "elsewhere" / "data"
    raw = {"identity": {"pretrained_model_name_or_path": str(tmp_path / "t"), "train_data_dir": str(data)}}
    cfg = load_config(_write(tmp_path / "sub" / "c.json", raw))
    assert cfg.identity.train_data_dir == str(data)


@pytest.mark.parametrize("steps,expected", [
    (1, [999]), (2, [999, 499]), (3, [999, 666, 333]), (4, [999, 749, 499, 249]),
])
def test_resolved_student_timesteps(steps, expected):
    assert Distillation(student_steps=steps).resolved_student_timesteps() == expected


def test_explicit_student_timesteps_win():
    d = Distillation(student_steps=2, student_timesteps=[800, 200])
    assert d.resolved_student_timesteps() == [800, 200]
    with pytest.raises(ValueError, match="strictly descending"):
        Distillation(student_steps=2, student_timesteps=[200, 800])


def test_version_1_backward_simulation_is_dropped(tmp_path):
    """Version 2 removed distillation.backward_simulation (never read: multi-step students always
    train on their own rollouts); version 1 files that set it still load, without it."""
    raw = {**MINIMAL, "config_version": 1, "distillation": {"student_steps": 4, "backward_simulation": True}}
    cfg = load_config(_write(tmp_path / "v1.json", raw))
    assert cfg.config_version == CONFIG_VERSION == 2 and cfg.distillation.student_steps == 4
    assert "backward_simulation" not in cfg.model_dump(mode="json")["distillation"]
    assert "backward_simulation" not in Distillation.model_fields
    assert raw["distillation"]["backward_simulation"] is True  # migrate copies, never edits the input
    assert validate_config(raw) == validate_config(migrate(raw))  # any supported version validates
    single = {**MINIMAL, "config_version": 1, "distillation": {"backward_simulation": False}}
    assert load_config(_write(tmp_path / "single.json", single)).distillation.student_steps == 1


def test_multi_step_students_need_backward_simulation(tmp_path):
    """A version 1 file that turned backward simulation off for a multi-step student was refused
    and still is; in version 2 the key is unknown."""
    v1 = {**MINIMAL, "config_version": 1, "distillation": {"student_steps": 2, "backward_simulation": False}}
    with pytest.raises(UserInputError, match="backward_simulation must be true for student_steps > 1"):
        load_config(_write(tmp_path / "v1.json", v1))
    with pytest.raises(UserInputError, match=r"unknown key 'distillation\.backward_simulation'"):
        load_config(_write(tmp_path / "v2.json", {**v1, "config_version": 2}))
    with pytest.raises(ValueError, match="backward_simulation"):
        Distillation(student_steps=2, backward_simulation=False)


def test_shipped_version_1_configs_load():
    """The configs in resources/ (version 1 files, some with backward_simulation) load unchanged."""
    from dmad.contract.paths import resources_dir

    files = sorted((resources_dir() / "configs").rglob("*.json"))
    configs = [f for f in files if "config_version" in json.loads(f.read_text(encoding="utf-8"))]
    assert len(configs) >= 2
    for f in configs:
        assert load_config(f).config_version == CONFIG_VERSION, f


def test_json_error_names_line_and_column(tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{\n  "identity": {\n    "train_data_dir": "d",\n  }\n}\n', encoding="utf-8")
    with pytest.raises(UserInputError, match=r"c\.json:4:3: invalid JSON"):
        load_config(path)


@pytest.mark.parametrize("extra,message", [
    ({"resources": {"fsdp_shard_teacher": True}}, r"resources\.fsdp_shard_teacher needs resources\.distributed fsdp"),
    ({"resources": {"fsdp_cpu_offload": True}}, r"resources\.fsdp_cpu_offload needs resources\.distributed fsdp"),
    ({"resources": {"distributed": "fsdp", "mixed_precision": "fp16"}}, r"fsdp trains in bf16 or fp32.*bf16"),
    ({"resources": {"distributed": "fsdp"}, "distillation": {"method": "lcm"}}, r"fsdp trains distillation\.method dmad"),
    ({"identity": {"student": "lora", "fake_score": "lora"}, "resources": {"distributed": "fsdp",
                                                                            "fsdp_shard_teacher": True}},
     r"cannot shard a shared frozen base.*share_frozen_base false"),
    ({"resources": {"distributed": "fsdp", "fsdp_shard_teacher": True, "teacher_precision": "int8"}},
     r"cannot shard a int8 teacher"),
])
def test_sharding_settings_that_cannot_work_are_refused_in_one_line(tmp_path, extra, message):
    raw = json.loads(json.dumps(MINIMAL))
    for group, fields in extra.items():
        raw.setdefault(group, {}).update(fields)
    with pytest.raises(UserInputError, match=message) as e:
        load_config(_write(tmp_path / "c.json", raw))
    assert "\n" not in str(e.value)


def test_fsdp_with_full_networks_and_a_sharded_teacher_is_valid(tmp_path):
    raw = {**MINIMAL, "resources": {"distributed": "fsdp", "fsdp_shard_teacher": True, "fsdp_cpu_offload": True,
                                    "mixed_precision": "bf16"}}
    cfg = load_config(_write(tmp_path / "c.json", raw))
    assert cfg.resources.distributed == "fsdp" and cfg.resources.fsdp_shard_teacher
