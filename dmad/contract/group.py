"""The base of every config group (dmad.contract.config, and the distillation group in
dmad.contract.methods): strict types, no unknown keys. Torch-free."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Group(BaseModel):
    # strict: true is not a batch size and "2" is not a learning rate (a JSON integer still is a
    # float); a typo is an error, never a guess.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True)
