"""Build paddle-vha's onnxruntime custom-op library (ops/ort: the fused decode attention, docs/deploy.md).

    python ops/ort/build.py            # build (or reuse) it; prints the library's path
    python ops/ort/build.py --force    # rebuild

The library is compiled with g++ against onnxruntime's C / C++ API headers, which the onnxruntime wheel does not
ship: they are taken from Debian's libonnxruntime-dev package (version HEADERS_VERSION, its SHA-256 pinned below),
downloaded once into the cache folder and unpacked there (nothing third-party enters the source tree). The C API is
versioned and append-only, so a library built against API 21 loads in onnxruntime 1.21 and every later release (the
project pins 1.32). No link against libonnxruntime: every call goes through the OrtApi table onnxruntime hands the
library when it registers.

Environment:
    VHA_ORT_OPS_DIR     build folder (default: $XDG_CACHE_HOME/paddle_vha/ort-ops/<sources digest>)
    VHA_ORT_HEADERS     a folder holding onnxruntime_cxx_api.h (skips the download)
    CXX                 the compiler (default g++)
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = ["decode_attention.cc"]
HEADERS_VERSION = "1.21.0+dfsg-1"
HEADERS_URL = ("https://deb.debian.org/debian/pool/main/o/onnxruntime/"
               "libonnxruntime-dev_1.21.0+dfsg-1_amd64.deb")
HEADERS_SHA256 = "14f7d959d5deacbcf1504830d4189f91fc67382b399ed9ae9d3aa9c4050ced08"
LIBRARY = "libpaddle_vha_ort_ops.so"
FLAGS = ["-O3", "-std=c++17", "-fPIC", "-shared", "-march=x86-64", "-fopenmp-simd", "-fno-math-errno",
         "-fvisibility=hidden", "-Wall", "-Wno-unknown-pragmas"]


def _cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "paddle_vha"


def sources_digest(defines=()) -> str:
    h = hashlib.sha256()
    for p in sorted(HERE.iterdir()):
        if p.suffix in (".cc", ".inc", ".h", ".py"):
            h.update(p.name.encode() + b"\0" + p.read_bytes())
    h.update(" ".join(FLAGS + list(defines) + [HEADERS_SHA256]).encode())
    return h.hexdigest()


def headers() -> Path:
    """The folder holding onnxruntime_cxx_api.h: VHA_ORT_HEADERS, or Debian's package unpacked in the cache."""
    if os.environ.get("VHA_ORT_HEADERS"):
        return Path(os.environ["VHA_ORT_HEADERS"])
    dest = _cache() / "ort-headers" / HEADERS_VERSION
    inc = dest / "usr" / "include" / "onnxruntime"
    if (inc / "onnxruntime_cxx_api.h").is_file():
        return inc
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".fetch-"))
    try:
        deb = tmp / "headers.deb"
        with urllib.request.urlopen(HEADERS_URL, timeout=120) as r, open(deb, "wb") as f:
            shutil.copyfileobj(r, f)
        digest = hashlib.sha256(deb.read_bytes()).hexdigest()
        if digest != HEADERS_SHA256:
            raise RuntimeError(f"{HEADERS_URL}: SHA-256 {digest}, expected {HEADERS_SHA256}")
        subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp / "x")], check=True) if shutil.which("dpkg-deb") else \
            _unpack_deb(deb, tmp / "x")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp / "x", dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return inc


def _unpack_deb(deb: Path, out: Path) -> None:
    """A .deb is an ar archive holding data.tar.*: unpacked without dpkg (non-Debian hosts)."""
    import tarfile

    data = deb.read_bytes()
    assert data[:8] == b"!<arch>\n", f"{deb}: not an ar archive"
    pos = 8
    while pos < len(data):
        name = data[pos:pos + 16].decode().strip().rstrip("/")
        size = int(data[pos + 48:pos + 58].decode().strip())
        body = data[pos + 60:pos + 60 + size]
        if name.startswith("data.tar"):
            import io

            out.mkdir(parents=True, exist_ok=True)
            with tarfile.open(fileobj=io.BytesIO(body)) as t:
                t.extractall(out, filter="data")
            return
        pos += 60 + size + (size % 2)
    raise RuntimeError(f"{deb}: no data.tar member")


def build(force: bool = False, defines=(), out_dir: Path = None) -> Path:
    """The library's path, compiled now unless the same sources and defines were compiled before."""
    out = Path(out_dir or os.environ.get("VHA_ORT_OPS_DIR") or _cache() / "ort-ops" / sources_digest(defines)[:16])
    lib = out / LIBRARY
    if lib.is_file() and not force:
        return lib
    inc = headers()
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (LIBRARY + ".tmp")
    cmd = [os.environ.get("CXX", "g++"), *FLAGS, *[f"-D{d}" for d in defines], f"-I{inc}", f"-I{HERE}",
           *[str(HERE / s) for s in SOURCES], "-o", str(tmp)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"building {LIBRARY} failed:\n{' '.join(cmd)}\n{r.stderr[-4000:]}")
    os.replace(tmp, lib)
    return lib


if __name__ == "__main__":
    print(build(force="--force" in sys.argv[1:]))
