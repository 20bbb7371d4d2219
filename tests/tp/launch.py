"""The multi-rank test harness: one launch of Paddle's launcher on N CPU ranks (gloo), or one process, no retries.

    from tp.launch import launch, launch_train, train_once, run_once, ok
    out = launch_train(log_dir, CONFIG, "--output_dir", OUT, nproc=2)   # Run(returncode, output)
    out = launch(WORKER, "--out", OUT, nproc=4, log_dir=LOG)             # any script under the launcher
    ok(out)                                                              # asserts rc 0, showing the ranks' logs

Every test that launches ranks goes through here (tests/test_tensor_parallel.py, test_pipeline_parallel.py,
test_parallel_checkpoints.py, test_train.py, test_distill.py, test_convert.py). A run that exceeds its timeout is
killed with every process under it (the launcher puts each rank in its own session, so the launcher's process group
alone does not reach them; psutil walks the tree) and reported as a failure: a deadlocked save shows up as a
timeout, never as a hang of the suite. The tree is also killed after a normal exit (the launcher can leave rank
processes behind). Nothing is retried here: a failure is reported with the tail of every rank's log. The runs of
tools/train.py create fleet's groups (the Trainer's); a harness that creates groups itself must follow each
`new_group` with a barrier (4 gloo ranks fail intermittently in Paddle's group setup otherwise; tests/tp/tp_worker.py
does), and 4-rank Trainer runs go through tests/tp/train_shimmed.py (`shimmed=True`: a store per process group).
"""
from __future__ import annotations

import glob
import os
import subprocess
import sys
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "train.py")
SHIMMED = os.path.join(ROOT, "tests", "tp", "train_shimmed.py")  # tools/train.py with the harness's CPU shims


@dataclass
class Run:
    returncode: int
    output: str  # the command's output (its tail), then the tail of every rank's log


def kill_tree(pid: int) -> None:
    """SIGKILL a process and every process under it, by pid."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = root.children(recursive=True) + [root]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)


def _rank_logs(log_dir) -> str:
    if log_dir is None:
        return ""
    return "".join(f"\n--- {os.path.basename(p)}\n" + open(p, errors="replace").read()[-3000:]
                   for p in sorted(glob.glob(os.path.join(str(log_dir), "workerlog.*"))))


# One BLAS / OpenMP thread per rank: N ranks x paddle_vha.cli.quiet()'s default (one MKL thread per core) next to the
# suite's other worker oversubscribe the 2 cores, and the tiny models' GEMMs spend the extra threads spinning
# (measured: 2 ranks of tests/tp/tp_worker.py, 3 cases, CPU user+sys 22.2 / 22.9 s -> 14.5 / 17.8 s). Set either in
# the environment to override.
RANK_THREADS = {"MKL_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def run_cmd(cmd, timeout: int = 300, log_dir=None, extra_env=None) -> Run:
    """cmd in its own session from the checkout's root (the checkout on PYTHONPATH, extra_env's variables where the
    environment does not set them); killed with its tree after `timeout` seconds (returncode -9, the output starting
    with TIMEOUT). The output: the tails of stdout and stderr."""
    env = {**(extra_env or {}), **os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([str(c) for c in cmd], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    head = ""
    try:
        out, err = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        out, err = proc.communicate()
        rc, head = -9, f"TIMEOUT after {timeout}s (a deadlock?)\n"
    finally:
        kill_tree(proc.pid)
    return Run(rc, head + out[-3000:] + err[-3000:] + _rank_logs(log_dir))


def launch(script, *args, nproc: int = 2, log_dir, timeout: int = 300) -> Run:
    """`script *args` under paddle.distributed.launch on nproc CPU ranks, the ranks' logs in log_dir."""
    return run_cmd([sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc), "--log_dir",
                    log_dir, script, *args], timeout, log_dir, RANK_THREADS)


def launch_train(log_dir, *args, nproc: int = 2, timeout: int = 300, shimmed: bool = False) -> Run:
    """tools/train.py *args on nproc CPU ranks; `shimmed`: through tests/tp/train_shimmed.py (a rendezvous store per
    process group, which 4 gloo ranks need here; the CPU device id that pipeline parallelism reads)."""
    return launch(SHIMMED if shimmed else TOOL, *args, nproc=nproc, log_dir=log_dir, timeout=timeout)


def run_once(script, *args, timeout: int = 300) -> Run:
    """`script *args` in one process."""
    return run_cmd([sys.executable, script, *args], timeout)


def train_once(*args, timeout: int = 300) -> Run:
    """tools/train.py *args in one process."""
    return run_once(TOOL, *args, timeout=timeout)


def ok(run: Run) -> Run:
    """The run, asserted to have exited 0 (the message: its output and the ranks' logs)."""
    assert run.returncode == 0, f"exit {run.returncode}:\n{run.output}"
    return run
