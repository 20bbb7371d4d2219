"""What a transform needs in memory, said before it allocates, and the one up-front refusal when the machine lacks it.

Every transform streams (one tensor, or one decoder layer, at a time), so its need is a few terms of the config,
never the checkpoint's size (bytes; h hidden, I intermediate, q = heads * head_dim, k = KV heads * head_dim, V the
vocabulary, L layers, T tokens of one forward pass, S its sequence length, H heads):

    BASE                 Paddle and PaddleFormers imported, the headers read                         ~ 0.6 GB
    tensor(x)            one tensor's float64 math: inputs, intermediates, output             ~ 6 x its elements x 8
    forward(T)           one decoder layer's float32 weights (3 copies) + T tokens' activations and scores:
                         12 (2hq + 2hk + 3hI) + 4 T (8h + 4I) + 8 (T/S) H S^2
    logits               the KL's blocks: 6 x 1024 x 8192 x 8 + 2 x 8192 x h x 4 (+ the two models' final states)
    moments              calibration: L h^2 x 8

The constants are from measured peaks (docs/conversion.md, "Memory"). `refuse_if_short` compares the need with
/proc/meminfo's MemAvailable and raises the transform's error (one line) when it is short.
"""
from __future__ import annotations

from ..machine import available_memory_bytes as mem_available, shortfall_line

__all__ = ["BASE", "mem_available", "tensor_bytes", "forward_bytes", "logits_bytes", "verify_logits_bytes",
           "moments_bytes", "total", "refuse_if_short"]

BASE = 600 << 20
LOGIT_BLOCK = 6 * 1024 * 8192 * 8


def tensor_bytes(elements: int) -> int:
    """One tensor's float64 math (inputs, intermediates, output)."""
    return 6 * int(elements) * 8


def _dims(cfg):
    h, d = cfg.hidden_size, cfg.head_dim
    return h, cfg.intermediate_size, cfg.num_attention_heads * d, cfg.num_key_value_heads * d


def forward_bytes(cfg, tokens: int, seq_len: int) -> int:
    """One layer-by-layer forward pass over `tokens` tokens of length `seq_len` (transform/layerwise.py)."""
    h, inter, q, k = _dims(cfg)
    weights = 12 * (2 * h * q + 2 * h * k + 3 * h * inter)
    seqs = max(1, tokens // max(seq_len, 1))
    return weights + 4 * tokens * (8 * h + 4 * inter) + 8 * seqs * cfg.num_attention_heads * min(seq_len, tokens) ** 2


def logits_bytes(cfg, tokens: int) -> int:
    """The KL's logit blocks and the two models' final hidden states over `tokens` positions."""
    return LOGIT_BLOCK + 2 * 8192 * cfg.hidden_size * 4 + 2 * tokens * cfg.hidden_size * 4


def verify_logits_bytes(cfg, tokens: int) -> int:
    """--verify's logits of two models over `tokens` positions: blocks, concatenation, comparison (float64)."""
    return 7 * tokens * cfg.vocab_size * 8


def total(parts: dict):
    """(bytes, formula) of a need made of named parts: the sum, and "name 1.23 GB + ..." for the log line."""
    return sum(parts.values()), " + ".join(f"{k} {v / 2**30:.2f} GB" for k, v in parts.items())


def text_window_bytes(tokens: int, seq_len: int, batch: int = 4) -> int:
    """The calibration / evaluation windows transform/text.py draws for `tokens` tokens, all held at once: batches of
    `batch` x (seq_len + 1) int64 token ids."""
    batches = -(-tokens // (batch * seq_len))
    return 8 * batches * batch * (seq_len + 1)


def moments_bytes(cfg) -> int:
    return cfg.num_hidden_layers * cfg.hidden_size ** 2 * 8


HINT = "free memory, or lower --pass-tokens / --eval-batches / --calib-tokens"


def refuse_if_short(need: int, what: str, error, verb: str, hint: str = HINT) -> None:
    """`error` (one line) if MemAvailable is below `need` bytes; `what` says where the need comes from."""
    line = shortfall_line(need, mem_available(), what, verb, hint)
    if line is not None:
        raise error(line)
