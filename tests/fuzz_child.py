"""The fuzz tests' child process (tests/test_fuzz_inputs.py runs it): seeded mutations of one valid input, each run
through the code that reads it, each outcome one JSON line on stdout. A child of its own so that a case that takes the
memory or the time of the machine is measured and stopped here (a per-case time limit, the peak RSS of each case from
/proc/self/status after resetting it), not in the test worker.

    python tests/fuzz_child.py gguf   SEED FIRST COUNT WORK VALID.gguf     # tools/import_gguf.py's main, per case
    python tests/fuzz_child.py folder SEED FIRST COUNT WORK VALID_FOLDER   # what export_gguf, generate and the
                                                                           # families read from a checkpoint folder

Outcomes: "refused" (exit 2, one line "error: ..." on stderr, nothing left in the case's folder but the input),
"ok" (exit 0 and the written checkpoint passes its family's contract), anything else "bad" with the reason.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import fuzz_inputs as fz  # noqa: E402

CASE_SECONDS = 30  # a case running longer is a hang


class Hang(BaseException):
    pass


def _alarm(signum, frame):
    raise Hang()


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS


def _peak_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _timed(fn):
    """(outcome dict) of fn() -> (status, detail), with seconds and peak RSS."""
    _reset_peak()
    t0 = time.perf_counter()
    signal.alarm(CASE_SECONDS)
    try:
        status, detail = fn()
    except Hang:
        status, detail = "bad", f"hang: still running after {CASE_SECONDS} s"
    except BaseException as e:  # noqa: BLE001 - the point: anything that escapes is a finding
        status, detail = "bad", f"escaped: {type(e).__name__}: {str(e)[:300]}"
    finally:
        signal.alarm(0)
    return {"status": status, "detail": detail, "seconds": round(time.perf_counter() - t0, 3),
            "peak_mb": round(_peak_mb(), 1)}


def _cli(main, argv):
    """(exit status, stdout, stderr) of a tool's main(argv)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


def gguf_case(valid: bytes, fields, rng, case_dir: str):
    from paddle_vha.cli.import_gguf import main
    from paddle_vha.families import family_of

    data, what = fz.mutate_gguf(valid, fields, rng)
    src, out = os.path.join(case_dir, "m.gguf"), os.path.join(case_dir, "out")
    with open(src, "wb") as f:
        f.write(data)

    def run():
        code, stdout, stderr = _cli(main, [src, out, "--no-progress"])
        lines = stderr.strip().splitlines()
        left = sorted(os.listdir(case_dir))
        if code == 2:
            if len(lines) != 1 or not lines[0].startswith("error: "):
                return "bad", f"exit 2 but stderr is not one error line: {stderr[-400:]!r}"
            if left != ["m.gguf"]:
                return "bad", f"refused but left {left}"
            return "refused", lines[0][:300]
        if code == 0:
            try:
                family_of(out).validate(out)
            except Exception as e:  # noqa: BLE001
                return "bad", f"exit 0 but the checkpoint fails its contract: {str(e)[:300]}"
            return "ok", stdout.strip().splitlines()[-1][:200] if stdout.strip() else ""
        return "bad", f"exit {code}: {stderr[-600:]!r}"

    return what, run


READ = ("config.json", "tokenizer.json", "generation_config.json", "model.safetensors.index.json")  # + safetensors


def folder_case(valid_dir: str, rng, case_dir: str):
    from paddle_vha.checkpoint.contract import CheckpointError
    from paddle_vha.cli import one_line
    from paddle_vha.export.gguf import plan_gguf_export
    from paddle_vha.families import family_of
    from paddle_vha.serve.session import ServeError
    from paddle_vha.serve.text import generation_defaults, load_codec

    folder = os.path.join(case_dir, "in")
    shutil.copytree(valid_dir, folder)
    files = sorted(f for f in os.listdir(folder) if f in READ or f.endswith(".safetensors"))
    name = files[int(rng.integers(len(files)))]
    path = os.path.join(folder, name)
    with open(path, "rb") as f:
        raw = f.read()
    if name.endswith(".safetensors"):
        new, what = fz.mutate_safetensors(raw, rng)
    else:
        text, what = fz.mutate_json(raw.decode(), rng)
        new = text.encode("utf-8", "surrogatepass")
    with open(path, "wb") as f:
        f.write(new)
    what = f"{name}: {what}"

    def run():
        said = []
        try:
            plan = plan_gguf_export(folder, os.path.join(case_dir, "x.gguf"), "f32")  # export_gguf's checks
            family_of(folder).validate(folder)  # what fold / export_onnx / generate check first
            vocab = plan.folder.config.get("vocab_size", 0)
            codec = load_codec(folder, vocab if isinstance(vocab, int) else 0)  # export_gguf's smoke check, generate
            if codec is not None:
                ids = codec.encode("The capital of France is")
                codec.decode(ids, True)
            generation_defaults(folder)  # generate's EOS / sampling defaults
        except (CheckpointError, ServeError) as e:
            said.append(one_line(str(e)))  # as the command line prints it (paddle_vha.cli.fail)
        if said and (len(said[0].splitlines()) != 1 or not said[0].strip()):
            return "bad", f"a refusal of {len(said[0].splitlines())} lines: {said[0][:400]!r}"
        left = sorted(os.listdir(case_dir))
        if left != ["in"]:
            return "bad", f"left {left}"
        return ("refused", said[0][:300]) if said else ("ok", "")

    return what, run


def main(argv) -> int:
    kind, seed, first, count, work, valid = argv[0], int(argv[1]), int(argv[2]), int(argv[3]), argv[4], argv[5]
    signal.signal(signal.SIGALRM, _alarm)
    if kind == "gguf":
        with open(valid, "rb") as f:
            data = f.read()
        fields = fz.gguf_fields(data)
    for case in range(first, first + count):
        rng = fz.rng_for(seed, case)
        case_dir = os.path.join(work, f"case{case}")
        os.makedirs(case_dir)
        what, run = gguf_case(data, fields, rng, case_dir) if kind == "gguf" else folder_case(valid, rng, case_dir)
        result = _timed(run)
        print(json.dumps({"case": case, "what": what, **result}), flush=True)
        shutil.rmtree(case_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
