"""The latent and text-embedding cache: unchanged -> hit; a changed resolution,
VAE or file -> encoded again; broken entries are misses; a run that caches computes exactly what
a run without the cache computes."""
from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture
def cache_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "cache"
    monkeypatch.setenv("DMAD_CACHE_DIR", str(home))
    return home


def _warm(config: Path, *sets: str) -> dict:
    from dmad.data.cache_command import warm_cache
    from dmad.contract.config import load_config

    return warm_cache(load_config(config, list(sets)))


def _entries(home: Path, kind: str) -> set[str]:
    return {p.name for p in home.rglob(f"{kind}/*/*.safetensors")}


def test_unchanged_hits_and_resolution_or_file_changes_encode_again(write_config, tiny_data, cache_home, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    config = write_config({"identity": {"train_data_dir": str(data)}, "resources": {"vae_batch_size": 3}})
    first = _warm(config)
    assert (first["latent_encoded"], first["latent_hits"]) == (8, 0)
    assert first["text_encoded"] == 8 and first["images"] == 8
    latents, texts = _entries(cache_home, "latents"), _entries(cache_home, "text")
    assert len(latents) == 8 and len(texts) == 4  # 8 captions, 4 different texts (colours)
    again = _warm(config)
    assert (again["latent_encoded"], again["latent_hits"], again["text_encoded"]) == (0, 8, 0)
    smaller = _warm(config, "resources.resolution=16")  # other buckets: new latents, same captions
    assert (smaller["latent_encoded"], smaller["latent_hits"], smaller["text_encoded"]) == (8, 0, 0)
    assert len(_entries(cache_home, "latents")) == 16
    img = data / "img_003.png"
    os.utime(img, ns=(img.stat().st_atime_ns, img.stat().st_mtime_ns + 10**9))  # the file changed
    touched = _warm(config)
    assert (touched["latent_encoded"], touched["latent_hits"]) == (1, 7)


def test_a_changed_vae_encodes_again(write_config, tiny_teacher, cache_home, tmp_path):
    from safetensors.torch import load_file, save_file

    config = write_config()
    assert _warm(config)["latent_encoded"] == 8
    other = tmp_path / "teacher"
    shutil.copytree(tiny_teacher, other)
    weights = next((other / "vae").glob("*.safetensors"))
    state = load_file(str(weights))
    name = sorted(state)[0]
    state[name] = state[name] + 0.01
    save_file(state, str(weights))
    changed = _warm(config, f"identity.pretrained_model_name_or_path={json.dumps(str(other))}")
    assert (changed["latent_encoded"], changed["latent_hits"]) == (8, 0)
    assert changed["text_encoded"] == 0  # the text encoder did not change: its embeddings still hit
    same = _warm(config, f"identity.pretrained_model_name_or_path={json.dumps(str(other))}")
    assert same["latent_hits"] == 8


def test_broken_entries_are_misses_and_writes_are_atomic(write_config, cache_home):
    config = write_config()
    _warm(config)
    files = sorted(cache_home.rglob("latents/*/*.safetensors"))
    files[0].write_bytes(files[0].read_bytes()[:40])  # truncated (a disk filled up, say)
    files[1].write_bytes(b"")
    again = _warm(config)
    assert (again["latent_encoded"], again["latent_hits"]) == (2, 6)
    assert not list(cache_home.rglob("*.tmp"))  # no temp file left behind


def _losses(run: Path) -> list[dict]:
    with open(run / "metrics.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return [{k: v for k, v in r.items() if k.startswith("loss")} for r in rows]


def test_training_with_the_cache_computes_what_training_without_it_does(write_config, tmp_path, cache_home):
    from dmad.contract.config import load_config
    from dmad.train.loop import run_training

    base = {"optimization": {"max_train_steps": 3}, "observation": {"log_every_steps": 1, "checkpointing_steps": 100},
            "resources": {"train_batch_size": 2}}
    runs = {}
    for name, cached in (("plain", False), ("cold", True), ("warm", True)):
        extra = json.loads(json.dumps(base))
        extra["resources"]["cache_latents"] = cached
        cfg = load_config(write_config(extra, name=f"{name}.json"))
        assert run_training(cfg, run_dir=tmp_path / name, resume=None, argv=["dmad", "train"]) == 0
        runs[name] = tmp_path / name
    assert _losses(runs["plain"]) == _losses(runs["cold"]) == _losses(runs["warm"])
    assert len(_losses(runs["plain"])) == 3
    status = {n: json.loads((runs[n] / "status.json").read_text()) for n in ("cold", "warm")}
    assert "cache" not in json.loads((runs["plain"] / "status.json").read_text())
    assert status["cold"]["cache"]["latent_encoded"] > 0
    assert status["warm"]["cache"]["latent_encoded"] == 0 and status["warm"]["cache"]["latent_hits"] == 6


def test_dmad_cache_command(write_config, dmad_cli, cache_home, capsys):
    from tests.conftest import dmad_captured

    config = write_config()  # the two runs in this process (a CLI start is ~7 s), the bad one as a user starts it
    code, out, err = dmad_captured(capsys, "cache", "--config", str(config), "--progress")
    assert code == 0, err
    assert out.startswith("latents: 8 encoded, 0 already cached; captions: ") and str(cache_home) in out
    assert "progress 8 8" in err
    code, out, err = dmad_captured(capsys, "cache", "--config", str(config))
    assert code == 0 and "latents: 0 encoded, 8 already cached; captions: 0 encoded, 8 already cached" in out
    bad = dmad_cli("cache", "--config", str(config), "--set", "identity.train_data_dir=\"/nope\"")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "/nope" in bad.stderr
