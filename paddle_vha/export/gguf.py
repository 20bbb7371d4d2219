"""A checkpoint folder -> one GGUF file, by llama.cpp's own tools: its Hugging Face -> GGUF converter (the
convert_hf_to_gguf.py llama-cpp-python vendors) and its quantizer (llama_cpp.llama_model_quantize), run in the side
environment that has them (tools/llama_env.sh), plus a smoke check: llama.cpp's greedy tokens on the file next to the
checkpoint's own Paddle model's.

    plan = plan_gguf_export(folder, "out.gguf", "q4_k_m")     # one-line GGUFExportError for what cannot work
    side = find_side()                                        # the side environment (built once, ~20 min cold)
    check_tokenizer(side, plan, scratch)                      # the converter with --vocab-only: seconds
    write_gguf(side, plan, path, scratch)                     # converter (+ quantizer) into `path`

The folder must be a stock architecture llama.cpp's converter reads (a base's GGUFForm: llama, qwen2, qwen3); a
variant (Qwen3-VHA, MEA, ...) is folded or served otherwise, as its family says. Both tools run with their working
folder in a scratch folder, so nothing lands beside the input.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from typing import List, Optional

from ..checkpoint.contract import CheckpointError
from ..checkpoint.folder import CheckpointFolder
from ..checkpoint.fsutil import check_output_file

__all__ = ["GGUF_TYPES", "GGUFExportError", "GGUFExportPlan", "LlamaSide", "find_side", "plan_gguf_export",
           "check_tokenizer", "write_gguf", "llama_greedy", "paddle_greedy"]

# --type -> (the converter's --outtype, llama.cpp's quantizer type applied to the converter's F32 file or None)
GGUF_TYPES = {"f32": ("f32", None), "f16": ("f16", None), "bf16": ("bf16", None), "q8_0": ("q8_0", None),
              "q4_0": ("f32", "Q4_0"), "q4_k_m": ("f32", "Q4_K_M")}
CONVERTER = os.path.join("vendor", "llama.cpp", "convert_hf_to_gguf.py")
UNKNOWN_PRE = "BPE pre-tokenizer was not recognized"


class GGUFExportError(CheckpointError):
    """One line: why the GGUF export cannot run or failed."""


@dataclass(frozen=True)
class LlamaSide:
    """The side environment: its python (llama_cpp, torch, transformers) and llama-cpp-python's unpacked sdist."""

    python: str
    src: str

    @property
    def converter(self) -> str:
        return os.path.join(self.src, CONVERTER)


def _checkout_script() -> Optional[str]:
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools",
                        "llama_env.sh")
    return path if os.path.isfile(path) else None


def find_side(python: Optional[str] = None, src: Optional[str] = None, log=print) -> LlamaSide:
    """The side environment: --llama-python / --llama-src (or $LLAMA_PYTHON / $LLAMA_SRC), else the checkout's
    tools/llama_env.sh (which builds it the first time: ~20 min of compiling, then a stamp check of ~0.1 s)."""
    python, src = python or os.environ.get("LLAMA_PYTHON"), src or os.environ.get("LLAMA_SRC")
    if python or src:
        if not (python and src):
            raise GGUFExportError("give both --llama-python and --llama-src (or $LLAMA_PYTHON and $LLAMA_SRC)")
        flag = "--llama-python" if python != os.environ.get("LLAMA_PYTHON") else "$LLAMA_PYTHON"
        if not (os.path.isfile(python) and os.access(python, os.X_OK)):
            raise GGUFExportError(f"{flag} {python}: " + ("not an executable file" if os.path.exists(python) else
                                                          "no such file") + " (the side environment's python)")
        if not os.path.isdir(src):
            flag = "--llama-src" if src != os.environ.get("LLAMA_SRC") else "$LLAMA_SRC"
            raise GGUFExportError(f"{flag} {src}: not a directory (llama-cpp-python's unpacked sdist)")
        side = LlamaSide(python, src)
    else:
        script = _checkout_script()
        if script is None:
            raise GGUFExportError("llama.cpp's converter and quantizer live in a side environment: run this from a "
                                  "paddle-vha checkout (tools/llama_env.sh builds it), or pass --llama-python PY "
                                  "--llama-src DIR (llama-cpp-python's unpacked sdist)")
        log(f"side environment: bash {script} (builds llama.cpp the first time, ~20 min on 2 cores)")
        out = []
        for args in ([], ["src"]):
            r = subprocess.run(["bash", script, *args], capture_output=True, text=True)
            if r.returncode != 0:
                tail = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
                raise GGUFExportError(f"tools/llama_env.sh failed (exit {r.returncode}): {tail}")
            out.append(r.stdout.strip().splitlines()[-1])
        side = LlamaSide(*out)
    if not os.path.isfile(side.converter):
        raise GGUFExportError(f"{side.src}: no {CONVERTER} (not llama-cpp-python's unpacked sdist)")
    return side


@dataclass
class GGUFExportPlan:
    folder: CheckpointFolder
    out: str
    type: str
    label: str  # "Llama"
    force: bool = False

    @property
    def outtype(self) -> str:
        return GGUF_TYPES[self.type][0]

    @property
    def quantize(self) -> Optional[str]:
        return GGUF_TYPES[self.type][1]


def plan_gguf_export(folder: str, out: str, type: str, force: bool = False) -> GGUFExportPlan:
    """Check the folder (a stock architecture llama.cpp reads) and OUT (outside the input, new unless force)."""
    from ..families import FAMILIES, GGUF_FORMS, gguf_form_of

    if type not in GGUF_TYPES:
        raise GGUFExportError(f"--type {type!r}: expected one of {', '.join(GGUF_TYPES)}")
    ck = CheckpointFolder.open(folder)
    form = gguf_form_of(ck.model_type)
    if form is None:
        fam = FAMILIES.get(ck.model_type)
        runs = ", ".join(f.model_type for f in GGUF_FORMS.values())
        if fam is None:
            raise GGUFExportError(f"{folder}: model_type {ck.model_type!r} is not one llama.cpp's converter is run for "
                                  f"here ({runs})")
        then = "fold it first (python tools/fold.py IN OUT), then export the fold" if fam.fold_form else \
            "serve it with python tools/export_onnx.py"
        raise GGUFExportError(f"{folder}: {fam.label} is not an architecture llama.cpp runs ({runs}); {then}")
    ck.tensors  # the headers: a broken folder is refused here, before any tool runs
    check_output_file(out, [ck.path], force, GGUFExportError, input_label="FOLDED")
    if not out.endswith(".gguf"):
        raise GGUFExportError(f"{out}: the output file's name should end in .gguf")
    return GGUFExportPlan(ck, out, type, form.label, force)


def _tail(text: str, n: int = 1) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-n:]) if lines else "(no output)"


def _converter(side: LlamaSide, plan: GGUFExportPlan, out: str, scratch: str, extra=(), on_line=None):
    """Run the converter (working folder: scratch); CompletedProcess-like (returncode, stderr text)."""
    cmd = [side.python, side.converter, os.path.abspath(plan.folder.path), "--outfile", out, "--outtype",
           plan.outtype, *extra]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, cwd=scratch, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if on_line is not None:
            on_line(line)
    proc.wait()
    return proc.returncode, "".join(lines)


def check_tokenizer(side: LlamaSide, plan: GGUFExportPlan, scratch: str) -> str:
    """Run the converter with --vocab-only (no tensors: seconds) and return the tokenizer model / pre-tokenizer it
    wrote; a tokenizer it refuses becomes one line saying what to do."""
    path = os.path.join(scratch, "vocab.gguf")
    code, log = _converter(side, plan, path, scratch, ("--vocab-only",))
    if code != 0:
        if UNKNOWN_PRE in log:
            raise GGUFExportError(
                f"{plan.folder.path}: llama.cpp's converter does not recognise this tokenizer ({UNKNOWN_PRE}: it names "
                "a BPE tokenizer's pre-tokenizer by hashing the ids it gives a fixed text); give the checkpoint the "
                "tokenizer of the model it was trained or converted from (a published one, e.g. Qwen's, Llama 3's, "
                "SmolLM's), or add that hash to get_vocab_base_pre in " + side.converter)
        raise GGUFExportError(f"{plan.folder.path}: llama.cpp's converter refused the tokenizer (exit {code}): "
                              f"{_tail(log)}")
    from ..checkpoint.gguf import GGUFFile

    vocab = GGUFFile(path)
    return f"{vocab.meta('tokenizer.ggml.model')} / {vocab.meta('tokenizer.ggml.pre', 'none')}"


QUANTIZE = """
import sys, llama_cpp
src, dst, kind = sys.argv[1:4]
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + kind)
sys.exit(llama_cpp.llama_model_quantize(src.encode(), dst.encode(), params))
"""


def write_gguf(side: LlamaSide, plan: GGUFExportPlan, path: str, scratch: str, progress: bool = True) -> None:
    """The converter into `path` (through the scratch folder's F32 file and llama.cpp's quantizer for q4_0 /
    q4_k_m); GGUFExportError (one line, the tool's last line) if either fails."""
    from tqdm import tqdm

    path = os.path.abspath(path)  # both tools run in the scratch folder: a relative path would land there
    total = len(plan.folder.tensors)
    bar = tqdm(total=total, unit="tensor", desc=f"convert ({plan.outtype})", disable=not progress, leave=False)

    def on_line(line):
        if re.match(r"INFO:hf-to-gguf:(blk\.\d+\.|token_embd|output)", line) and "->" in line:
            bar.update(1)

    first = os.path.join(scratch, "f32.gguf") if plan.quantize else path
    try:
        code, log = _converter(side, plan, first, scratch, on_line=on_line)
    finally:
        bar.close()
    if code != 0:
        raise GGUFExportError(f"{plan.folder.path}: llama.cpp's converter failed (exit {code}): {_tail(log)}")
    if plan.quantize:
        r = subprocess.run([side.python, "-c", QUANTIZE, first, path, plan.quantize], cwd=scratch,
                           capture_output=True, text=True)
        os.remove(first)
        if r.returncode != 0:
            raise GGUFExportError(f"llama.cpp's quantizer ({plan.quantize}) failed (exit {r.returncode}): "
                                  f"{_tail(r.stderr + r.stdout)}")


GREEDY = """
import json, sys
import numpy as np
from llama_cpp import Llama
path, text, ids, new = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
llm = Llama(model_path=path, n_ctx=len(ids) + new + 8, n_threads=2, logits_all=True, verbose=False, seed=0)
mine = llm.tokenize(text.encode(), add_bos=False, special=True)
llm.eval(ids)
out = []
for _ in range(new):
    out.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
    llm.eval([out[-1]])
print(json.dumps(dict(tokenized=[int(i) for i in mine], greedy=out)))
"""


def llama_greedy(side: LlamaSide, path: str, text: str, ids: List[int], new: int, scratch: str,
                 name: Optional[str] = None) -> dict:
    """llama.cpp on the GGUF: its own ids for `text`, and `new` greedy tokens after `ids`. `name`: what the refusal
    calls the file (the destination, when `path` is still the temporary one)."""
    r = subprocess.run([side.python, "-c", GREEDY, path, text, json.dumps(ids), str(new)], cwd=scratch,
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise GGUFExportError(f"{name or path}: llama.cpp could not run the file it was about to become (exit "
                              f"{r.returncode}): {_tail(r.stderr + r.stdout)}; nothing written")
    return json.loads(r.stdout.strip().splitlines()[-1])


def paddle_greedy(folder: str, ids: List[int], new: int) -> List[int]:
    """`new` greedy tokens of the folder's own Paddle model (its family's class, loaded through a linked view so
    nothing is written beside the input), full forward passes in float32."""
    import numpy as np
    import paddle

    from ..checkpoint.fsutil import linked_view, scratch_dir
    from ..families import family_of

    cls = family_of(folder).model_class
    seq = list(ids)
    with scratch_dir("vha-gguf-") as tmp:
        model = cls.from_pretrained(linked_view(folder, os.path.join(tmp, "m")), dtype="float32")
        model.eval()
        with paddle.no_grad():
            for _ in range(new):
                out = model(paddle.to_tensor(np.asarray([seq], np.int64)))
                logits = out[0] if isinstance(out, (tuple, list)) else out.logits
                seq.append(int(logits[0, -1].argmax()))
    return seq[len(ids):]
