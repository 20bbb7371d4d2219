"""GGUF (llama.cpp's format) -> this project's safetensors checkpoint in Hugging Face names and layout, with its config,
tokenizer, chat template and generation config: the way in for pretrained models users hold as GGUF files.

The file's `general.architecture` picks the base's GGUFForm from the registry (families.gguf_form: llama, qwen2,
qwen3); its hyper-parameters become config.json through Hugging Face's own config class for that architecture; each
tensor is read, dequantized to float32 (checkpoint/gguf.py), renamed (spec/gguf.py), for Llama has its q / k rows put
back in Hugging Face's order, and streamed to the output one at a time. The weights' precision in the file is printed
and recorded in OUT/gguf_import.json: weights that were quantized (Q4_1, Q8_0, ...) come back on their quantization
grid, which makes any later low-bit quantization of the imported model look better than it would on the original.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np

from ..checkpoint import safetensors_io as st
from ..checkpoint.contract import CheckpointError, compare_shapes
from ..checkpoint.fsutil import check_output_dir
from ..checkpoint.gguf import SUPPORTED, GGUFError, GGUFFile, bits_per_weight
from ..spec.gguf import LAYER_TENSORS, GGUFForm, hf_name, layer_of
from ..units import fmt_bytes
from .describe import Description, Table, group, layer_pattern
from .gguf_tokenizer import GGUFText, read_text, write_text_files
from .plan import Entry, TransformPlan, layout_shards
from .write import write_plan

__all__ = ["IMPORT_DTYPES", "ImportGGUFPlan", "plan_import_gguf", "import_gguf", "unpermute_rows", "RECORD"]

IMPORT_DTYPES = ("float32", "bfloat16", "float16")
ROPE_FREQS = "rope_freqs.weight"  # llama.cpp's per-frequency RoPE divisors (Llama 3.1's scaling)
RECORD = "gguf_import.json"  # OUT's record of where the weights came from, and at what precision
FLOAT_TYPES = ("F32", "F16", "BF16")


def unpermute_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """A Llama q_proj / k_proj weight (or bias) as llama.cpp's converter stored it -> Hugging Face's row order.

    Within each head of d rows, Hugging Face's RoPE pairs row j with row j + d/2 (the two halves); llama.cpp's pairs
    adjacent rows, so its converter stored row h*d + 2j + t = Hugging Face's row h*d + t*d/2 + j (t = 0, 1)."""
    d = w.shape[0] // heads
    # (heads, d/2, 2, ...) indexed (h, j, t) -> (heads, 2, d/2, ...) indexed (h, t, j): Hugging Face's order
    return np.ascontiguousarray(w.reshape(heads, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


@dataclass(kw_only=True)
class ImportGGUFPlan(TransformPlan):
    tool = "paddle-vha-import-gguf"
    verb = "import"
    error = GGUFError

    gguf: GGUFFile
    form: GGUFForm
    text: Optional[GGUFText] = None
    permute: Dict[str, int] = field(default_factory=dict)  # output name -> heads whose rows llama.cpp reordered
    precision: dict = field(default_factory=dict)

    @property
    def in_dir(self) -> str:
        return os.path.dirname(os.path.abspath(self.gguf.path))

    @property
    def inputs(self):
        return self.gguf.tensors

    @property
    def in_config(self) -> dict:
        return self.out_config

    @property
    def bytes_in(self) -> int:
        return sum(t.nbytes for t in self.gguf.tensors.values())

    def describe(self) -> Description:
        c = self.out_config
        header = [f"{self.form.label} (GGUF architecture {self.form.arch!r} -> model_type {self.form.model_type!r}): "
                  f"{c['num_hidden_layers']} layers, hidden {c['hidden_size']}, {c['num_attention_heads']} query / "
                  f"{c['num_key_value_heads']} KV heads, head_dim {c['head_dim']}, vocabulary {c['vocab_size']}, "
                  f"{'tied' if c.get('tie_word_embeddings') else 'untied'} embeddings",
                  f"rope: theta {c.get('rope_theta')}, scaling {c.get('rope_scaling')}; context "
                  f"{c['max_position_embeddings']}; rms_norm_eps {c['rms_norm_eps']}",
                  precision_line(self.precision)]
        rows = []
        for pattern, es in group(self.entries, lambda e: layer_pattern(e.name)).items():
            types = sorted({self.gguf.tensors[e.sources[0]].type for e in es})
            how = " (rows reordered)" if es[0].name in self.permute else ""
            rows.append((pattern, f"x{len(es)}", "/".join(types), f"-> {st.dtype_name(self.out_code)} "
                         f"{list(es[0].shape)}{how}"))
        widths = tuple(max(len(r[k]) for r in rows) for k in range(3))
        text = self.text
        footer = [f"bytes: {fmt_bytes(self.bytes_in, fixed=True)} in the GGUF -> {fmt_bytes(self.bytes_out, fixed=True)}"
                  f" of {st.dtype_name(self.out_code)} weights",
                  "tokenizer: " + ("none in the file (no tokenizer files written)" if text is None else
                                   f"{text.model} ({len(text.tokens)} tokens), chat template "
                                   f"{'yes' if text.chat_template else 'none'}; bos {text.token(text.bos)!r}, eos "
                                   f"{text.token(text.eos)!r}")]
        return Description(f"import_gguf {self.gguf.path} -> {self.out_dir}", header,
                           Table("tensors (Hugging Face name, count, GGUF type, output):", widths, rows), footer,
                           self.notes)


def precision_line(p: dict) -> str:
    parts = [f"{t} {_share(v['parameters'] / p['parameters'])} ({bits_per_weight(t):g} bits/weight)"
             for t, v in sorted(p["types"].items(), key=lambda kv: -kv[1]["parameters"])]
    return f"weights in the file: {p['summary']}: " + ", ".join(parts) + " of the parameters"


def _share(x: float) -> str:
    return f"{x:.1%}" if x >= 1e-3 or x == 0 else "<0.1%"


def _precision(gf: GGUFFile) -> dict:
    """The file's tensor types by parameter count, and whether its weights sit on a quantization grid."""
    types: Dict[str, dict] = {}
    for t in gf.tensors.values():
        v = types.setdefault(t.type, {"tensors": 0, "parameters": 0})
        v["tensors"] += 1
        v["parameters"] += t.elements
    total = sum(v["parameters"] for v in types.values())
    main = max(types, key=lambda k: types[k]["parameters"])
    quantized = sorted(t for t in types if t not in FLOAT_TYPES)
    summary = (f"quantized, mostly {main}" if main not in FLOAT_TYPES else
               f"{main}" + (f" with {', '.join(quantized)} tensors" if quantized else ""))
    return {"summary": summary, "main_type": main, "quantized_types": quantized, "parameters": total,
            "types": types, "file_type": gf.meta("general.file_type")}


def _hparams(gf: GGUFFile, form: GGUFForm) -> dict:
    """The architecture's hyper-parameters (llama.cpp's keys, prefixed by the architecture), checked: one line for a
    missing or odd one."""
    a = form.arch

    def get(key, default=None, required=True, kind=int):
        """A size (kind int: a positive integer) or a number (kind float: its range is the contract's)."""
        value = gf.meta(f"{a}.{key}", default)
        if value is None and required:
            raise GGUFError(f"{gf.path}: metadata {a}.{key} is missing")
        number = kind is float and isinstance(value, (int, float))
        if value is not None and (isinstance(value, bool) or not (isinstance(value, kind) or number) or
                                  (kind is int and value <= 0)):
            raise GGUFError(f"{gf.path}: metadata {a}.{key} = {value!r:.60} is not "
                            f"{'a positive integer' if kind is int else 'a number'}"
                            + (" (per-layer values are not read)" if isinstance(value, list) else ""))
        return value

    h = dict(layers=get("block_count"), hidden=get("embedding_length"), inter=get("feed_forward_length"),
             heads=get("attention.head_count"), context=get("context_length"))
    h["kv_heads"] = get("attention.head_count_kv", h["heads"])
    h["head_dim"] = get("attention.key_length", None, required=False) or h["hidden"] // h["heads"]
    value_dim = get("attention.value_length", None, required=False)
    if value_dim is not None and value_dim != h["head_dim"]:
        raise GGUFError(f"{gf.path}: attention.value_length {value_dim} differs from key_length {h['head_dim']}")
    rope_dim = get("rope.dimension_count", None, required=False)
    if rope_dim is not None and rope_dim != h["head_dim"]:
        raise GGUFError(f"{gf.path}: rope.dimension_count {rope_dim} rotates part of each {h['head_dim']}-wide head "
                        "(partial RoPE), which these architectures do not have")
    if h["heads"] % h["kv_heads"]:
        raise GGUFError(f"{gf.path}: {h['heads']} query heads do not split over {h['kv_heads']} KV heads")
    h["eps"] = float(get("attention.layer_norm_rms_epsilon", kind=float))
    h["theta"] = float(get("rope.freq_base", 10000.0, kind=float))
    h["rope_scaling"] = _rope_scaling(gf, a)
    return h


def _rope_scaling(gf: GGUFFile, a: str) -> Optional[dict]:
    """config.json's rope_scaling from the rope.scaling.* metadata (linear, yarn), None for none; the values' types
    checked here, their ranges by _check_values."""
    kind = gf.typed(f"{a}.rope.scaling.type", str, "a string")
    factor = gf.typed(f"{a}.rope.scaling.factor", (int, float), "a number")
    if kind in (None, "none") and not factor:
        return None
    if kind not in (None, "linear", "yarn"):
        raise GGUFError(f"{gf.path}: rope scaling {kind!r} is not one this importer reads (linear, yarn)")
    if factor is None:
        raise GGUFError(f"{gf.path}: metadata {a}.rope.scaling.type is {kind!r} but {a}.rope.scaling.factor is missing")
    if kind != "yarn":
        return {"rope_type": "linear", "factor": float(factor)}
    out = {"rope_type": "yarn", "factor": float(factor)}
    orig = gf.typed(f"{a}.rope.scaling.original_context_length", int, "a token count")
    if orig:
        out["original_max_position_embeddings"] = orig
    return out


# config.json field -> the metadata key (after "{arch}.") it comes from, for the contract's one-line refusals
FIELD_KEYS = {"rms_norm_eps": "attention.layer_norm_rms_epsilon", "rope_theta": "rope.freq_base",
              "rope_scaling": "rope.scaling.*", "max_position_embeddings": "context_length",
              "hidden_size": "embedding_length", "intermediate_size": "feed_forward_length",
              "num_hidden_layers": "block_count", "num_attention_heads": "attention.head_count",
              "num_key_value_heads": "attention.head_count_kv", "head_dim": "attention.key_length"}


def _check_values(gf: GGUFFile, form: GGUFForm, fields: dict) -> None:
    """The config the import would write, through the value checks every base runs first on a checkpoint's
    config.json, whichever tool reads it (qwen3/contract.py check_config_fields: positive integer sizes, positive
    finite eps and RoPE base, a RoPE scaling served as PaddleFormers and transformers both read it, ...): a file that
    breaks them is refused before anything is written, in one line naming the metadata key. (A base's structural
    limits, e.g. PaddleFormers' Llama needing heads x head_dim = hidden, are not bad values: Hugging Face reads such a
    checkpoint, so it is written and the summary says which tools refuse it.)"""
    from ..qwen3.contract import check_config_fields

    try:
        check_config_fields(fields)
    except ValueError as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        field_name = next((f for f in FIELD_KEYS if msg.startswith(f)), None)
        where = f" (metadata {form.arch}.{FIELD_KEYS[field_name]})" if field_name else ""
        raise GGUFError(f"{gf.path}: {msg}{where}") from None


def llama3_scaling(factors: np.ndarray, head_dim: int, theta: float, where: str) -> dict:
    """config.json's llama3 rope_scaling from llama.cpp's rope_freqs.weight (the divisor of each RoPE frequency).

    Llama 3.1's scaling divides the low frequencies (wavelength above original_max_position_embeddings /
    low_freq_factor) by `factor`, keeps the high ones (below original / high_freq_factor), and blends in between with
    s = (original / wavelength - low) / (high - low): divisor 1 / ((1 - s) / factor + s). So factor is the largest
    divisor, and the blended ones give s, a line in 1 / wavelength; with low_freq_factor 1 (Llama 3.x's) its slope and
    intercept give high_freq_factor and original. The result is checked by recomputing every divisor."""
    f = np.asarray(factors, np.float64)
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelength = 2 * np.pi / inv_freq
    factor = float(f.max())
    blended = (f > 1 + 1e-4) & (f < factor * (1 - 1e-4))
    bad = GGUFError(f"{where}: {ROPE_FREQS} is not a Llama 3.1-style RoPE scaling this importer can read back")
    if factor <= 1 or blended.sum() < 2 or not np.all(np.isfinite(f)) or f.min() < 1 - 1e-4:
        raise bad
    s = (1 / f[blended] - 1 / factor) / (1 - 1 / factor)
    slope, intercept = np.polyfit(1 / wavelength[blended], s, 1)
    low = 1.0
    if intercept >= 0:
        raise bad
    high = low - low / intercept
    original = int(round(slope * (high - low)))

    def mismatch(high_freq: float) -> float:
        smooth = np.clip((original / wavelength - low) / (high_freq - low), 0, 1)
        again = np.where(wavelength < original / high_freq, 1.0,
                         np.where(wavelength > original / low, factor, 1 / ((1 - smooth) / factor + smooth)))
        return float(np.abs(again / f - 1).max())

    # the fit carries the float32 divisors' rounding: take the shortest decimal that gives every divisor back to
    # float32 precision (Llama 3.x: exactly 4)
    high = next((round(high, k) for k in (0, 1, 2, 3, 4) if mismatch(round(high, k)) < 1e-5), high)
    if mismatch(high) > 1e-3:
        raise bad
    return {"rope_type": "llama3", "factor": factor, "low_freq_factor": low, "high_freq_factor": float(high),
            "original_max_position_embeddings": original}


def _check_layers(gf: GGUFFile, form: GGUFForm, h: dict) -> None:
    """Refusals that must come before the expected tensor table is built: a block_count beyond the layers the file
    holds tensors for (a corrupt count would build millions of names first), and, where llama.cpp interleaved the
    RoPE halves, an odd head_dim (its rows pair up within a head: they cannot be put back)."""
    top = max((i for i in map(layer_of, gf.tensors) if i is not None), default=-1) + 1
    if h["layers"] > top:
        raise GGUFError(f"{gf.path}: metadata {form.arch}.block_count = {h['layers']}, but the file holds tensors of "
                        + (f"layers 0..{top - 1} only" if top else "no layer (no blk.N.* tensor)"))
    if form.interleaved_rope and h["head_dim"] % 2:
        raise GGUFError(f"{gf.path}: head_dim {h['head_dim']} is odd: llama.cpp stores a {form.label} head's q / k rows "
                        "as RoPE pairs, which need an even head_dim (the file cannot be a converted checkpoint)")


def _expected(gf: GGUFFile, form: GGUFForm, h: dict, vocab: int) -> Dict[str, tuple]:
    """GGUF name -> numpy-order shape of every tensor the file must hold (optional ones as the file has them)."""
    d, hid, inter = h["head_dim"], h["hidden"], h["inter"]
    q, kv = h["heads"] * d, h["kv_heads"] * d
    layer = {"attn_norm.weight": (hid,), "attn_q.weight": (q, hid), "attn_k.weight": (kv, hid),
             "attn_v.weight": (kv, hid), "attn_output.weight": (hid, q), "ffn_norm.weight": (hid,),
             "ffn_gate.weight": (inter, hid), "ffn_up.weight": (inter, hid), "ffn_down.weight": (hid, inter)}
    has = gf.tensors
    bias = form.qkv_bias if form.qkv_bias is not None else "blk.0.attn_q.bias" in has
    if bias:
        layer.update({"attn_q.bias": (q,), "attn_k.bias": (kv,), "attn_v.bias": (kv,)})
    if form.qk_norm:
        layer.update({"attn_q_norm.weight": (d,), "attn_k_norm.weight": (d,)})
    assert set(layer) <= set(LAYER_TENSORS)
    out = {"token_embd.weight": (vocab, hid), "output_norm.weight": (hid,)}
    if "output.weight" in has:
        out["output.weight"] = (vocab, hid)
    for i in range(h["layers"]):
        out.update({f"blk.{i}.{k}": s for k, s in layer.items()})
    return out


def _config(gf: GGUFFile, form: GGUFForm, h: dict, vocab: int, text: Optional[GGUFText], code: str,
            bias: bool) -> dict:
    """config.json: Hugging Face's config class for the architecture, filled from the file, as its save writes it."""
    import importlib

    module, _, name = form.hf_config.partition(":")
    cls = getattr(importlib.import_module(module), name)
    fields = dict(vocab_size=vocab, hidden_size=h["hidden"], intermediate_size=h["inter"],
                  num_hidden_layers=h["layers"], num_attention_heads=h["heads"], num_key_value_heads=h["kv_heads"],
                  head_dim=h["head_dim"], hidden_act="silu", max_position_embeddings=h["context"],
                  rms_norm_eps=h["eps"], rope_theta=h["theta"], rope_scaling=h["rope_scaling"],
                  tie_word_embeddings="output.weight" not in gf.tensors, attention_bias=bias,
                  torch_dtype=st.dtype_name(code), **form.config_extra)
    if text is not None:
        fields.update(bos_token_id=text.bos, eos_token_id=text.eos, pad_token_id=text.pad)
    _check_values(gf, form, fields)
    try:
        cfg = cls(**fields)
    except (ValueError, TypeError, KeyError) as e:
        raise GGUFError(f"{gf.path}: Hugging Face's {name} refuses the file's hyper-parameters ({e})") from None
    out = cfg.to_diff_dict()
    out.update(architectures=list(form.architectures), model_type=form.model_type)
    out.update({k: v for k, v in fields.items() if k not in out})  # defaults the diff leaves out, said explicitly
    out.pop("transformers_version", None)
    return out


def plan_import_gguf(path: str, out_dir: str, dtype: str = "float32", force: bool = False,
                     max_shard_size="5GB") -> ImportGGUFPlan:
    """Validate the GGUF file (header only) and plan the import; GGUFError (one line) if it is refused."""
    from ..families import UnknownFamily, gguf_form

    if dtype not in IMPORT_DTYPES:
        raise GGUFError(f"--dtype {dtype!r}: expected one of {', '.join(IMPORT_DTYPES)}")
    gf = GGUFFile.open(path)
    try:
        form = gguf_form(gf.arch)
    except UnknownFamily as e:
        raise GGUFError(f"{gf.path}: {e}") from None
    check_output_dir(out_dir, [gf.path], force, GGUFError, input_label="GGUF")
    unsupported = sorted({(t.type, n) for n, t in gf.tensors.items() if t.type not in SUPPORTED})
    if unsupported:
        kinds = sorted({t for t, _ in unsupported})
        raise GGUFError(f"{gf.path}: tensor {unsupported[0][1]} is {unsupported[0][0]} ({len(unsupported)} tensors of "
                        f"type {', '.join(kinds)}), which the importer does not read (it reads {', '.join(SUPPORTED)})")
    if "token_embd.weight" not in gf.tensors:
        raise GGUFError(f"{gf.path}: missing tensors: token_embd.weight")
    h = _hparams(gf, form)
    _check_layers(gf, form, h)
    vocab = gf.tensors["token_embd.weight"].shape[0]
    expected = _expected(gf, form, h, vocab)
    if ROPE_FREQS in gf.tensors:  # Llama 3.1's per-frequency RoPE scaling, stored as its factors: read, not written
        expected[ROPE_FREQS] = (h["head_dim"] // 2,)
    try:
        compare_shapes(gf.path, {n: t.shape for n, t in gf.tensors.items()}, expected)
    except CheckpointError as e:
        raise GGUFError(str(e)) from None
    if ROPE_FREQS in expected:
        if h["rope_scaling"] is not None:
            raise GGUFError(f"{gf.path}: both rope.scaling metadata and {ROPE_FREQS}; which one applies is unclear")
        h["rope_scaling"] = llama3_scaling(gf.read(ROPE_FREQS), h["head_dim"], h["theta"], gf.path)
    text = read_text(gf, vocab)
    code = st.dtype_code(dtype)
    bias = "blk.0.attn_q.bias" in expected
    out_config = _config(gf, form, h, vocab, text, code, bias)
    permute = {}
    entries = []
    for name, shape in expected.items():
        if name == ROPE_FREQS:
            continue
        entry = Entry(hf_name(name), shape, code, how="gguf", sources=(name,))
        if form.interleaved_rope and name.split(".", 2)[-1] in ("attn_q.weight", "attn_q.bias", "attn_k.weight",
                                                                  "attn_k.bias"):
            permute[entry.name] = h["heads"] if ".attn_q." in name else h["kv_heads"]
        entries.append(entry)
    entries.sort(key=lambda e: st.natural_key(e.name))
    precision = _precision(gf)
    notes = []
    if precision["quantized_types"]:
        notes.append(f"the weights were quantized in the file ({', '.join(precision['quantized_types'])}): the "
                     "imported float weights sit on that grid; re-quantizing them is not lossless unless the new "
                     "grid is the file's (Q4_1's block minimum is a free float: int4 with integer zero points, or "
                     "symmetric, loses 0.4 nats of KL on SmolLM2's Q4_1 file, docs/deploy.md), and quantization "
                     "numbers on such a model may differ from a float-trained one's")
    if form.interleaved_rope:
        notes.append("q_proj / k_proj rows are put back in Hugging Face's order (llama.cpp's converter interleaved "
                     "each head's two RoPE halves)")
    if text is None:
        notes.append("the file has no tokenizer: no tokenizer files are written")
    return ImportGGUFPlan(source=None, gguf=gf, form=form, out_dir=out_dir, cfg=None, out_config=out_config,
                          entries=entries, shards=layout_shards(entries, max_shard_size, GGUFError), out_code=code,
                          text=text, permute=permute, precision=precision, notes=notes, force=force)


def _record(plan: ImportGGUFPlan) -> dict:
    p = plan.precision
    return {"source": os.path.basename(plan.gguf.path), "bytes": plan.gguf.size, "gguf_version": plan.gguf.version,
            "architecture": plan.form.arch, "name": plan.gguf.meta("general.name"), "file_type": p["file_type"],
            "weights": p["summary"], "quantized_types": p["quantized_types"],
            "tensor_types": {t: {**v, "bits_per_weight": bits_per_weight(t)} for t, v in p["types"].items()},
            "on_a_quantization_grid": bool(p["quantized_types"]), "output_dtype": st.dtype_name(plan.out_code),
            "rows_reordered": sorted({layer_pattern(n) for n in plan.permute}), "eos_token_id": plan.text.eos_ids if plan.text else None}


def import_gguf(plan: ImportGGUFPlan, progress: bool = True) -> str:
    """Write the planned checkpoint, one tensor at a time, atomically; returns OUT (absolute)."""
    gf = plan.gguf

    def make(entry: Entry) -> np.ndarray:
        w = gf.read(entry.sources[0])
        heads = plan.permute.get(entry.name)
        return w if heads is None else unpermute_rows(w, heads)

    def side_files(folder: str) -> None:
        if plan.text is not None:
            write_text_files(gf, plan.text, folder, plan.out_config["max_position_embeddings"])
        with open(os.path.join(folder, RECORD), "w", encoding="utf-8") as f:
            json.dump(_record(plan), f, indent=2)
            f.write("\n")

    return write_plan(plan, make, progress=progress, side_files=side_files)


def contract_line(out_dir: str) -> str:
    """Whether this project's tools take the written checkpoint (its family's contract), in one line."""
    from ..families import family_of

    try:
        fam = family_of(out_dir)
        fam.validate(out_dir)
    except CheckpointError as e:
        return f"note: Hugging Face reads it, but this project's tools will refuse it: {e}"
    return f"checked against this project's {fam.label} contract: OK (fold, convert, compress and export take it)"


def summary_lines(plan: ImportGGUFPlan) -> List[str]:
    """What the command prints after writing."""
    lines = [precision_line(plan.precision), contract_line(os.path.abspath(plan.out_dir))]
    if plan.text is not None:
        lines.append(f"eos ids (generation_config.json): {plan.text.eos_ids} "
                     f"({', '.join(repr(plan.text.tokens[i]) for i in plan.text.eos_ids)})")
    return lines
