"""Output folders: one rule for every tool that writes, folders that appear whole or not at all, read-only views.

The rule (`check_output_dir`, then `atomic_dir`), shared by fold, compress_kv, export, merge and train:

* OUT may not be an input folder, lie inside one, or contain one; nor be (or contain) the current folder; nor hold
  (or its temporaries hold) any file an input reaches through a link (a shard, the index, a side file symlinked into
  OUT would be deleted with the folder --force replaces);
* an existing OUT is replaced only with --force, and only if this project wrote it (it holds MARKER): --force never
  deletes arbitrary content;
* OUT is written in a temporary sibling folder and renamed into place once complete. Without --force the rename
  never replaces anything: of two runs writing one new OUT, the second to finish fails with one line;
* a temporary folder left by a process that died (kill -9, power loss) is removed by the next run into the same
  parent, with one line saying so (MARKER records the writer's pid, host and start time; a folder without a marker
  proving a dead writer of this host is never removed).
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
import time
from contextlib import contextmanager
from typing import Iterable, Optional

from .contract import CheckpointError

__all__ = ["MARKER", "atomic_dir", "atomic_file", "check_output_dir", "check_output_file", "check_no_overlap", "linked_view", "remove_stale_temporaries",
           "scratch_dir"]

MARKER = ".paddle_vha_output"  # in every folder a paddle-vha tool writes: {"tool", "pid", "start", "created"}


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


_MAX_LINKS_WALKED = 100_000  # entries looked at per input folder (a checkpoint has tens)


def _links(inp: str):
    """(path, resolved target) of `inp` itself and of every symlink under it (not following folder links): the files a
    tool reads from an input folder may live anywhere through these."""
    yield inp, os.path.realpath(inp)
    if not os.path.isdir(inp):
        return
    seen = 0
    for root, dirs, files in os.walk(inp):
        for name in dirs + files:
            seen += 1
            if seen > _MAX_LINKS_WALKED:
                return
            path = os.path.join(root, name)
            if os.path.islink(path):
                yield path, os.path.realpath(path)


def _in_out_or_temporaries(target: str, out: str) -> bool:
    """`target` lies in `out` or in one of its temporaries (.OUT.tmp-*, .OUT.old-*, which atomic_dir deletes)."""
    parent, base = os.path.split(out)
    if _inside(target, out):
        return True
    if not _inside(target, parent) or target == parent:
        return False
    first = os.path.relpath(target, parent).split(os.sep, 1)[0]
    return first.startswith(f".{base}.tmp-") or first.startswith(f".{base}.old-")


def check_no_overlap(out_dir: str, inputs: Iterable[str] = (), error=CheckpointError, input_label: str = "IN_DIR",
                     out_label: str = "OUT_DIR") -> None:
    """Refuse (raising `error` with one line) an output folder that is, lies inside or contains an input, holds (or
    whose temporaries hold) a file an input links to, or is or contains the current folder. `inputs`: the folders
    and files the tool reads; every link inside an input folder is resolved (os.path.realpath)."""
    out = os.path.realpath(out_dir)
    for inp in inputs:
        if inp is None:
            continue
        src = os.path.realpath(inp)
        if _inside(out, src) or _inside(src, out):
            raise error(f"{out_dir}: {out_label} must be a different folder from {input_label} {inp}, neither inside "
                        "the other")
        for path, target in _links(inp):
            if _in_out_or_temporaries(target, out):
                raise error(f"{out_dir}: {out_label} holds {path} of {input_label} {inp} (a link to {target}); "
                            "writing there would destroy the input: choose another folder for the output")
    if _inside(os.path.realpath(os.getcwd()), out):
        raise error(f"{out_dir}: {out_label} is or contains the current folder; choose a new folder for the output")


def check_output_dir(out_dir: str, inputs: Iterable[str] = (), force: bool = False, error=CheckpointError,
                     input_label: str = "IN_DIR") -> None:
    """Refuse (raising `error` with one line) an OUT_DIR that would overwrite an input or the current folder, is not a
    folder, exists without `force`, or exists without this project's MARKER."""
    check_no_overlap(out_dir, inputs, error, input_label)
    if os.path.lexists(out_dir):
        if not os.path.isdir(out_dir) or os.path.islink(out_dir):
            raise error(f"{out_dir}: exists and is not a folder; refusing to replace it")
        if not force:
            raise error(f"{out_dir}: already exists (pass --force to replace it)")
        if not os.path.isfile(os.path.join(out_dir, MARKER)):
            raise error(f"{out_dir}: exists and was not written by paddle-vha (no {MARKER} in it); --force replaces only "
                        "this project's output folders: remove it yourself or choose another folder")


def _start_time(pid: int) -> Optional[str]:
    """The process's start time in clock ticks since boot (Linux), to tell a live writer from a reused pid."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _write_marker(folder: str, tool: str) -> None:
    with open(os.path.join(folder, MARKER), "w", encoding="utf-8") as f:
        json.dump({"tool": tool, "pid": os.getpid(), "host": socket.gethostname(), "start": _start_time(os.getpid()),
                   "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, f)
        f.write("\n")


def _writer_alive(folder: str) -> bool:
    """False only when `folder`'s MARKER proves it was made by a process of this host that is gone (its pid not running,
    or running with another start time); True otherwise. A folder without a readable marker, or with one from another
    host or an older format without a host, is never treated as ours: cleanup deletes only what it can prove it made."""
    try:
        with open(os.path.join(folder, MARKER), encoding="utf-8") as f:
            info = json.load(f)
        pid, host = int(info["pid"]), info["host"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return True
    if host != socket.gethostname() or pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return info.get("start") is None or _start_time(pid) == info.get("start")


def remove_stale_temporaries(dest: str, log=None) -> list:
    """Remove the temporary folders of `dest` (beside it) whose marker proves a dead writer of this host made them (see
    _writer_alive); returns their paths."""
    parent, base = os.path.split(os.path.abspath(dest))
    removed = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        path = os.path.join(parent, name)
        if (name.startswith(f".{base}.tmp-") or name.startswith(f".{base}.old-")) and os.path.isdir(path) \
                and not os.path.islink(path) and not _writer_alive(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
            (log or _note)(f"removed {path}, left by an interrupted earlier run (its process is gone)")
    return removed


def _remove_stale_scratch(prefix: str) -> list:
    """Remove the system temp folder's `prefix`* folders whose marker proves a dead writer of this host (a run killed
    with -9 cannot clean up); returns their paths."""
    root, removed = tempfile.gettempdir(), []
    try:
        names = [n for n in os.listdir(root) if n.startswith(prefix)]
    except OSError:
        return removed
    for name in names:
        path = os.path.join(root, name)
        if os.path.isdir(path) and not os.path.islink(path) and not _writer_alive(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


@contextmanager
def scratch_dir(prefix: str, tool: str = "paddle-vha"):
    """A scratch folder under the system temp folder (`prefix` names it, e.g. "vha-logits-"), with MARKER inside:
    removed when the block ends (also by an exception, Ctrl-C, or SIGTERM through paddle_vha.cli.command), and, if
    the process was killed outright, by the next run that asks for one with the same prefix."""
    _remove_stale_scratch(prefix)
    path = tempfile.mkdtemp(prefix=prefix)
    try:
        _write_marker(path, tool)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _note(message: str) -> None:
    print(f"note: {message}", file=sys.stderr)


@contextmanager
def atomic_dir(dest: str, tool: str = "paddle-vha", replace: bool = True, error=CheckpointError, log=None):
    """Yield an empty temporary folder beside `dest`; when the block succeeds it becomes `dest`.

    The folder gets MARKER first (tool name, pid). replace=False: the final rename fails with `error` (one line)
    if `dest` appeared meanwhile (a concurrent run), nothing replaced. replace=True: an existing `dest` is swapped out
    only once the new folder is complete, then deleted (check it with check_output_dir first). If the block raises,
    the temporary folder is removed and `dest` is left as it was: a tool never leaves a half-written output.
    Temporary folders of dead earlier runs into the same `dest` are removed first.
    """
    dest = os.path.abspath(dest)
    parent = os.path.dirname(dest)
    try:
        os.makedirs(parent, exist_ok=True)
        remove_stale_temporaries(dest, log)
        tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(dest)}.tmp-", dir=parent)
    except OSError as e:  # a parent that is a file, read-only, on a full disk: one line, nothing written
        raise error(f"{dest}: cannot create the output folder in {parent} ({e.strerror or e})") from None
    old = None
    try:
        _write_marker(tmp, tool)
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700; give the folder the usual permissions
        if replace and os.path.lexists(dest):
            old = tempfile.mkdtemp(prefix=f".{os.path.basename(dest)}.old-", dir=parent)
            _write_marker(old, tool)
            os.rename(dest, os.path.join(old, "x"))
        try:
            os.rename(tmp, dest)  # fails if a non-empty dest exists: a concurrent run finished first
        except OSError as e:
            raise error(f"{dest}: appeared while this run was writing it (another run?); nothing replaced "
                        f"({e.strerror})") from None
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            if not os.path.lexists(dest) and os.path.lexists(os.path.join(old, "x")):
                os.rename(os.path.join(old, "x"), dest)  # our rename failed: the previous folder goes back
            shutil.rmtree(old, ignore_errors=True)
        raise


def check_output_file(out_file: str, inputs: Iterable[str] = (), force: bool = False, error=CheckpointError,
                      input_label: str = "IN_DIR", out_label: str = "OUT") -> None:
    """The output-folder rule for a tool that writes one file (export_gguf's OUT.gguf): not inside an input nor
    holding one, not the current folder; an existing OUT is replaced only with `force`, and never a folder."""
    check_no_overlap(out_file, inputs, error, input_label, out_label)
    if os.path.lexists(out_file):
        if os.path.isdir(out_file) or os.path.islink(out_file):
            raise error(f"{out_file}: exists and is not a regular file; refusing to replace it")
        if not force:
            raise error(f"{out_file}: already exists (pass --force to replace it)")


@contextmanager
def atomic_file(dest: str, tool: str = "paddle-vha", replace: bool = False, error=CheckpointError, log=None):
    """Yield a path inside a temporary folder beside `dest` (with MARKER, so a killed run's leftovers are removed by
    the next run, as atomic_dir's); when the block succeeds the file written there becomes `dest` (replacing an
    existing one only if `replace`; without it a `dest` that appeared meanwhile wins, with one line). If the block
    raises, the temporary folder is removed and `dest` is left as it was."""
    dest = os.path.abspath(dest)
    parent, base = os.path.split(dest)
    try:
        os.makedirs(parent, exist_ok=True)
        remove_stale_temporaries(dest, log)
        tmp = tempfile.mkdtemp(prefix=f".{base}.tmp-", dir=parent)
    except OSError as e:
        raise error(f"{dest}: cannot create a temporary folder in {parent} ({e.strerror or e})") from None
    try:
        _write_marker(tmp, tool)
        path = os.path.join(tmp, base)
        yield path
        if not os.path.isfile(path):
            raise error(f"{dest}: nothing was written (a bug)")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(path, 0o666 & ~umask)
        if replace:
            os.replace(path, dest)
        else:
            try:
                os.link(path, dest)  # fails if dest exists: a concurrent run finished first
            except FileExistsError:
                raise error(f"{dest}: appeared while this run was writing it (another run?); nothing replaced") \
                    from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def linked_view(src: str, dst: str) -> str:
    """A folder of symlinks to src's files, so loaders that write caches into the folder they load
    (PaddleFormers' flex-ckpt metadata) write into dst, never into src."""
    os.makedirs(dst)
    for f in os.listdir(src):
        if os.path.isfile(os.path.join(src, f)) and not f.endswith(".metadata"):
            os.symlink(os.path.abspath(os.path.join(src, f)), os.path.join(dst, f))
    return dst
