"""The multi-rank test harness for tools/train.py: one launch of Paddle's launcher on N CPU ranks (gloo), no retries.

    from tp.launch import launch_train, train_once
    out = launch_train(log_dir, CONFIG, "--output_dir", OUT, nproc=2)   # CompletedProcess-like (rc, text)

A launch that exceeds its timeout is killed with every rank under it (the launcher puts each rank in its own
session) and reported as a failure: a deadlocked save shows up as a timeout, never as a hang of the suite. Nothing is
retried: a failure is reported with the ranks' logs. The runs go through tools/train.py, whose groups are fleet's
(created by the Trainer); a harness that creates groups itself must follow each `new_group` with a barrier (4 gloo
ranks fail intermittently in Paddle's group setup otherwise; tests/tp/tp_worker.py does).
"""
from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "train.py")
SHIMMED = os.path.join(ROOT, "tests", "tp", "train_shimmed.py")  # tools/train.py with the harness's CPU shims


@dataclass
class Run:
    returncode: int
    output: str  # the launcher's output, then the tail of every rank's log


def _rank_logs(log_dir: str) -> str:
    return "".join(f"\n--- {os.path.basename(p)}\n" + open(p, errors="replace").read()[-3000:]
                   for p in sorted(glob.glob(os.path.join(str(log_dir), "workerlog.*"))))


def launch_train(log_dir, *args, nproc: int = 2, timeout: int = 300, shimmed: bool = False) -> Run:
    """tools/train.py *args under paddle.distributed.launch on nproc CPU ranks; `shimmed`: through
    tests/tp/train_shimmed.py (a barrier after each new_group, which 4 gloo ranks need here; the CPU device id that
    pipeline parallelism reads)."""
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc), "--log_dir",
           str(log_dir), SHIMMED if shimmed else TOOL, *[str(a) for a in args]]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        rc = -9
        out = f"TIMEOUT after {timeout}s (a deadlock?)\n" + out
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return Run(rc, out[-3000:] + _rank_logs(log_dir))


def train_once(*args, timeout: int = 300) -> Run:
    """tools/train.py *args in one process."""
    p = subprocess.run([sys.executable, TOOL, *[str(a) for a in args]], capture_output=True, text=True,
                       timeout=timeout, cwd=ROOT)
    return Run(p.returncode, p.stdout[-3000:] + p.stderr[-3000:])
