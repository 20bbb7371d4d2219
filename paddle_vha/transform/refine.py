"""Layer-wise refinement of a converted model against the original ("cascading"; docs/conversion.md).

After the closed-form fit (transform/convert_to_vha.py), each converted decoder layer's attention tensors (q/k/v/o,
Premix, Postmix, q_norm / k_norm: everything under `self_attn.`) are refined, one layer at a time, so that the
student layer fed the *student's* own stream reproduces the *teacher's* (the source checkpoint's) layer output:

    layer i:  h_t  the teacher's input to layer i (its own stream),  y_t = teacher_layer_i(h_t)  the target
              h_s  the student's input to layer i (the refined layers 0..i-1's output)
              minimise  |student_layer_i(h_s) - y_t|^2 / |y_t|^2   (relative MSE; the MLP and the layer norms frozen)
              then h_s <- refined student_layer_i(h_s), h_t <- y_t

so each layer also corrects what the layers before it left (the research fork's "teacher path" target). Adam with a
cosine-decayed learning rate and gradient clipping, on random batches of the calibration windows; the full
calibration set is evaluated `evals` times along the way and the best point kept (the start included), so a layer
never ends worse on its calibration tokens than it began. A layer whose starting error is at most `tol` (an exact
conversion: KV heads kept with --premix off, a folded checkpoint converted back) is left untouched, bit for bit.
The reported errors are measured on held-out tokens, before and after, on the same student input.

Memory: one decoder layer of each model at a time (the models are built under paddle.LazyGuard, a layer's
parameters set before it runs and freed after, as transform/layerwise.py does), the streams h_t, h_s, y_t of the
calibration and held-out tokens (float32, 4 x tokens x hidden x 4 B), one training batch's activations and their
gradients; each refined layer's tensors go to .npy files in `spill_dir` (never the whole model in memory).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from ..checkpoint.contract import is_linear_weight
from . import layerwise as lw

__all__ = ["RefineSettings", "LayerReport", "Refined", "refine_layers", "refined_entries", "relative_mse",
           "MAX_STEPS", "token_counts", "refine_flops", "refine_estimate"]

# --refine-steps above this per layer is refused up front: the refinement keeps its best point of `evals` evaluations
# and converges within hundreds of steps (docs/conversion.md: 60-200); 10**9 ran until it was killed
MAX_STEPS = 100_000

ATTN = ".self_attn."


@dataclass
class RefineSettings:
    """steps per layer (0: none); lr: Adam's peak rate (cosine-decayed to lr / 10); batch: windows per step;
    tol: a layer whose calibration error is at most this is exact already and left as it is; evals: full
    calibration-set evaluations per layer (the best kept); clip: gradient-norm clip."""

    steps: int
    lr: float = 1e-3
    batch: int = 4
    tol: float = 1e-10
    evals: int = 5
    clip: float = 1.0
    seed: int = 0


@dataclass
class LayerReport:
    layer: int
    before: float  # held-out relative MSE of the unrefined layer on the student's input
    after: float  # the same for the refined layer
    fit_before: float  # the same two on the calibration tokens
    fit_after: float
    steps: int  # steps run (0: exact already)
    seconds: float
    curve: List[float] = field(default_factory=list)  # calibration error at each evaluation (the start first)

    def line(self) -> str:
        what = "exact already: left as it is" if self.steps == 0 else f"{self.steps} steps, {self.seconds:.1f} s"
        return (f"  layer {self.layer:>3}: held-out rel MSE {self.before:.4e} -> {self.after:.4e} "
                f"(calibration {self.fit_before:.4e} -> {self.fit_after:.4e}; {what})")


def relative_mse(y: np.ndarray, target: np.ndarray) -> float:
    """|y - target|^2 / |target|^2 in float64."""
    y, t = np.asarray(y, np.float64), np.asarray(target, np.float64)
    return float(((y - t) ** 2).sum() / max((t ** 2).sum(), 1e-300))


class Refined:
    """name -> tensor: a refined layer's tensors from their .npy files in spill_dir, every other name from `base`
    (convert_to_vha.LayerTensors, or anything callable the same way)."""

    def __init__(self, base: Callable[[str], Optional[np.ndarray]], spill_dir: str):
        self.base, self.spill_dir, self.files = base, spill_dir, {}

    def put(self, name: str, value: np.ndarray) -> None:
        path = os.path.join(self.spill_dir, f"{len(self.files)}.npy")
        np.save(path, np.ascontiguousarray(value, np.float32))
        self.files[name] = path

    def __call__(self, name: str) -> Optional[np.ndarray]:
        if name in self.files:
            return np.load(self.files[name])
        return self.base(name)

    def __getitem__(self, name: str) -> Optional[np.ndarray]:
        return self(name)


# --- running one decoder layer on its own ---------------------------------------------------------------------------

class _Captured(Exception):
    pass


class _LayerCall:
    """The arguments the backbone passes to its decoder layers (causal mask, RoPE tables, ...) for a [B, S] batch,
    captured once per batch size from the model's own forward (stopped at layer 0), so a layer runs alone exactly
    as it runs inside the model."""

    def __init__(self, model):
        self.model, self.cache = model, {}

    def args(self, batch: int, seq: int):
        if (batch, seq) not in self.cache:
            import paddle

            got = {}

            def grab(_layer, args, kwargs):
                got["args"], got["kwargs"] = args[1:], dict(kwargs)
                raise _Captured()

            handle = self.model.model.layers[0].register_forward_pre_hook(grab, with_kwargs=True)
            try:
                x = paddle.zeros([batch, seq, self.model.config.hidden_size], "float32")
                with paddle.no_grad():
                    self.model.model(inputs_embeds=x, use_cache=False, return_dict=True)
            except _Captured:
                pass
            finally:
                handle.remove()
            self.cache[(batch, seq)] = (got["args"], got["kwargs"])
        return self.cache[(batch, seq)]

    def __call__(self, layer, x):
        args, kwargs = self.args(x.shape[0], x.shape[1])
        out = layer(x, *args, **kwargs)
        return out[0] if isinstance(out, (tuple, list)) else out


def _load(layer, w: lw.Weights, i: int) -> None:
    for name, p in layer.named_parameters():
        lw._set(p, w.read(f"model.layers.{i}.{name}"), f"model.layers.{i}.{name}")


def _free(layer) -> None:
    for _, p in layer.named_parameters():
        p._clear_data()


def _apply(call: _LayerCall, layer, h: np.ndarray, batch: int) -> np.ndarray:
    """layer(h) for h [N, S, hidden] float32, in batches, no gradients."""
    import paddle

    out = []
    with paddle.no_grad():
        for a in range(0, len(h), batch):
            out.append(call(layer, paddle.to_tensor(h[a:a + batch])).numpy())
    return np.concatenate(out)


# --- one layer's refinement -----------------------------------------------------------------------------------------

def _attention_params(layer):
    return [(n, p) for n, p in layer.named_parameters() if n.startswith("self_attn.")]


def _snapshot(params) -> List[np.ndarray]:
    return [p.numpy().copy() for _, p in params]


def _train(call, layer, params, h_s, y_t, s: RefineSettings, rng) -> List[float]:
    """Adam on the attention parameters; returns the calibration error at each evaluation; leaves the best."""
    import math

    import paddle

    for _, p in params:
        p.stop_gradient = False
    opt = paddle.optimizer.Adam(learning_rate=s.lr, parameters=[p for _, p in params],
                                grad_clip=paddle.nn.ClipGradByGlobalNorm(s.clip))
    marks = {int(round(k * s.steps / max(s.evals, 1))) for k in range(1, max(s.evals, 1) + 1)}
    curve = [relative_mse(_apply(call, layer, h_s, s.batch), y_t)]
    best, best_state = curve[0], _snapshot(params)
    for step in range(s.steps):
        opt.set_lr(s.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / s.steps))))
        idx = rng.choice(len(h_s), size=min(s.batch, len(h_s)), replace=False)
        y = call(layer, paddle.to_tensor(h_s[idx]))  # (B, S, hidden)
        t = paddle.to_tensor(y_t[idx])
        loss = ((y - t) ** 2).sum() / (t ** 2).sum()
        loss.backward()
        opt.step()
        opt.clear_grad()
        if step + 1 in marks:
            curve.append(relative_mse(_apply(call, layer, h_s, s.batch), y_t))
            if curve[-1] < best:
                best, best_state = curve[-1], _snapshot(params)
    for (_, p), value in zip(params, best_state):
        p.set_value(value)
        p.stop_gradient = True
    return curve


def _refine_one(i, models, streams, s: RefineSettings, out: Refined) -> LayerReport:
    """Layer i: the target from the teacher, the student's layer refined on the calibration stream, both streams
    advanced; the refined tensors put into `out`. models: (teacher model, its Weights, its _LayerCall, the same
    three of the student); streams: [h_t, h_s, held h_t, held h_s], replaced by the next layer's inputs."""
    t_model, t_weights, t_call, s_model, s_weights, s_call = models
    h_t, h_s, held_t, held_s = streams
    start = time.perf_counter()
    t_layer = t_model.model.layers[i]
    _load(t_layer, t_weights, i)
    y_t, held_y = _apply(t_call, t_layer, h_t, s.batch), _apply(t_call, t_layer, held_t, s.batch)
    _free(t_layer)
    s_layer = s_model.model.layers[i]
    _load(s_layer, s_weights, i)
    before = relative_mse(_apply(s_call, s_layer, held_s, s.batch), held_y)
    params = _attention_params(s_layer)
    curve = [relative_mse(_apply(s_call, s_layer, h_s, s.batch), y_t)]
    steps = 0
    if curve[0] > s.tol and s.steps > 0:
        curve = _train(s_call, s_layer, params, h_s, y_t, s, np.random.default_rng([s.seed, i]))
        steps = s.steps
        for name, p in params:
            value = p.numpy()
            out.put(f"model.layers.{i}.{name}", value.T if is_linear_weight(name, value.ndim) else value)
    new_s, new_held = _apply(s_call, s_layer, h_s, s.batch), _apply(s_call, s_layer, held_s, s.batch)
    after = relative_mse(new_held, held_y)
    _free(s_layer)
    streams[:] = [y_t, new_s, held_y, new_held]
    return LayerReport(i, before, after, curve[0], min(curve), steps, time.perf_counter() - start, curve)


def refine_layers(teacher: lw.Weights, student: lw.Weights, fit_ids: np.ndarray, held_ids: np.ndarray,
                  settings: RefineSettings, base: Callable[[str], Optional[np.ndarray]], spill_dir: str,
                  log: Optional[Callable[[str], None]] = print) -> "tuple[Refined, List[LayerReport]]":
    """Refine every decoder layer of `student` (the converted model's Weights, e.g. convert_to_vha.candidate_weights)
    against `teacher` (the source's), layer by layer, on the calibration token windows fit_ids [N, S]; errors on
    held_ids [M, S]. Returns (Refined over `base`, one LayerReport per layer); log(line) after each layer."""
    t_model, s_model = lw._lazy_model(teacher), lw._lazy_model(student)
    models = (t_model, teacher, _LayerCall(t_model), s_model, student, _LayerCall(s_model))
    streams = [lw._gather_rows(teacher, fit_ids), lw._gather_rows(student, fit_ids),
               lw._gather_rows(teacher, held_ids), lw._gather_rows(student, held_ids)]  # (N, S, hidden) each
    out, reports = Refined(base, spill_dir), []
    for i in range(len(s_model.model.layers)):
        reports.append(_refine_one(i, models, streams, settings, out))
        if log is not None:
            log(reports[-1].line())
    return out, reports


def refined_entries(entries: Sequence, refined: Refined) -> list:
    """The plan's entries with every refined tensor made by the transform (a copied q_norm / k_norm that was
    refined is no longer a copy)."""
    import dataclasses

    return [dataclasses.replace(e, how="refine") if e.name in refined.files and e.how == "copy" else e
            for e in entries]


# --- the converter's refinement step --------------------------------------------------------------------------------

def _batches(tokens: int, seq_len: int) -> int:
    """Batches of 4 windows of seq_len tokens that cover `tokens` (at least one)."""
    return max(1, -(-tokens // (4 * seq_len)))


def token_counts(tokens: int, seq_len: int) -> tuple:
    """(calibration tokens, held-out tokens) the refinement uses for --refine-tokens `tokens`: whole batches of 4
    windows of seq_len tokens, so at least 4 x seq_len each (what it prints is what it fits on)."""
    return 4 * seq_len * _batches(tokens, seq_len), 4 * seq_len * _batches(max(seq_len, tokens // 4), seq_len)


def _token_rows(text, split: str, tokens: int, seq_len: int, seed: int) -> np.ndarray:
    """[N, seq_len] windows of `text` (transform/text.TextTokens) covering at least `tokens` tokens."""
    windows = text.windows(split, _batches(tokens, seq_len), seq_len, 4, seed)
    return np.concatenate([x for x, _ in windows])


def refine_flops(source_cfg, vha_cfg, settings: RefineSettings, tokens: int, seq_len: int) -> float:
    """Matmul FLOPs of the refinement (paddle_vha.accounting's per-token forward of one decoder layer, MLP included):
    per layer the teacher on the calibration and held-out tokens, the student before and after and at each of the
    `evals` evaluations, and `steps` training steps of a batch of windows (forward + backward: 3 forwards)."""
    from ..accounting import arch_from_config, forward_flops_per_token

    def per_layer_token(cfg) -> float:
        arch = arch_from_config({**cfg.to_dict(), "model_type": cfg.model_type}, label=cfg.model_type)
        return forward_flops_per_token(arch, seq_len, causal=True, lm_head=False)["total"] / arch.num_layers

    fit, held = token_counts(tokens, seq_len)
    teacher = per_layer_token(source_cfg) * (fit + held)
    student = per_layer_token(vha_cfg) * ((settings.evals + 2) * fit + 2 * held
                                           + 3 * settings.steps * settings.batch * seq_len)
    return (teacher + student) * vha_cfg.num_hidden_layers


def refine_estimate(source_cfg, vha_cfg, settings: RefineSettings, tokens: int, seq_len: int,
                    gflops: Optional[float]) -> str:
    """The line convert_to_vha prints before any work: the refinement's FLOPs and, at `gflops` (this machine's
    float32 GEMM rate, paddle_vha.machine.gemm_gflops), the time they take at the least."""
    from ..units import fmt_seconds

    flops = refine_flops(source_cfg, vha_cfg, settings, tokens, seq_len)
    fit, _ = token_counts(tokens, seq_len)
    when = (f"; at least {fmt_seconds(flops / (gflops * 1e9))} at this machine's float32 GEMM rate "
            f"({gflops:.0f} GFLOP/s measured now; small batches run slower)" if gflops else "")
    return (f"refinement: {settings.steps:,} steps x {vha_cfg.num_hidden_layers} layers on {fit:,} calibration tokens "
            f"(batches of {settings.batch} x {seq_len}): about {flops / 1e12:.3g} TFLOP{when}")


def refine_memory(cfg, tokens: int, seq_len: int, batch: int = 4) -> int:
    """Bytes the refinement adds: the streams (calibration + a quarter held out; 4 live, 2 more while a layer
    advances them, float32) and one training batch's forward and backward (3 x a forward's activations)."""
    from .memory import forward_bytes

    held = max(seq_len, tokens // 4)
    return 6 * (tokens + held) * cfg.hidden_size * 4 + 3 * forward_bytes(cfg, batch * seq_len, seq_len)


def refine_and_write(plan, tensors, text, settings: RefineSettings, tokens: int, seq_len: int, progress: bool = True,
                     check=None, log=print) -> List[LayerReport]:
    """convert_to_vha's step: refine the converted layers (`tensors`: its LayerTensors) against the source on
    `tokens` calibration tokens of `text` (held-out: a quarter as many of its held-out split), then write OUT_DIR
    as convert_checkpoint does; the spilled layers live beside OUT_DIR until the write ends."""
    import shutil
    import tempfile
    import dataclasses

    from .convert_to_vha import candidate_weights, convert_checkpoint

    fit = _token_rows(text, "train", tokens, seq_len, settings.seed + 1)
    held = _token_rows(text, "val", max(seq_len, tokens // 4), seq_len, 0)
    spill = tempfile.mkdtemp(prefix=".refine-", dir=os.path.dirname(os.path.abspath(plan.out_dir)))
    try:
        teacher = lw.folder_weights(plan.source)  # the stock family's model
        refined, reports = refine_layers(teacher, candidate_weights(plan, tensors), fit, held, settings, tensors,
                                         spill, log)
        written = dataclasses.replace(plan, entries=refined_entries(plan.entries, refined))
        convert_checkpoint(written, refined, progress=progress, check=check)
    finally:
        shutil.rmtree(spill, ignore_errors=True)
    return reports
