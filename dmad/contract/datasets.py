"""The dataset list JSON, in the spirit of SimpleTuner's multidatabackend:
a JSON list of entries, each a local folder of images. A plain folder is a one-entry list.
Torch-free: `dmad check-data` reads it. Relative folders resolve against the JSON file's folder,
so a list can move with its data."""
from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dmad.contract.config import PathStr
from dmad.contract.jsonfile import check_path, printable, read_json_file
from dmad.errors import UserInputError


class DatasetEntry(BaseModel):
    # strict, as the run config: "crop": 1 and "repeats": "2" are typos, not values
    model_config = ConfigDict(extra="forbid", strict=True)

    id: str = Field(min_length=1, description="unique name of the dataset (reports and events use it)")
    type: Literal["local"] = Field("local", description="where the images are: only local folders for now")
    instance_data_dir: PathStr = Field(min_length=1, description="folder of images (relative: to the JSON file)")
    caption_strategy: Literal["textfile", "filename", "instanceprompt"] = Field(
        "textfile", description="textfile: <stem>.txt beside the image; filename: the stem (_ and - as spaces); "
                                "instanceprompt: instance_prompt for every image")
    instance_prompt: Optional[str] = Field(None, description="the caption of every image (instanceprompt)")
    resolution: Optional[int] = Field(None, gt=0, description="target size (default: the run's resolution)")
    resolution_type: Literal["pixel", "pixel_area"] = Field(
        "pixel_area", description="pixel: shorter side = resolution; pixel_area: about resolution**2 pixels")
    minimum_image_size: Optional[int] = Field(None, ge=0, description="shorter side below this: skipped")
    repeats: int = Field(0, ge=0, le=10_000, description="extra passes over this dataset per epoch: its images "
                                                         "count 1 + repeats times")
    probability: float = Field(1.0, ge=0.0, le=1.0,
                               description="sampling weight: a batch comes from this dataset with chance proportional "
                                           "to probability x usable images x (1 + repeats); 0: not used")
    crop: bool = Field(False, description="crop to the bucket (else resize)")
    crop_style: Literal["center", "random", "corner"] = Field("center", description="where to crop")
    crop_aspect: Literal["square", "preserve"] = Field("preserve", description="square crops or the bucket's aspect")
    cache_dir: Optional[PathStr] = Field(None, description="latent and text-embedding cache folder (relative: to the JSON "
                                                       "file; default: a folder per dataset under the user cache)")
    bucket_step: Optional[int] = Field(None, ge=8, le=1024, multiple_of=8,
                                       description="bucket rounding: bucket sides are multiples of this (default 64, "
                                                   "or the resolution when smaller)")
    bucket_rounding: Literal["nearest", "down"] = Field(
        "nearest", description="bucket sides: the nearest multiple of bucket_step (closest aspect and area; never past "
                               "the image), or rounded down (the bucket always inside the scaled image)")
    caption_lines: Literal["join", "first", "random"] = Field(
        "join", description="a multi-line caption: join (lines joined with spaces), first (the first non-empty "
                            "line), random (one line per draw, for files with several captions)")

    @model_validator(mode="after")
    def _prompt_needed(self) -> "DatasetEntry":
        if self.caption_strategy == "instanceprompt" and not (self.instance_prompt or "").strip():
            raise ValueError("caption_strategy 'instanceprompt' needs a non-empty instance_prompt")
        return self

    @property
    def root(self) -> Path:
        return Path(self.instance_data_dir)

    def target_resolution(self, run_resolution: int) -> int:
        return self.resolution or run_resolution

    def step(self, run_resolution: int) -> int:
        """The bucket rounding step: bucket_step, else 64 (Stable Diffusion's latent grid needs
        multiples of 64 pixels), or the resolution when that is smaller (tiny models)."""
        return self.bucket_step or min(64, self.target_resolution(run_resolution))


def _resolved_dir(base: Path, folder: str, where: str) -> str:
    try:  # ~ without a home folder (RuntimeError)
        out = str((base / folder).expanduser().resolve())
    except (OSError, RuntimeError, ValueError) as e:
        raise UserInputError(f"{where}: cannot resolve it ({e.__class__.__name__}: {printable(str(e))})") from None
    check_path(out, where)  # the folder joined to the list's own can be too long
    return out


def _resolve(entry: DatasetEntry, base: Path, where: str) -> DatasetEntry:
    dirs = {"instance_data_dir": _resolved_dir(base, entry.instance_data_dir, f"{where} 'instance_data_dir'")}
    if entry.cache_dir:
        dirs["cache_dir"] = _resolved_dir(base, entry.cache_dir, f"{where} 'cache_dir'")
    return entry.model_copy(update=dirs)


def _entry_error(e: ValidationError, source: Path, index: int) -> str:
    err = e.errors()[0]
    field = printable(".".join(str(p) for p in err["loc"]))
    where = f"{printable(str(source))}: entry {index}" + (f" '{field}'" if field else "")
    if err["type"] == "extra_forbidden":
        return f"{where}: unknown key (valid keys: {', '.join(DatasetEntry.model_fields)})"
    if err["type"] == "missing":
        return f"{where}: missing required field"
    return f"{where}: {printable(err['msg'].removeprefix('Value error, '))}"


def parse_dataset_list(raw: object, source: Path) -> list[DatasetEntry]:
    """Entries from the decoded JSON of `source`; UserInputError (one line) when it is not valid."""
    if not isinstance(raw, list) or not raw:
        raise UserInputError(f"{source}: a dataset list is a non-empty JSON list of entries")
    entries = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise UserInputError(f"{source}: entry {i} is not a JSON object")
        try:
            entries.append(_resolve(DatasetEntry.model_validate(item), source.parent, f"{printable(str(source))}: entry {i}"))
        except ValidationError as e:
            raise UserInputError(_entry_error(e, source, i)) from None
    ids = [e.id for e in entries]
    dup = next((x for x in ids if ids.count(x) > 1), None)
    if dup is not None:
        raise UserInputError(f"{printable(str(source))}: dataset id '{printable(dup)}' is used twice")
    if not any(e.probability > 0 for e in entries):
        raise UserInputError(f"{source}: every dataset has probability 0: nothing to train on")
    for e in entries:
        if not e.root.is_dir():
            raise UserInputError(f"{printable(str(source))}: dataset '{printable(e.id)}': instance_data_dir is not a "
                                 f"folder: {printable(str(e.root))}")
    return entries


def dataset_name(path: str | Path, entries: list[DatasetEntry]) -> str:
    """What run names and reports call the data: the entry's id, or the list file's stem."""
    return entries[0].id if len(entries) == 1 else Path(path).stem


def load_dataset_list(path: str | Path) -> list[DatasetEntry]:
    """A dataset list JSON, or a folder (one 'textfile' entry whose id is the folder's name)."""
    path = check_path(path, "dataset list").expanduser().resolve()
    if path.is_dir():
        return [DatasetEntry(id=path.name or "data", instance_data_dir=str(path))]
    if not path.is_file():
        raise UserInputError(f"not a folder or a dataset list file: {printable(str(path))}")
    return parse_dataset_list(read_json_file(path, "dataset list"), path)
