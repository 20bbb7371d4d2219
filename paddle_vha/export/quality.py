"""What a quantized export costs in quality: its logits against the float32 export's on held-out text.

The text is the held-out split of the embedded standard-library corpus, as the checkpoint's own token ids
(paddle_vha/transform/text.py: its tokenizer.json, or bytes for a byte-level model). Both graphs run the same
windows the way serving runs them: a prefill of the first half, then one cached decode step per remaining token
(teacher-forced on the text), so the MatMulNBits kernels of both shapes (prefill's many rows, a step's one) and the
cache path are measured. Per format the export requires (BOUNDS):

    mean KL(softmax(fp32) || softmax(quantized)) over all positions, in nats   <= max_kl
    greedy-token agreement on the decisive positions (where the float32 export's top token leads its runner-up by
    at least DECISIVE = 0.5 nats of log-probability), the share where both argmaxes agree   >= min_agreement
    (near-ties flip under any rounding: random-weight models are mostly near-ties, so all positions' agreement is
    printed too, but not bounded)

and fails (ExportError, nothing written) otherwise: a broken quantization (a wrong scale, a dropped norm) moves the
distribution by far more than rounding does (tests/test_export_quant.py corrupts one scale and checks it fails).
"""
from __future__ import annotations

import gc
import os
from dataclasses import asdict, dataclass
from typing import Dict, Optional

import numpy as np

from ..evaluate import compare_logits
from .errors import ExportError

__all__ = ["BOUNDS", "Quality", "held_out_windows", "teacher_forced_logits", "measure_quality", "check_quality",
           "gate_bounds", "bounds_note", "QUALITY_TOKENS", "quality_tokens", "gate_text", "DEFAULT_TEXT",
           "compare_distributions"]

# (max mean KL in nats, min greedy agreement on decisive positions), per format. Measured (docs/deploy.md): int8
# 1e-5..1e-3 nats, int4 up to 0.12 on the sharpened toy models of tests/test_export_quant.py (round-to-nearest int4
# of a small model costs that much; llama.cpp's Q4_0 is in the same range); q/k norms dropped or one scale off 4x
# gives far more
BOUNDS: Dict[str, tuple] = {"int8": (0.01, 0.95), "int4": (0.25, 0.80)}
DECISIVE = 0.5  # nats between the float32 export's top two tokens for a position's greedy choice to count
QUALITY_TOKENS = 48  # tokens per held-out window (a prefill of half, then cached steps), within the model's positions


def quality_tokens(context: int) -> int:
    """Tokens per quality window for a model serving `context` positions: QUALITY_TOKENS, or all its positions when
    it has fewer (positions past them are outside the model, and onnxruntime's fused rotary table stops there).
    ExportError (one line) for a context that leaves no cached step to measure (< 2 positions)."""
    if context < 2:
        raise ExportError(f"the model serves {context} position(s); the quantized export's quality check needs 2 "
                          "(a prefill and one cached step)")
    return min(QUALITY_TOKENS, int(context))


def gate_bounds(weights: str, max_kl: Optional[float] = None, min_agreement: Optional[float] = None,
                defaults: Optional[Dict[str, tuple]] = None) -> tuple:
    """(max mean KL, min agreement) of a quality gate: the format's bounds (`defaults`, BOUNDS unless given: the KV
    cache's gate has its own), each replaced where the user named one (tools/export_onnx.py --max-kl /
    --min-agreement)."""
    kl, agree = (defaults or BOUNDS)[weights]
    return (kl if max_kl is None else float(max_kl), agree if min_agreement is None else float(min_agreement))


def bounds_note(weights: str, bounds: Optional[tuple], defaults: Optional[Dict[str, tuple]] = None,
                gate: str = "gate") -> Optional[str]:
    """Words for bounds the user set (None when they are the format's): printed with the quality and kept in
    export_info.json."""
    defaults = defaults or BOUNDS
    if bounds is None or tuple(bounds) == defaults[weights]:
        return None
    kl, agree = defaults[weights]
    said = [f"--max-kl {bounds[0]:g}"] if bounds[0] != kl else []
    said += [f"--min-agreement {bounds[1]:g}"] if bounds[1] != agree else []
    return (f"accepted knowingly: {' and '.join(said)} replace the {weights} {gate}'s bounds (mean KL <= {kl:g} nats, "
            f"agreement >= {100 * agree:g}%)")


@dataclass
class Quality:
    mean_kl: float
    max_kl: float
    agreement: float  # on the decisive positions (1.0 when there are none)
    decisive: int  # how many positions are decisive
    agreement_all: float  # on all positions
    positions: int
    max_abs: float
    text: str

    def line(self, weights: str, bounds: Optional[tuple] = None) -> str:
        bound_kl, bound_agree = bounds or BOUNDS[weights]
        note = bounds_note(weights, bounds)
        return (f"quality: {weights} vs the float32 export on {self.text}: mean KL {self.mean_kl:.2e} nats (max "
                f"{self.max_kl:.2e}; bound {bound_kl:g}), greedy-token agreement {100 * self.agreement:.1f}% of the "
                f"{self.decisive} decisive positions (bound {100 * bound_agree:g}%; {100 * self.agreement_all:.1f}% of "
                f"all {self.positions}), max abs logit diff {self.max_abs:.3f}" + (f"; {note}" if note else ""))

    def as_dict(self) -> dict:
        return asdict(self)


DEFAULT_TEXT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "calibration.txt")
DEFAULT_TEXT_WORDS = ("the embedded calibration text (English prose: 12 chapters of Jane Austen's novels, public "
                      "domain; Python code: 6 standard-library modules, PSF licence; paddle_vha/export/data/README.md)")


def gate_text(folder: str, vocab: int, calibration_text: Optional[str] = None, min_tokens: int = QUALITY_TOKENS + 2):
    """The text (TextTokens: a calibration part, a held-out part) the quantized export calibrates on and its gate
    reads: `calibration_text` (--calibration-text FILE), else the embedded prose + code file (DEFAULT_TEXT) for a
    model with a tokenizer, and the embedded standard-library corpus for a byte-level toy model (what those were
    trained and their gate bounds measured on). ExportError (one line) for a file that is empty, binary, unreadable
    or too short."""
    from ..transform.text import load_text, BYTE_LEVEL_MAX, TOKENIZER_FILE

    if calibration_text is None:
        if not os.path.isfile(os.path.join(folder, TOKENIZER_FILE)) and vocab < BYTE_LEVEL_MAX:
            return load_text(folder, vocab, None, ExportError, min_tokens=min_tokens)
        return load_text(folder, vocab, DEFAULT_TEXT, ExportError, min_tokens=min_tokens, flag="the embedded text",
                         source=DEFAULT_TEXT_WORDS)
    return load_text(folder, vocab, calibration_text, ExportError, min_tokens=min_tokens, flag="--calibration-text")


def held_out_windows(folder: str, vocab: int, batch: int = 2, seq_len: int = QUALITY_TOKENS, text=None):
    """(ids (batch, seq_len) int64, what they are in words): fixed windows of the held-out text (`text`, a
    TextTokens, or the embedded standard-library corpus)."""
    from ..transform.text import load_text

    text = text or load_text(folder, vocab, None, ExportError, min_tokens=seq_len + 2)
    ids, _ = text.windows("val", 1, seq_len, batch_size=batch)[0]
    return ids, text.describe(int(ids.size), "val")


def teacher_forced_logits(session, ids: np.ndarray) -> np.ndarray:
    """(B, S, V) logits of `session` over `ids`: a prefill of the first half, then one cached step per token."""
    half = ids.shape[1] // 2
    logits, cache = session.prefill(ids[:, :half])
    out = [logits]
    for t in range(half, ids.shape[1]):
        step, cache = session.step(ids[:, t:t + 1], cache)
        out.append(step)
    return np.concatenate(out, axis=1)


def compare_distributions(reference: np.ndarray, got: np.ndarray, ids: Optional[np.ndarray] = None) -> dict:
    """Per position (B, S): kl = KL(softmax(reference) || softmax(got)) in nats, same = the argmaxes agree, decisive
    = the reference's top token leads its runner-up by >= DECISIVE nats; with `ids` (B, S), nll = -log p_got of each
    next token (B, S - 1). In float64."""
    from ..evaluate import log_softmax

    la, lb = log_softmax(reference.astype(np.float64)), log_softmax(got.astype(np.float64))
    out = dict(kl=(np.exp(la) * (la - lb)).sum(-1), same=reference.argmax(-1) == got.argmax(-1))
    top2 = np.partition(la, -2, axis=-1)[..., -2:]  # (B, S, 2): runner-up, top log-probability
    out["decisive"] = (top2[..., 1] - top2[..., 0]) >= DECISIVE
    if ids is not None:
        out["nll"] = -np.take_along_axis(lb[:, :-1], ids[:, 1:, None], -1)[..., 0]
    return out


def measure_quality(reference: np.ndarray, session, ids: np.ndarray, text: str) -> Quality:
    """The quantized `session`'s logits over `ids` against the float32 export's `reference` logits."""
    got = teacher_forced_logits(session, ids)
    cmp = compare_logits(reference, got)
    if cmp["nonfinite"]:
        raise ExportError(f"quality check failed: the {cmp['nonfinite']} logits are not finite (NaN or Inf)")
    d = compare_distributions(reference, got)
    del got
    gc.collect()
    kl, same, decisive = d["kl"], d["same"], d["decisive"]
    agree = float(same[decisive].mean()) if decisive.any() else 1.0
    return Quality(mean_kl=float(kl.mean()), max_kl=float(kl.max()), agreement=agree, decisive=int(decisive.sum()),
                   agreement_all=float(same.mean()), positions=int(kl.size), max_abs=cmp["max_abs"], text=text)


def check_quality(quality: Quality, weights: str, bounds: Optional[tuple] = None) -> None:
    """ExportError (one line) when `quality` is outside the format's bounds."""
    max_kl, min_agree = bounds or BOUNDS[weights]
    if not quality.mean_kl <= max_kl:
        raise ExportError(f"quality check failed: {weights} mean KL {quality.mean_kl:.3e} nats vs the float32 export "
                          f"> the bound {max_kl:g} (a broken quantization, or a model that does not quantize well; "
                          "--max-kl accepts more knowingly)")
    if not quality.agreement >= min_agree:
        raise ExportError(f"quality check failed: {weights} greedy-token agreement {100 * quality.agreement:.1f}% < "
                          f"the bound {100 * min_agree:g}% (on the {quality.decisive} positions where the float32 "
                          "export's choice is decisive; --min-agreement accepts less knowingly)")
