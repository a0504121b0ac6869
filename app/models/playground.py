"""The Playground's side without widgets: a request as `dmad sample --prompt` arguments, what a run
offers (its checkpoints, family, prompt set defaults) and the history of its one-off images.

One-offs live in <run>/samples/oneoff/: the Playground's pairs (<pair>-student.png / -teacher.png,
each with a .json: dmad.sample.one_off) and the live run's "Sample prompt…" images
(iter_<N>-<k>.png with a one-item meta .json). Both are listed, newest first; a .json names its
image and is written after it, so a listed entry has its whole image. Reads run in workers.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from dmad.contract.regular import read_regular
from dmad.contract.runs import RunFolder

ONE_OFF = "oneoff"
FAMILIES_WITHOUT_NEGATIVE = ("flux",)  # guidance-distilled: no negative prompt (dmad.models.families)
MAX_HISTORY = 200


@dataclass(frozen=True)
class Request:
    prompt: str
    checkpoint: str                   # "latest" | "teacher" | an iteration number
    negative_prompt: str = ""
    seed: Optional[int] = None
    steps: Optional[int] = None       # the student's; None: as trained
    cfg: Optional[float] = None       # the student's; None: none
    size: Optional[tuple[int, int]] = None
    teacher: bool = True


def sample_args(run_dir: Path, req: Request) -> list[str]:
    """`dmad sample` arguments for `req` (the engine checks them again and words any problem)."""
    args = ["sample", "--run", str(run_dir), "--checkpoint", req.checkpoint, "--prompt", req.prompt]
    if req.negative_prompt.strip():
        args += ["--negative-prompt", req.negative_prompt]
    for flag, value in (("--seed", req.seed), ("--steps", req.steps), ("--cfg", req.cfg)):
        if value is not None:
            args += [flag, str(value)]
    if req.size is not None:
        args += ["--size", f"{req.size[0]}x{req.size[1]}"]
    if not req.teacher and req.checkpoint != "teacher":
        args.append("--no-teacher")
    return args


@dataclass(frozen=True)
class RunOffer:
    """What a run's Playground can render: its checkpoints (iterations, ascending), its family and
    its prompt set's size and seed (the form's defaults); `problem`: why it cannot ("" when it can)."""
    run_dir: Path
    iterations: tuple[int, ...] = ()
    family: str = "sd"
    size: tuple[int, int] = (512, 512)
    seed: int = 0
    problem: str = ""

    @property
    def negative_prompt(self) -> bool:
        return self.family not in FAMILIES_WITHOUT_NEGATIVE


def _json(path: Path) -> Any:
    return json.loads(read_regular(path).decode("utf-8"))


def read_offer(run_dir: Path) -> RunOffer:
    """Worker side."""
    folder = RunFolder(run_dir)
    try:
        cfg = _json(folder.config_json)
        ps = _json(folder.prompt_set_json)
        family = str(((cfg.get("identity") or {}).get("model_family")) or "sd")
        size = tuple(int(v) for v in ps.get("resolution", (512, 512)))[:2]
        seed = int(ps.get("seed", 0))
    except (OSError, ValueError, TypeError, AttributeError) as e:
        return RunOffer(run_dir, problem=f"{run_dir.name}: cannot read its config or prompt set ({e})")
    try:
        iterations = tuple(it for it, _ in folder.list_checkpoints())
    except OSError:
        iterations = ()
    return RunOffer(run_dir, iterations, family, (size[0], size[1]), seed)


@dataclass
class OneOffPair:
    """One request's images: the student's and/or the teacher's (paths), with what was asked."""
    key: str
    created: float
    prompt: str
    seed: Optional[int]
    student: Optional[Path] = None
    teacher: Optional[Path] = None
    student_meta: dict = field(default_factory=dict)
    teacher_meta: dict = field(default_factory=dict)

    def title(self) -> str:
        meta = self.student_meta or self.teacher_meta
        who = meta.get("checkpoint") or ("teacher" if self.student is None else "live")
        steps = self.student_meta.get("steps")
        bits = [who] + ([f"{steps} steps"] if steps else []) + ([f"seed {self.seed}"] if self.seed is not None else [])
        return f"{self.prompt}  ·  " + ", ".join(bits)


def _entry(path: Path) -> Optional[tuple[str, str, dict]]:
    """(pair key, model, meta) of a one-off .json, or None when it is not one."""
    try:
        meta = _json(path)
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict):
        return None
    if "pair" in meta and meta.get("model") in ("student", "teacher"):
        return str(meta["pair"]), str(meta["model"]), meta
    item = (meta.get("items") or {}).get(ONE_OFF) if isinstance(meta.get("items"), dict) else None
    if meta.get("one_off") and isinstance(item, dict):  # the live engine's "Sample prompt…"
        return path.stem, "student", {**meta, "prompt": item.get("prompt"), "seed": item.get("seed"),
                                      "file": item.get("file", path.with_suffix(".png").name)}
    return None


def scan_one_offs(run_dir: Path) -> list[OneOffPair]:
    """Worker side: the run's one-offs, newest first (at most MAX_HISTORY)."""
    folder = RunFolder(run_dir).samples_dir / ONE_OFF
    pairs: dict[str, OneOffPair] = {}
    try:
        files = sorted((p.stat().st_mtime, p) for p in folder.glob("*.json"))  # one stat a file
    except OSError:
        return []
    for mtime, path in files:
        found = _entry(path)
        if found is None:
            continue
        key, model, meta = found
        image = folder / str(meta.get("file", ""))
        if not image.is_file():
            continue
        pair = pairs.setdefault(key, OneOffPair(key, mtime, str(meta.get("prompt", "")),
                                                meta.get("seed")))
        setattr(pair, model, image)
        setattr(pair, f"{model}_meta", meta)
    return sorted(_beside_live(pairs), key=lambda p: p.created, reverse=True)[:MAX_HISTORY]


BESIDE_S = 3600.0  # a teacher render this close in time to a live one-off of the same request goes beside it


def _same_request(a: dict, b: dict) -> bool:
    return (a.get("prompt") == b.get("prompt") and a.get("seed") == b.get("seed")
            and list(a.get("resolution") or ()) == list(b.get("resolution") or ()))


def _beside_live(pairs: dict[str, OneOffPair]) -> list[OneOffPair]:
    """A live engine's one-off (the student only) and the teacher's image of the same prompt, seed and
    size that the Playground rendered for it on the side (`dmad sample --checkpoint teacher`) are one
    pair: the teacher's goes beside the live image of the nearest time."""
    live = [p for p in pairs.values() if p.student is not None and p.teacher is None]
    alone = [p for p in pairs.values() if p.teacher is not None and p.student is None]
    for t in alone:
        match = min((p for p in live if _same_request(p.student_meta, t.teacher_meta)
                     and abs(p.created - t.created) <= BESIDE_S),
                    key=lambda p: abs(p.created - t.created), default=None)
        if match is not None:
            match.teacher, match.teacher_meta = t.teacher, t.teacher_meta
            live.remove(match)
            del pairs[t.key]
    return list(pairs.values())
