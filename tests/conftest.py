import os
import subprocess
import sys

# One MKL / OpenMP thread in every process of the suite (both xdist workers, the tools and side-env scripts they run,
# the ranks of tests/tp/launch.py): the two workers already keep the 2 cores busy, and a second BLAS thread per
# process only spins (measured in the commit that set this). Set either variable to override.
for _var in ("MKL_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import shutil  # noqa: E402

import numpy as np  # noqa: E402
import paddle  # noqa: E402
import pytest  # noqa: E402
from _pytest.tmpdir import TempPathFactory  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.append(os.path.join(ROOT, "tools"))  # tools/prologue_check: the float64 oracle, shared with tools/gpu_check.py


@pytest.fixture(autouse=True)
def _fp32_and_seeded():
    paddle.set_default_dtype("float32")
    paddle.seed(1234)
    np.random.seed(1234)
    yield
    paddle.set_default_dtype("float32")


@pytest.fixture(autouse=True)
def _cwd_restored():
    """A test that changes the working folder must undo it (monkeypatch.chdir does): its tmp_path is removed when it
    passes, and a worker left in a removed folder fails every later test of its share at os.getcwd()."""
    cwd = os.getcwd()
    yield
    try:
        left = os.getcwd()
    except FileNotFoundError:
        left = None
    if left != cwd:
        os.chdir(cwd)
        pytest.fail(f"the test left the working folder at {left or 'a removed folder'} (use monkeypatch.chdir)")


@pytest.fixture(scope="session")
def hf_python():
    """The side environment's python (tools/hf_env.sh: transformers + PyTorch, Optimum, onnxruntime-genai), created
    once (~1 min the first time); the test is skipped with the reason if it cannot be created."""
    res = subprocess.run(["bash", os.path.join(ROOT, "tools", "hf_env.sh")], capture_output=True, text=True, timeout=900)
    if res.returncode != 0:
        tail = (res.stderr.strip().splitlines() or ["(no output)"])[-1]
        pytest.skip(f"cannot create .venv-hf (tools/hf_env.sh exit {res.returncode}: {tail})")
    return res.stdout.strip().splitlines()[-1]


# Rough seconds of one test here by its marker (others ~1 s), for the tests tests/durations.txt does not list.
_COST_S = {"multirank": 60, "slow": 30}


def _measured_seconds() -> dict:
    """tests/durations.txt: node id -> measured seconds (setup + call + teardown), from a `--durations` table."""
    out = {}
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "durations.txt")) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[0].endswith("s") and not line.startswith("#"):
                out[parts[2]] = out.get(parts[2], 0.0) + float(parts[0][:-1])
    return out


def _cost(item, measured: dict) -> float:
    if item.nodeid in measured:
        return measured[item.nodeid]
    return max([s for m, s in _COST_S.items() if item.get_closest_marker(m)] or [1])


def pytest_collection_modifyitems(session, config, items):
    """Files in decreasing estimated cost (each file's own order kept; a file's cost: the sum of its tests', measured
    in tests/durations.txt or estimated from their markers): the suite runs one file per worker (`--dist loadfile`,
    with pytest.ini's --no-loadscope-reorder, without which xdist reorders files by test count and undoes this), and
    handing out the longest files first keeps a long file from starting last while the other worker idles
    (longest-processing-time-first scheduling)."""
    measured, cost, first = _measured_seconds(), {}, {}
    for i, item in enumerate(items):
        cost[item.path] = cost.get(item.path, 0) + _cost(item, measured)
        first.setdefault(item.path, i)
    items.sort(key=lambda item: (-cost[item.path], first[item.path]))


# Disk: the suite writes ~40 GB of checkpoints, exports and GGUF files over a run (real-width models are 1.4-2.7 GB a
# test); kept to the end, they filled a CI runner's disk mid-run and every later test failed in set-up. A passing
# test's tmp_path goes when it ends (pytest.ini: tmp_path_retention_policy = failed), and the folders a module's
# fixtures make with tmp_path_factory.mktemp go when the module's last test is done, unless a test of the module
# failed (then they stay, to be read).
_module_dirs: list = []
_mktemp = TempPathFactory.mktemp


def _recorded_mktemp(self, basename, numbered=True):
    path = _mktemp(self, basename, numbered)
    _module_dirs.append(path)
    return path


TempPathFactory.mktemp = _recorded_mktemp
_failed_before_module = {}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _failed_before_module.setdefault(item.path, item.session.testsfailed)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield  # the module's fixtures are finalized inside, when nextitem is in another file
    if nextitem is None or nextitem.path != item.path:
        if item.session.testsfailed == _failed_before_module.pop(item.path):
            for path in _module_dirs:
                shutil.rmtree(path, ignore_errors=True)
        _module_dirs.clear()
