"""One training run per output_dir: the first run holds an exclusive lock on output_dir/.paddle_vha_train.lock for its
whole life; a second run into the same folder is refused in one line instead of interleaving its checkpoints and
train_log.jsonl with the first's. The lock is the kernel's (flock): it goes away with the process, however it ends,
so a killed run never leaves a stale lock behind."""
from __future__ import annotations

import fcntl
import os

from .errors import TrainError

__all__ = ["LOCK_FILE", "hold_run_lock", "hold_lock"]

LOCK_FILE = ".paddle_vha_train.lock"


def hold_run_lock(output_dir: str):
    """The open, locked lock file of output_dir (keep it referenced for the run's life), or None on the ranks other
    than 0 of a multi-process job (their rank 0 holds it for the job); TrainError if another run holds it."""
    if int(os.environ.get("PADDLE_TRAINER_ID", "0") or 0) != 0:
        return None
    os.makedirs(output_dir, exist_ok=True)
    f = hold_lock(os.path.join(output_dir, LOCK_FILE))
    if f is None:
        raise TrainError(f"output_dir {output_dir}: another training run is writing it (it holds {LOCK_FILE}); wait "
                         "for it to finish or choose another output_dir") from None
    return f  # empty and never written: a refused or resumed run leaves output_dir byte-identical


def hold_lock(path: str):
    """The open file `path` (created empty if missing) with an exclusive flock on it, or None when another process
    holds it. Keep the file referenced for as long as the work it guards goes on."""
    f = open(path, "a+", encoding="utf-8")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    return f
