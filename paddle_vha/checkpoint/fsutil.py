"""Output folders that appear whole or not at all, and read-only views of input folders."""
from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager

__all__ = ["atomic_dir", "check_output_dir", "linked_view"]


@contextmanager
def atomic_dir(dest: str):
    """Yield an empty temporary folder beside `dest`; when the block succeeds it becomes `dest`.

    An existing `dest` is swapped out only once the new folder is complete, then deleted. If the block raises,
    the temporary folder is removed and `dest` is left as it was: a tool never leaves a half-written output.
    """
    dest = os.path.abspath(dest)
    parent = os.path.dirname(dest)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(dest)}.tmp-", dir=parent)
    try:
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700; give the folder the usual permissions
        old = None
        if os.path.lexists(dest):
            old = tempfile.mkdtemp(prefix=f".{os.path.basename(dest)}.old-", dir=parent)
            os.rename(dest, os.path.join(old, "x"))
        os.rename(tmp, dest)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def linked_view(src: str, dst: str) -> str:
    """A folder of symlinks to src's files, so loaders that write caches into the folder they load
    (PaddleFormers' flex-ckpt metadata) write into dst, never into src."""
    os.makedirs(dst)
    for f in os.listdir(src):
        if os.path.isfile(os.path.join(src, f)) and not f.endswith(".metadata"):
            os.symlink(os.path.abspath(os.path.join(src, f)), os.path.join(dst, f))
    return dst


def check_output_dir(in_dir: str, out_dir: str, force: bool, error=ValueError) -> None:
    """Refuse (raising `error` with one line) an OUT_DIR that is IN_DIR, nests with it, is not a folder, or
    already exists without `force`."""
    a, b = os.path.realpath(in_dir), os.path.realpath(out_dir)
    if a == b or b.startswith(a + os.sep) or a.startswith(b + os.sep):
        raise error(f"{out_dir}: OUT_DIR must be a different folder from IN_DIR {in_dir}, neither inside the other")
    if os.path.lexists(out_dir):
        if not os.path.isdir(out_dir) or os.path.islink(out_dir):
            raise error(f"{out_dir}: exists and is not a folder; refusing to replace it")
        if not force:
            raise error(f"{out_dir}: already exists (pass --force to replace it)")
