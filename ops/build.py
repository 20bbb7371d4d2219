"""Build the fused VHA prologue custom operator (ops/csrc) with paddle.utils.cpp_extension.

    python ops/build.py            # build (or reuse) the op for this Paddle; prints where it is
    python ops/build.py --force    # rebuild from scratch

`tools/env.sh` runs this whenever a file under ops/csrc or this script changes (its own stamp), and
`paddle_vha.kernels.op_loader` calls `build()` on first use. An installed wheel carries this folder as package data
(paddle_vha/_ops) and builds the op the same way on first use, or with `paddle-vha-build-ops`. The CUDA kernels are compiled in only when Paddle itself
is compiled with CUDA (`paddle.is_compiled_with_cuda()`); a CPU wheel gets the CPU kernels.

Environment:
    VHA_OPS_BUILD_DIR     build folder (default: $XDG_CACHE_HOME/paddle_vha/ops-build/paddle-<version>-<sources
                          digest>-<checkout and interpreter hash>, i.e. under ~/.cache: nothing is written into the source tree or the package)
    VHA_OPS_MARCH         -march for the CPU translation unit (default on x86-64: x86-64, the portable baseline;
                          the AVX2 and AVX-512 kernels are compiled in regardless and picked at run time by CPUID,
                          so a build folder or wheel runs on any x86-64 CPU. `native` makes the build fit only
                          CPUs like this one)
    VHA_OPS_CFLAGS        extra C++ flags for the CPU kernels (e.g. -DVHA_TILE_AVX2=4,3 to try another register tile)
    CUDA_HOME             CUDA toolkit root (the folder with bin/nvcc and lib64/libcudart*); see docs/prologue.md
"""
from __future__ import annotations

import hashlib
import os
import shutil
import sys
import threading
from pathlib import Path

OPS_DIR = Path(__file__).resolve().parent
CSRC = OPS_DIR / "csrc"
MODULE_NAME = "vha_prologue_ops"
# The translation units, relative to csrc/: the one registration of the operator, its CPU entries, and (a CUDA build of
# Paddle only) its CUDA entries. Every other file under csrc/ is a header one of them includes.
CPU_SOURCES = ["register_op.cc", "cpu/op_cpu.cc"]
CUDA_SOURCES = ["cuda/op_cuda.cu"]


def build_dir() -> Path:
    """Where the op is compiled: $VHA_OPS_BUILD_DIR, else a per-user cache folder keyed by Paddle's version and the
    sources' digest (never the source tree or an installed package: checkouts, worktrees and wheels of different
    sources each get their own build, and none writes beside its sources)."""
    if os.environ.get("VHA_OPS_BUILD_DIR"):
        return Path(os.environ["VHA_OPS_BUILD_DIR"])
    try:
        from importlib.metadata import version

        paddle_version = version("paddlepaddle")
    except Exception:  # noqa: BLE001 - a source build of Paddle without metadata
        paddle_version = "unknown"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    # The build's recipe names this checkout's csrc/ and this interpreter's Paddle: two checkouts (or virtual
    # environments) of the same sources sharing one folder would each find the other's stamp and rebuild in turn.
    where = hashlib.sha256(f"{CSRC.resolve()}\0{sys.prefix}".encode()).hexdigest()[:8]
    return cache / "paddle_vha" / "ops-build" / f"paddle-{paddle_version}-{sources_digest()[:16]}-{where}"


def source_files(with_cuda: bool) -> list[Path]:
    names = CPU_SOURCES + (CUDA_SOURCES if with_cuda else [])
    return [CSRC / n for n in names]


def sources_digest() -> str:
    """Hash of every file the build reads (all of ops/csrc, subfolders too, and this script), for the set-up stamp."""
    h = hashlib.sha256()
    for p in sorted(p for p in CSRC.rglob("*") if p.is_file()) + [Path(__file__).resolve()]:
        h.update(p.relative_to(OPS_DIR).as_posix().encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def _cuda_home() -> str | None:
    """The toolkit folder nvcc really lives in (a `which nvcc` wrapper script is not one; see the facts notes)."""
    if os.environ.get("CUDA_HOME"):
        return os.environ["CUDA_HOME"]
    nvcc = shutil.which("nvcc")
    if not nvcc:
        return None
    real = Path(nvcc).resolve()
    try:  # a small shell wrapper that execs the real nvcc
        text = real.read_text(errors="ignore") if real.stat().st_size < 4096 else ""
    except OSError:
        text = ""
    for tok in text.split():
        if tok.endswith("/bin/nvcc"):
            real = Path(tok)
            break
    return str(real.parent.parent)


def default_march() -> str:
    """The baseline the translation unit is compiled for: x86-64 on x86-64 (the faster kernels are dispatched at run
    time, csrc/cpu/op_cpu.cc), the compiler's default elsewhere."""
    import platform

    return "x86-64" if platform.machine().lower() in ("x86_64", "amd64") else ""


def _build_key(cflags, cuda_flags, sources) -> str:
    """What a finished build was made from: flags (with the sources' digest), source list, Paddle's version."""
    import json

    import paddle

    recipe = [cflags, cuda_flags, sources, paddle.__version__, getattr(paddle.version, "commit", "")]
    return hashlib.sha256(json.dumps(recipe).encode()).hexdigest()


def build(verbose: bool = False, force: bool = False):
    """Compile (or reuse) the op and return the loaded module (its `vha_prologue` function)."""
    import paddle
    from paddle.utils.cpp_extension import load

    with_cuda = paddle.is_compiled_with_cuda()
    bdir = build_dir()
    if force and bdir.exists():
        shutil.rmtree(bdir)
    bdir.mkdir(parents=True, exist_ok=True)
    march = os.environ.get("VHA_OPS_MARCH", default_march())
    cflags = ["-O3", "-fopenmp-simd", "-std=c++17", f"-I{CSRC}"] + ([f"-march={march}"] if march else [])
    cflags += os.environ.get("VHA_OPS_CFLAGS", "").split()
    # Paddle's loader rebuilds when the flags change but only looks at the listed sources' times: the digest of every
    # file under csrc/ (headers, the per-ISA kernel include, subfolders) in the flags makes any edit rebuild the op.
    cflags.append(f"-DVHA_SOURCES_DIGEST={sources_digest()[:16]}")
    cuda_flags = []
    if with_cuda:
        home = _cuda_home()
        if home:
            os.environ.setdefault("CUDA_HOME", home)
        cflags.append("-DVHA_WITH_CUDA")
        cuda_flags = ["-O3", "-std=c++17", f"-I{CSRC}", "-DVHA_WITH_CUDA", "-DPADDLE_NO_PYTHON",
                      "--expt-relaxed-constexpr", "-gencode", "arch=compute_80,code=sm_80",
                      "-gencode", "arch=compute_90,code=sm_90",
                      # and PTX, so a newer GPU than sm_90 JIT-compiles the kernels instead of failing every call
                      "-gencode", "arch=compute_90,code=compute_90"]
    import fcntl

    # One builder at a time: several processes (test workers, tools) may load the op at once, and Paddle's
    # loader rebuilds in place when a source changed.
    with open(bdir / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            sources = [str(p) for p in source_files(with_cuda)]
            key = _build_key(cflags, cuda_flags, sources)
            stamp, built = bdir / ".paddle_vha_build_key", bdir / MODULE_NAME / f"{MODULE_NAME}.so"
            if built.is_file() and stamp.is_file() and stamp.read_text() == key:
                # Built by this very recipe (the key covers the flags, which carry the sources' digest, and Paddle's
                # version): load it directly. Paddle's load() would spend ~2 s re-checking in a subprocess.
                from paddle.utils.cpp_extension.extension_utils import _import_module_from_library

                mod = _import_module_from_library(MODULE_NAME, str(built.parent), verbose)
            else:
                mod = load(name=MODULE_NAME, sources=sources, extra_cxx_cflags=cflags,
                           extra_cuda_cflags=cuda_flags or None, extra_include_paths=[str(CSRC)],
                           build_directory=str(bdir), verbose=verbose)
                stamp.write_text(key)
            # Paddle's loader writes the op's Python wrapper as <name>_<thread id>.py and removes it only at a clean
            # interpreter exit: killed processes leave one each. The module is imported by now; drop the file.
            wrapper = Path(getattr(mod, "__file__", "") or "")
            if wrapper.name == f"{MODULE_NAME}_{threading.current_thread().ident}.py":
                wrapper.unlink(missing_ok=True)
            return mod
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def build_parser():
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--force", action="store_true", help="rebuild from scratch (not with --digest)")
    ap.add_argument("--verbose", action="store_true", help="the compiler's output (not with --digest)")
    ap.add_argument("--digest", action="store_true", help="print the sources digest and exit")
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.digest and (args.force or args.verbose):
        ap.error("--force / --verbose have no effect with --digest (it prints the digest and exits)")
    if args.digest:
        print(sources_digest())
        return 0
    mod = build(verbose=args.verbose, force=args.force)
    print(f"[ops] vha_prologue built in {build_dir()} ({getattr(mod, '__file__', mod)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
