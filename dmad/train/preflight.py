"""Checks that run before anything heavy: data, prompt set, teacher, run folder, resume target.

Everything a user can get wrong is found here and reported as one UserInputError line naming
the problem and where. The cheap checks come first and need no torch (well under a second; the
data scan reads image headers and captions only); the teacher's configs are inspected last,
which imports torch and diffusers (~1-3 s). `dmad train --dry-run` stops after these checks;
a real run goes on to dmad.train.loop with the facts gathered here.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from dmad.contract.config import TrainConfig
from dmad.contract.datafiles import IMAGE_EXTS, caption_of, images_in
from dmad.errors import UserInputError
from dmad.contract.runs import RunFolder, check_not_in_use, default_run_name

if TYPE_CHECKING:  # both import torch or pydantic models we only name here
    from dmad.models.teacher import TeacherInfo
    from dmad.contract.prompts import PromptSet


@dataclass(frozen=True)
class DataSummary:
    folder: Path    # train_data_dir: a folder or a dataset list file
    images: int     # image files at the top of the dataset folders
    captioned: int  # of those, images with a caption (a .txt of the same stem, or by caption_strategy)
    usable: Optional[int] = None  # of those, images that pass the checks training applies (dmad.data.scan)
    name: str = ""  # the dataset's id, or the list file's stem
    buckets: int = 0  # (dataset, bucket) groups batches are drawn from

    @property
    def dataset_id(self) -> str:
        return self.name or self.folder.name


@dataclass(frozen=True)
class ResumeTarget:
    iteration: int
    checkpoint: Path  # <run>/checkpoints/iter_<N>, complete (checkpoints are renamed into place) and verified
    fallbacks: tuple[Path, ...] = ()  # older checkpoints, newest first, tried when this one fails to load
    skipped: tuple[str, ...] = ()  # newer checkpoints passed over, and why (warning events)


@dataclass
class Preflight:
    run_dir: Path
    teacher_info: "TeacherInfo"
    prompt_set: "PromptSet"
    data: DataSummary
    resume: Optional[ResumeTarget]
    restart: bool = False  # --resume latest on a run that ended before its first checkpoint: from iteration 0

    @property
    def resume_arg(self) -> Optional[str]:
        """What dmad.train.loop's `resume` takes: the checkpoint folder, or None for a fresh start."""
        return str(self.resume.checkpoint) if self.resume else None

    @property
    def teacher_has_weights(self) -> bool:
        return self.teacher_info.has_weights

    def require_teacher_weights(self) -> None:
        """A dry run can estimate memory from the configs alone; training needs the weights."""
        if not self.teacher_info.has_weights:
            raise UserInputError(f"teacher has no weights: {self.teacher_info.path} "
                                 f"(missing: {'; '.join(self.teacher_info.missing_weights)})")

    def require_space(self, cfg: TrainConfig) -> None:
        """Room for one checkpoint where the run is written, checked before anything is: about the
        size of the checkpoint resumed from, else an estimate from the teacher's parameter counts
        (dmad.memory.ledger.checkpoint_bytes). Otherwise exit 2 with the folder, the bytes needed
        and the bytes free, and nothing written."""
        from dmad.contract.diskspace import check_free_space
        from dmad.memory.ledger import checkpoint_bytes

        needed = folder_bytes(self.resume.checkpoint) if self.resume else checkpoint_bytes(cfg, self.teacher_info)
        check_free_space("one checkpoint", self.run_dir, needed,
                         advice="free some space, or choose another --run-dir / identity.output_dir")


def folder_bytes(folder: Path) -> int:
    """The bytes of the files in `folder` and below (links not followed)."""
    import os

    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def preflight(cfg: TrainConfig, run_dir: Optional[Path] = None, resume: Optional[str] = None,
              launched: bool = False) -> Preflight:
    """`run_dir`: --run-dir (absolute) or None for output_dir/run_name (or a dated default name).
    `resume`: 'latest', a checkpoint or run folder, or None for a fresh start. `launched`: a rank
    of a multi-process run (dmad.train.launch): the launcher checked the run folder, which rank 0 may
    have created already."""
    from dmad.contract.prompts import default_prompt_set_path, load_prompt_set
    from dmad.train.trackers import tracker_problem

    problem = tracker_problem(cfg.observation.report_to)  # a missing package, found before anything is read
    if problem:
        raise UserInputError(problem)
    prompt_set = load_prompt_set(cfg.observation.prompt_set or default_prompt_set_path())
    data = check_usable(summarize_data(Path(cfg.identity.train_data_dir)), cfg)
    if run_dir is None and resume not in (None, "latest"):
        run_dir = _run_dir_of_checkpoint(Path(resume))
    if run_dir is None:
        run_dir = default_run_dir(cfg, data.dataset_id, prompt_set.name, str(prompt_set.version),
                                  resume_latest=resume == "latest")
    run_dir = Path(run_dir).resolve()
    check_run_dir_place(run_dir)
    check_run_files(run_dir)
    if not launched:  # a rank's launcher checked, and rank 0 holds the lock by now
        check_not_in_use(run_dir)
    check_precision_here(cfg.resources.mixed_precision)
    target = find_resume_target(run_dir, resume, cfg) if resume else None
    restart = resume is not None and target is None
    if target is None and not restart and not launched:
        check_fresh_run_dir(run_dir)
    teacher_info = _inspect_teacher(cfg)  # last: it imports torch and diffusers (~1-3 s)
    return Preflight(run_dir=run_dir, teacher_info=teacher_info, prompt_set=prompt_set, data=data, resume=target,
                     restart=restart)


def _inspect_teacher(cfg: TrainConfig) -> "TeacherInfo":
    from dmad.models.teacher import inspect_teacher  # reads configs and file headers only

    from dmad.models.teacher_loras import check_teacher_loras  # headers only: before any weight loads

    ident = cfg.identity
    info = inspect_teacher(ident.pretrained_model_name_or_path, ident.model_family, ident.teacher_config_dir)
    check_teacher_loras(ident.teacher_loras)
    return info


def summarize_data(source: Path) -> DataSummary:
    """Image and caption counts of a folder or a dataset list; a source with no captioned image at
    all is refused here (one line), before the per-item scan."""
    from dmad.contract.datasets import dataset_name, load_dataset_list

    if not source.exists():
        raise UserInputError(f"train_data_dir not found: {source}")
    entries = load_dataset_list(source)
    images = captioned = 0
    for e in entries:
        found = images_in(e.root)
        has = sum(1 for p in found if caption_of(p).is_file()) if e.caption_strategy == "textfile" else len(found)
        images, captioned = images + len(found), captioned + has
    if not captioned:
        what = f"{images} images but no .txt captions" if images else "no images"
        raise UserInputError(f"train_data_dir {source}: {what} (need image files "
                             f"({', '.join(IMAGE_EXTS)}) each with a .txt caption of the same stem)")
    return DataSummary(folder=source, images=images, captioned=captioned, name=dataset_name(source, entries))


def check_usable(summary: DataSummary, cfg: TrainConfig) -> DataSummary:
    """Training's per-item checks from file headers and captions (no pixel decoding), and its
    buckets: fewer usable images than one effective batch stop here, before any model loads."""
    from dmad.data.scan import require_batch, scan_datasets
    from dmad.train.launch import world_rank
    from dmad.contract.datasets import load_dataset_list

    res = cfg.resources
    sets = scan_datasets(load_dataset_list(summary.folder), res.resolution, res.train_batch_size)
    require_batch(sets, cfg.effective_batch(world_rank()[1]), summary.folder)
    return replace(summary, usable=sum(len(d.items) for d in sets),
                   buckets=sum(len(d.buckets()) for d in sets))


def default_run_dir(cfg: TrainConfig, dataset_id: str, prompt_set_name: str, prompt_set_version: str,
                    resume_latest: bool = False) -> Path:
    out = Path(cfg.identity.output_dir).expanduser()
    if cfg.identity.run_name:
        return out / cfg.identity.run_name
    if resume_latest:  # a dated name is new every minute: it cannot name the run to continue
        raise UserInputError("--resume latest needs the run folder: give --run-dir DIR or set identity.run_name")
    return out / default_run_name(dataset_id, prompt_set_name, prompt_set_version)


def _run_dir_of_checkpoint(path: Path) -> Path:
    """--resume runs/x/checkpoints/iter_500 continues runs/x; --resume runs/x means its latest."""
    if path.parent.name == "checkpoints":
        return path.parent.parent
    return path


def check_precision_here(mixed_precision: str) -> None:
    """What this machine cannot run, found before a run folder is touched."""
    if mixed_precision == "fp16":
        import torch

        if not torch.cuda.is_available():
            raise UserInputError("resources.mixed_precision: fp16 needs a CUDA GPU; use bf16 or no on a CPU")


def find_resume_target(run_dir: Path, resume: str, cfg: TrainConfig) -> Optional[ResumeTarget]:
    """The checkpoint to resume from, verified (dmad.models.checkpoint.verify_checkpoint). 'latest' (or
    the run folder) takes the newest usable one, passing over damaged newer ones (named in
    `skipped`); None when the run has no checkpoint at all: it ended before its first one, and
    starts again from iteration 0 (diffusers' scripts do the same with a missing 'latest'). A
    named checkpoint is used as it is or refused. A whole checkpoint that this config cannot
    continue (CheckpointMismatch: another method, EMA, LoRA rank or targets, student timesteps) is refused
    at once: the run's older checkpoints were trained the same way."""
    from dmad.methods import method_unit
    from dmad.models.checkpoint import Expected, pick_checkpoint
    from dmad.errors import CheckpointMismatch, CheckpointUnusable

    ident, dist = cfg.identity, cfg.distillation
    layout = method_unit(dist.method).layout(ident)  # the files its method saves, its networks' modes
    expected = Expected(ema=dist.ema_decay is not None, lora_rank=ident.lora_rank,
                        timesteps=dist.resolved_student_timesteps(), lora_targets=ident.lora_targets)
    run = RunFolder(run_dir)
    if not run_dir.is_dir():
        raise UserInputError(f"--resume {resume}: run folder not found: {run_dir}")
    if not run.config_json.is_file() and not run.has_no_run():
        raise UserInputError(f"--resume {resume}: not a run folder (no config.json): {run_dir}")
    found = run.list_checkpoints()
    path = Path(resume)
    named = resume != "latest" and path.resolve() != run_dir
    if named:
        order = [(it, p) for it, p in found if p.resolve() == path.resolve()]
        if not order:
            have = ", ".join(f"iter_{it}" for it, _ in found) or "none"
            raise UserInputError(f"--resume {resume}: not a complete checkpoint of {run_dir} (checkpoints: {have})")
    else:
        order = run.checkpoints_from_latest()
        if not order:
            return None
    try:
        picked = pick_checkpoint(order, layout, expected, named=named)
    except CheckpointMismatch as e:
        raise UserInputError(f"--resume {resume}: {e}{_OWN_CONFIG.format(run=run_dir)}") from None
    except CheckpointUnusable as e:
        raise UserInputError(f"--resume {resume}: {e}") from None
    return ResumeTarget(iteration=picked.iteration, checkpoint=picked.path, fallbacks=picked.fallbacks,
                        skipped=picked.skipped)


_OWN_CONFIG = ": continue with the run's own config ({run}/config.json) or start a new run; nothing was changed"


def check_run_dir_place(run_dir: Path) -> None:
    """A run folder can only be made where every existing parent is a folder: a regular file on
    the way would pass the checks and fail on the first write."""
    for parent in [run_dir, *run_dir.parents]:
        if parent.exists() or parent.is_symlink():
            if not parent.is_dir():
                raise UserInputError(f"run folder {run_dir}: {parent} is a file, not a folder")
            return


def check_run_files(run_dir: Path) -> None:
    """Refuses (exit 2, nothing touched) a run folder where one of the run's files is a FIFO, a socket,
    a device or a folder: the engine would wait forever opening a FIFO, or fail mid-run on the rest."""
    problems = RunFolder(run_dir).irregular_files() if run_dir.is_dir() else []
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise UserInputError(f"run folder {run_dir}: {problems[0]}{more}: remove it, or put the run's own file back; "
                             f"nothing was changed")


def check_fresh_run_dir(run_dir: Path) -> None:
    run = RunFolder(run_dir)
    if run.has_no_run():
        return
    if run_dir.is_dir() and run.config_json.is_file() and not run.list_checkpoints():
        raise UserInputError(f"run folder already exists: {run_dir}, with no checkpoint (its engine ended before the "
                             f"first one): --resume latest starts it again from iteration 0 in the same folder; or "
                             f"choose another --run-dir / identity.run_name")
    raise UserInputError(f"run folder already exists: {run_dir} (use --resume latest to continue it, "
                         f"or choose another --run-dir / identity.run_name)")
