"""Where the fused operator is built: a per-user cache folder, never the source tree, and nothing left per process."""
import os
import shutil
import subprocess
import sys

from paddle_vha.kernels.op_loader import build_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOAD = ("import os, signal; from paddle_vha.kernels.op_loader import load_op; m = load_op(); "
        "print(m is not None); os.kill(os.getpid(), signal.SIGKILL)")  # killed: no atexit clean-up runs


def _tree(path):
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs)


def test_loading_writes_nothing_into_the_checkout_and_leaves_no_wrapper(tmp_path):
    before = _tree(os.path.join(ROOT, "ops"))
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    env.pop("VHA_OPS_BUILD_DIR", None)
    mine = build_script().build_dir()  # this process's build (tools/env.sh made it): a warm cache, no compile
    if os.path.isdir(mine) and "VHA_OPS_BUILD_DIR" not in os.environ:
        shutil.copytree(mine, tmp_path / "cache" / os.path.relpath(mine, os.path.join(os.path.expanduser("~"),
                                                                                         ".cache")))
    for _ in range(2):  # both are killed after loading
        r = subprocess.run([sys.executable, "-c", LOAD], capture_output=True, text=True, env=env, cwd=str(tmp_path),
                           timeout=900)
        assert r.stdout.strip() == "True", (r.returncode, r.stderr[-2000:])
    built = _tree(tmp_path / "cache")
    print("\n".join(os.path.relpath(p, tmp_path) for p in built if p.endswith((".so", ".py"))))
    assert any(p.endswith("vha_prologue_ops.so") for p in built), "the op is built under XDG_CACHE_HOME"
    wrappers = [p for p in built if os.path.basename(p).startswith("vha_prologue_ops_") and p.endswith(".py")
                and not p.endswith("_setup.py")]
    assert wrappers == [], f"per-process wrapper files left by killed processes: {wrappers}"
    assert _tree(os.path.join(ROOT, "ops")) == before, "loading the op wrote into the checkout's ops/"
