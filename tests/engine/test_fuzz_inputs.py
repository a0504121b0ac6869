"""Seeded fuzzing of the readers of users' files: random mutations of valid files (byte flips,
deletions, duplications, truncations, JSON value type swaps, deep nesting, huge numbers, NaN and
Infinity tokens, NUL bytes). Every outcome is a success or a UserInputError of one line (what the
CLI prints after 'dmad: error:', exit 2); any other exception is a crash the CLI would report as an
internal error, and fails the test with the seed and the input that caused it.

Deterministic: each case draws from random.Random("<target>-<i>"), so a failure names its case.
"""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Callable

import pytest

from dmad.contract.config import load_config
from dmad.contract.datasets import load_dataset_list
from dmad.contract.prompts import load_prompt_set
from dmad.errors import UserInputError

CASES = 500  # per target: under a second for all four

TOKENS = ["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "9" * 5000, "1" + "0" * 400, "-1", "0", "1.5",
          "true", "false", "null", '""', '"x"', "[]", "{}", '"\\u0000"', '"\\ud800"', "\x00", '"' + "a" * 300 + '"',
          "[" * 5000, '{"a":' * 3000, "[" * 200 + "]" * 200, "\ufeff", "\n", '"', ",", ":", "}", "]"]
VALUES: list[Any] = [True, False, None, 0, -1, 1, 2**64, -(2**63), 1.5, 1e308, -1e-308, "", "text", "2", "1e-5",
                     "true", "a\x00b", "a" * 5000, "/" + "x" * 300, "../../etc", "\ud800", "~", "~nobody/x", [],
                     [1, 2], [True], {}, {"a": 1}, [[[[1]]]]]
DEEP = "\x01DEEP\x01"  # a placeholder value, replaced by real nesting after json.dumps


# --------------------------------------------------------------------------- mutations

def _paths(value: Any, path: tuple = ()) -> list[tuple]:
    """Every (path of keys / indices) inside a JSON value, the root included."""
    out = [path]
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        out += _paths(v, path + (k,))
    return out


def _swap(rng: random.Random, doc: Any) -> Any:
    """A copy of `doc` with one node replaced, removed or renamed."""
    doc = json.loads(json.dumps(doc))
    path = rng.choice(_paths(doc)[1:])
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    action = rng.random()
    if action < 0.6:
        parent[path[-1]] = rng.choice(VALUES + [DEEP])
    elif action < 0.8:
        del parent[path[-1]]
    elif isinstance(parent, dict):
        parent[rng.choice(["", "x", "a\nb", "\x00", path[-1] + "_"])] = parent.pop(path[-1])
    return doc


def _bytes(rng: random.Random, data: bytes) -> bytes:
    """One byte-level edit: flip, delete, duplicate, truncate, or insert a token."""
    if not data:
        return rng.choice(TOKENS).encode()
    i = rng.randrange(len(data))
    j = min(len(data), i + rng.randint(1, 40))
    kind = rng.randrange(5)
    if kind == 0:
        return data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1:]
    if kind == 1:
        return data[:i] + data[j:]
    if kind == 2:
        return data[:j] + data[i:j] + data[j:]
    if kind == 3:
        return data[:i]
    return data[:i] + rng.choice(TOKENS).encode("utf-8", "surrogatepass") + data[i:]


def mutate(rng: random.Random, doc: Any) -> bytes:
    """0-3 structural edits of `doc`, then byte edits of its text in 2 cases out of 5 (most byte
    edits break the JSON syntax, which would leave the validation behind it untested)."""
    for _ in range(rng.randint(0, 3)):
        if isinstance(doc, (dict, list)) and len(_paths(doc)) > 1:
            doc = _swap(rng, doc)
    deep = rng.choice(["[" * 100_000 + "]" * 100_000, '{"a":' * 50 + "1" + "}" * 50, "[" * 30 + "]" * 30])
    text = json.dumps(doc, indent=rng.choice([None, 2])).replace(json.dumps(DEEP), deep)
    data = text.encode("utf-8", "surrogatepass")
    for _ in range(rng.choice([0, 0, 0, 1, 3])):
        data = _bytes(rng, data)
    return data


def _one_case(seed: str, shown: str, run: Callable[[], Any]) -> bool:
    """True: success; False: a one-line UserInputError; anything else fails the test."""
    try:
        run()
    except UserInputError as e:
        msg = str(e)
        assert msg and msg.splitlines() == [msg], f"case {seed}: a message of {len(msg.splitlines())} lines: " \
                                                  f"{msg[:300]!r}\ninput: {shown[:1000]}"
        return False
    except Exception as e:  # noqa: BLE001 - anything else is what the test looks for
        pytest.fail(f"case {seed}: {type(e).__name__}: {str(e)[:300]}\ninput: {shown[:1000]}")
    return True


def _both_outcomes(outcomes: list[bool]) -> None:
    # mutations that never succeed (or never fail) would test only one path of the reader
    assert 0 < sum(outcomes) < len(outcomes), f"{sum(outcomes)} of {len(outcomes)} mutated inputs were valid"


# --------------------------------------------------------------------------- valid starting points

def _config(tmp: Path) -> dict:
    return {"config_version": 2,
            "identity": {"run_name": "fuzz", "output_dir": "runs", "pretrained_model_name_or_path": "teacher",
                         "teacher_config_dir": None, "model_family": "auto", "train_data_dir": "data",
                         "student": "lora", "fake_score": "full", "lora_rank": 8, "lora_alpha": 16},
            "resources": {"mixed_precision": "bf16", "gradient_checkpointing": True, "train_batch_size": 2,
                          "resolution": 64, "seed": 3, "teacher_precision": "auto", "cache_latents": False},
            "optimization": {"generator_lr": 1e-5, "critic_lr": 1, "adam_beta1": 0.0, "max_train_steps": 10,
                             "lr_scheduler": "cosine"},
            "distillation": {"student_steps": 2, "student_timesteps": [999, 499], "real_guidance_scale": 3.0,
                             "ema_decay": 0.99},
            "observation": {"prompt_set": "ps.json", "resume_from_checkpoint": "latest", "validation_steps": 5}}


def _datasets(tmp: Path) -> list:
    for name in ("a", "b"):
        (tmp / name).mkdir(exist_ok=True)
    return [{"id": "a", "instance_data_dir": "a", "repeats": 1, "probability": 0.5, "crop": True,
             "bucket_step": 64},
            {"id": "b", "instance_data_dir": "b", "caption_strategy": "instanceprompt", "instance_prompt": "x",
             "resolution": 512, "cache_dir": "cache"}]


PROMPTS = {"prompt_set": "fuzz", "version": "v1", "resolution": [64, 48], "seed": 1, "sampler": "euler",
           "steps": 20, "cfg": 5, "items": [{"id": "a", "topic": "t", "prompt": "a cat", "seed": 7},
                                            {"id": "b", "topic": "t", "prompt": "a dog", "negative_prompt": "x"}]}

TARGETS = {"config": (_config, load_config), "dataset_list": (_datasets, load_dataset_list),
           "prompt_set": (lambda tmp: PROMPTS, load_prompt_set)}


@pytest.mark.parametrize("target", TARGETS)
def test_mutated_files_give_success_or_one_line_error(target, tmp_path):
    make, load = TARGETS[target]
    base = make(tmp_path)
    load_path = tmp_path / f"{target}.json"
    load_path.write_text(json.dumps(base))
    load(load_path)  # the starting point is valid: mutations start from a success
    outcomes = []
    for i in range(CASES):
        seed = f"{target}-{i}"
        data = mutate(random.Random(seed), base)
        load_path.write_bytes(data)
        outcomes.append(_one_case(seed, repr(data), lambda: load(load_path)))
    _both_outcomes(outcomes)


# Dotted keys a --set item may name: every config field, a few that do not exist, and broken ones.
SET_KEYS = ["resources.train_batch_size", "resources.gradient_checkpointing", "optimization.generator_lr",
            "identity.run_name", "identity.train_data_dir", "identity.teacher_config_dir", "distillation",
            "distillation.student_timesteps", "observation.prompt_set", "config_version", "resources.nope",
            "resources.resolution.x", "", ".", "identity..run_name", "a\nb", "resources.seed\x00"]


def _set_item(rng: random.Random) -> str:
    value = rng.choice([json.dumps(rng.choice(VALUES), ensure_ascii=False), rng.choice(TOKENS), "abc", "2", "1e-4"])
    if rng.random() < 0.5:
        value = _bytes(rng, value.encode("utf-8", "surrogatepass")).decode("utf-8", "surrogateescape")
    item = f"{rng.choice(SET_KEYS)}={value}"
    return item if rng.random() < 0.9 else item.replace("=", "", 1)


def test_mutated_set_items_give_success_or_one_line_error(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_config(tmp_path)))
    load_config(path, ["resources.train_batch_size=4"])
    outcomes = []
    for i in range(CASES):
        seed = f"set-{i}"
        rng = random.Random(seed)
        items = [_set_item(rng) for _ in range(rng.randint(1, 3))]
        outcomes.append(_one_case(seed, repr(items), lambda: load_config(path, items)))
    _both_outcomes(outcomes)
