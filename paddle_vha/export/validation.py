"""The export's self-validation: onnxruntime against the family's PaddleFormers model on the same weights.

The reference (PaddleFormers' causal LM, loaded tensor by tensor from the checkpoint) runs first: the logits of a
random prefill and of greedy decode steps, each step recomputed over the whole sequence (no cache), and the tokens
it chooses. It is then freed, and onnxruntime runs the exported graph on the same tokens with its KV cache (the
reference's tokens fed back, teacher-forced): its logits must agree and its argmax must choose the same token at
every step. The two models never sit in memory together, so the validation's peak is one model, not two.

The bound (export_onnx's `tolerance`, default 1e-4) is per unit of logit: max |onnxruntime - Paddle| must stay within
tolerance x max(1, max |Paddle logit|). Two float32 graphs of the same function differ by their rounding, which grows
with the logits' size and the depth: on SmolLM2-135M (30 layers, logits up to 33) converted to one KV head,
PaddleFormers' own float32 logits are 1.3e-3 from its float64 ones and onnxruntime's 9.4e-4 from Paddle's, so a fixed
1e-4 refused a correct export of a real model.
"""
from __future__ import annotations

import gc
from dataclasses import dataclass, field
from typing import List

import numpy as np

from .errors import ExportError
from .graph import check_graph
from .reference import reference_model

__all__ = ["Validation", "validate_onnx", "reference_run", "ReferenceRun"]


@dataclass
class Validation:
    prefill_max_abs: float = 0.0
    decode_max_abs: float = 0.0
    steps: int = 0
    tokens_match: bool = True
    ops: list = field(default_factory=list)
    logit_scale: float = 0.0  # max |Paddle logit| over the prefill and the steps

    @property
    def max_abs(self):
        return max(self.prefill_max_abs, self.decode_max_abs)

    def bound(self, tolerance: float) -> float:
        """The largest max_abs `tolerance` allows: tolerance per unit of the largest logit (at least 1)."""
        return tolerance * max(1.0, self.logit_scale)


@dataclass
class ReferenceRun:
    """What the reference computed: the prompt (B, S), its prefill logits (B, S, V), per decode step the token fed
    (B, 1) and the logits of that position (B, 1, V)."""

    prompt: np.ndarray
    prefill: np.ndarray
    tokens: List[np.ndarray]
    steps: List[np.ndarray]


def _finite(x, what):
    if not np.isfinite(x).all():
        raise ExportError(f"validation failed: {what} are not finite (NaN or Inf)")
    return x


def reference_run(plan, tensors, prompt: np.ndarray, decode_steps: int, cached: bool = False) -> ReferenceRun:
    """The reference model's prefill logits of `prompt` and its greedy continuation (each step over the whole
    sequence, or with cached=True one token at a time through PaddleFormers' KV cache, as its generate runs: what
    dynamic NTK RoPE past max_position_embeddings is defined by); the model is freed before returning."""
    import paddle

    ref = reference_model(plan, tensors)
    seq, tokens, steps = prompt, [], []
    with paddle.no_grad():
        out = ref(paddle.to_tensor(seq), use_cache=cached, return_dict=True)
        logits = _finite(out.logits.numpy(), "Paddle's prefill logits")
        prefill, last = logits, logits[:, -1]
        for step in range(decode_steps):
            nxt = last.argmax(-1)[:, None].astype(np.int64)  # (B, 1)
            seq = np.concatenate([seq, nxt], axis=1)
            if cached:  # positions given: PaddleFormers' Qwen3Model numbers a cached call's tokens from 0
                pos = paddle.full([seq.shape[0], 1], seq.shape[1] - 1, dtype="int64")
                out = ref(paddle.to_tensor(nxt), position_ids=pos, past_key_values=out.past_key_values,
                          use_cache=True, return_dict=True)
            else:
                out = ref(paddle.to_tensor(seq), return_dict=True)
            full = out.logits.numpy()[:, -1:]  # (B, 1, V)
            tokens.append(nxt)
            steps.append(_finite(full, f"Paddle's logits at decode step {step + 1}"))
            last = full[:, -1]
    del ref
    gc.collect()
    return ReferenceRun(prompt, prefill, tokens, steps)


def _compare(sess, run: ReferenceRun, val: Validation) -> None:
    """onnxruntime (`sess`) on the reference's tokens: logit differences and token agreement into `val`."""
    seq = run.prompt
    mask = np.ones(seq.shape, np.int64)  # the past length, which a sliding-window cache no longer shows
    logits, cache = sess.prefill(seq, mask)
    _finite(logits, "onnxruntime's prefill logits")
    val.prefill_max_abs = float(np.abs(logits - run.prefill).max())
    val.logit_scale = max([float(np.abs(run.prefill).max())] + [float(np.abs(s).max()) for s in run.steps])
    for step, (nxt, want) in enumerate(zip(run.tokens, run.steps)):
        val.tokens_match &= bool((logits[:, -1].argmax(-1) == nxt[:, 0]).all())  # onnxruntime chose it too
        seq = np.concatenate([seq, nxt], axis=1)
        mask = np.ones(seq.shape, np.int64)
        logits, cache = sess.step(nxt, cache, mask)
        _finite(logits, f"onnxruntime's logits at decode step {step + 1}")
        val.decode_max_abs = max(val.decode_max_abs, float(np.abs(logits - want).max()))
        val.steps += 1
    if run.steps:
        val.tokens_match &= bool((logits[:, -1].argmax(-1) == run.steps[-1][:, -1].argmax(-1)).all())


def validate_onnx(onnx_path, plan, tensors, decode_steps=16, batch=2, prompt_len=11, seed=0,
                  log=print) -> Validation:
    """onnx.checker full check, op whitelist, KV head count, and ORT vs Paddle logits (prefill + greedy decode).
    `tensors`: a mapping of the checkpoint's tensors (read as the reference model is loaded)."""
    from ..serve.ort_session import OrtDecoder

    val = Validation(ops=check_graph(onnx_path, plan))
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, plan.config.vocab_size, size=(batch, prompt_len)).astype(np.int64)
    rope = plan.rope
    past_context = rope.dynamic and prompt_len + decode_steps > rope.max_position
    run = reference_run(plan, tensors, prompt, decode_steps, cached=past_context)
    sess = OrtDecoder(onnx_path)
    sess.cache_windows = plan.input_windows
    sess.cache_io = plan.cache_io
    _compare(sess, run, val)
    del sess
    gc.collect()
    windows = sorted({w for w in plan.cache_windows if w})
    crossing = ""
    if windows:
        crossing = (f"; the decode crosses the sliding window ({windows[0]})" if prompt_len + val.steps > windows[0]
                    else f"; the sliding window ({windows[0]}) is longer than the validation text")
    if rope.rope_type != "default":
        crossing += f"; RoPE scaling {rope.rope_type} (factor {rope.factor:g})"
        crossing += (f", past max_position_embeddings={rope.max_position} through Paddle's KV cache" if past_context
                     else "")
    log(f"validation: onnxruntime vs Paddle logits, prefill {batch}x{prompt_len}: max abs diff "
        f"{val.prefill_max_abs:.2e}; {val.steps} greedy decode steps: max abs diff {val.decode_max_abs:.2e}; "
        f"greedy tokens {'match' if val.tokens_match else 'DIFFER'}{crossing}")
    return val
