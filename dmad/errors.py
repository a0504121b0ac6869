"""Errors that the CLI turns into one line on stderr and an exit code (DESIGN.md)."""

EXIT_OK = 0
EXIT_RUN_FAILED = 1
EXIT_INVALID_INPUT = 2
EXIT_OUT_OF_MEMORY = 3


class DmadError(Exception):
    """Base: the message is shown to the user as one line, without a traceback."""

    exit_code = EXIT_RUN_FAILED


class UserInputError(DmadError):
    """Invalid config, data or arguments: exit 2. The message names the problem and where."""

    exit_code = EXIT_INVALID_INPUT


class RunFailed(DmadError):
    """The run started but could not finish (an error event says why): exit 1."""

    exit_code = EXIT_RUN_FAILED


class CheckpointUnusable(UserInputError):
    """A checkpoint that cannot be resumed from (a file missing, truncated, of the wrong shape or
    not a plain tensor file). Resuming 'latest' falls back to an older complete checkpoint; with
    none left it is exit 2."""


class CheckpointMismatch(CheckpointUnusable):
    """A whole checkpoint that this config cannot continue (another method, no EMA weights for an
    EMA config, another LoRA rank or student timesteps): exit 2 before anything is touched, and no
    fallback, since the run's older checkpoints were trained the same way."""


class DiskFull(RunFailed):
    """The disk filled up while the run was writing: exit 1; nothing complete is lost, temp files are
    removed and the run continues with --resume latest once there is space."""


class StopRequested(Exception):
    """A stop command (control.jsonl, SIGTERM) arrived before training began: the engine stops at
    the next phase boundary, writing no checkpoint. Not an error."""
