"""How close a converted model is to the original, on what the healing never saw (tools/shrink_kv.py's before / after
table): each measure written from its definition over Paddle models in float32.

    held-out text   perplexity of the model, and KL(original || model) per position, on held-out windows (B, S)
    chat            the original's greedy answers (<= max_new tokens) to PROBES through the chat template: the share
                    of their tokens the model's argmax predicts, teacher-forced on the prompt and the answer so far
                    (agreement), the mean KL(original || model) over those positions, and how many of the model's own
                    greedy answers are identical
    answers         the model's greedy answer to each probe, as text (the table shows the first)
    KV cache        bytes per token of context, 16-bit, every layer (paddle_vha/accounting.py)

PROBES are kept out of every healing data set the one command makes (make_heal_data --exclude).
"""
from __future__ import annotations

from typing import Callable, Dict, List, Sequence

import numpy as np

__all__ = ["PROBES", "log_softmax", "greedy_answer", "greedy_answers", "Reference", "measure"]

PROBES = [
    "What is the capital of France?",
    "Give me three tips for staying healthy.",
    "Explain photosynthesis in one sentence.",
    "Who wrote Pride and Prejudice?",
    "What is the boiling point of water at sea level?",
    "Why is the sky blue?",
    "How many days are there in a leap year?",
    "What is the largest ocean on Earth?",
    "Write a short greeting for a birthday card.",
    "What language is spoken in Brazil?",
    "How do I make a cup of tea?",
    "What is the difference between weather and climate?",
    "Suggest a healthy breakfast.",
    "What do bees make?",
    "Why do we have night and day?",
    "How do you say thank you in French?",
]


def log_softmax(z) -> np.ndarray:
    z = np.asarray(z, np.float64)
    m = z.max(-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(-1, keepdims=True))


def _logprobs(model, ids, start: int = 0):
    """The model's float32 log-probabilities (a Paddle tensor) at positions start.. of ids (1, S): z - max - log sum
    exp(z - max) in Paddle's element-wise kernels, 8x faster than float64 numpy over a 49,152-way vocabulary (0.17 s
    for 256 positions) and within 1e-6 of it where the measures read them (tests/test_shrink_kv.py checks them against
    float64). Not Paddle 3.3's log_softmax: its CPU kernel takes 43 s for the same (256, 49,152) input."""
    import paddle

    model.eval()
    with paddle.no_grad():
        z = model(paddle.to_tensor(np.asarray(ids, np.int64)), return_dict=True).logits.astype("float32")[0, start:]
        z = z - z.max(-1, keepdim=True)
        return z - paddle.log(paddle.exp(z).sum(-1, keepdim=True))


def _kl_rows(ref_lp: np.ndarray, lp) -> np.ndarray:
    """KL(reference || model) per position from float32 log-probabilities (reference: numpy, model: Paddle tensor)."""
    import paddle

    with paddle.no_grad():
        lr = paddle.to_tensor(ref_lp)
        return (paddle.exp(lr) * (lr - lp)).sum(-1).numpy().astype(np.float64)


def greedy_answer(model, prompt: Sequence[int], max_new: int, eos: Sequence[int]) -> List[int]:
    """Greedy tokens after `prompt` with the model's own KV cache, until an id in `eos` (kept) or max_new tokens. The
    positions are passed: PaddleFormers' Qwen3 restarts them at 0 on a cached step without them (its logits then
    differ from the uncached forward's by ~1; its Llama counts them from the cache)."""
    import paddle

    model.eval()
    out: List[int] = []
    past, feed, done = None, list(prompt), 0
    with paddle.no_grad():
        for _ in range(max_new):
            pos = paddle.to_tensor(np.arange(done, done + len(feed), dtype=np.int64)[None])
            r = model(paddle.to_tensor(np.asarray([feed], np.int64)), past_key_values=past, position_ids=pos,
                      use_cache=True, return_dict=True)
            done += len(feed)
            tok = int(r.logits[0, -1].astype("float32").numpy().argmax())
            out.append(tok)
            if tok in eos:
                break
            past, feed = r.past_key_values, [tok]
    return out


def greedy_answers(model, prompts: Sequence[Sequence[int]], max_new: int, eos: Sequence[int],
                   batch: int = 32) -> List[List[int]]:
    """greedy_answer for each prompt, decoded in batches of at most `batch` (prompts sorted by length, left-padded:
    a 2-D attention mask over the padding, every row's positions counted from its first real token), each row
    stopping at its first id in `eos` (kept) while the others go on. Each row's tokens are the ones it gets alone
    (tests/test_heal_report.py, up to the summation order of a batched matmul)."""
    import paddle

    model.eval()
    out: List[List[int]] = [[] for _ in prompts]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    with paddle.no_grad():
        for a in range(0, len(order), batch):
            rows = order[a:a + batch]
            width = max(len(prompts[i]) for i in rows)
            feed = np.zeros((len(rows), width), np.int64)  # (B, S) left-padded, then (B, 1)
            mask = np.zeros((len(rows), width), np.int64)
            for j, i in enumerate(rows):
                feed[j, width - len(prompts[i]):] = prompts[i]
                mask[j, width - len(prompts[i]):] = 1
            pos = np.maximum(np.cumsum(mask, 1) - 1, 0)
            past, live = None, [True] * len(rows)
            for _ in range(max_new):
                r = model(paddle.to_tensor(feed), attention_mask=paddle.to_tensor(mask),
                          position_ids=paddle.to_tensor(pos), past_key_values=past, use_cache=True, return_dict=True)
                nxt = r.logits[:, -1].astype("float32").numpy().argmax(-1)  # (B,)
                for j, t in enumerate(nxt):
                    if live[j]:
                        out[rows[j]].append(int(t))
                        live[j] = int(t) not in eos
                if not any(live):
                    break
                past, feed = r.past_key_values, nxt.astype(np.int64)[:, None]
                mask = np.concatenate([mask, np.ones((len(rows), 1), np.int64)], 1)
                pos = pos[:, -1:] + 1
    return out


class Reference:
    """The original's side, computed once: its log-probabilities on the held-out windows, its greedy answers to the
    probes and its log-probabilities along them."""

    def __init__(self, original, windows: np.ndarray, prompts: Sequence[Sequence[int]], eos, max_new: int = 48):
        self.windows = np.asarray(windows, np.int64)  # (N, S + 1): inputs and their next tokens
        self.window_lp = [_logprobs(original, w[None, :-1]).numpy() for w in self.windows]  # (S, V) float32
        self.prompts = [list(p) for p in prompts]
        self.eos = list(eos)
        self.answers = greedy_answers(original, self.prompts, max_new, self.eos)
        self.answer_lp = [_logprobs(original, [p + a[:-1]], len(p) - 1).numpy()
                          for p, a in zip(self.prompts, self.answers)]
        self.max_new = max_new


def measure(model, ref: Reference, decode: Callable[[List[int]], str] = None, answers: bool = True) -> Dict:
    """The row of one model against the reference (the module docstring)."""
    nll, kl = [], []
    for w, lr in zip(ref.windows, ref.window_lp):
        lp = _logprobs(model, w[None, :-1])  # (S, V)
        nll.append(-np.take_along_axis(lp.numpy(), w[1:, None], -1)[:, 0].astype(np.float64))
        kl.append(_kl_rows(lr, lp))
    hit = total = 0
    chat_kl = []
    for p, a, lr in zip(ref.prompts, ref.answers, ref.answer_lp):
        lp = _logprobs(model, [p + a[:-1]], len(p) - 1)  # (len(a), V)
        hit += int((lp.argmax(-1).numpy() == np.asarray(a)).sum())
        total += len(a)
        chat_kl.append(_kl_rows(lr, lp))
    row = dict(ppl=float(np.exp(np.concatenate(nll).mean())), kl=float(np.concatenate(kl).mean()),
               chat_agreement=hit / max(1, total), chat_kl=float(np.concatenate(chat_kl).mean()))
    if answers:
        own = greedy_answers(model, ref.prompts, ref.max_new, ref.eos)
        row["identical_answers"] = sum(o == a for o, a in zip(own, ref.answers))
        row["answers"] = [decode(o) if decode else o for o in own]
    return row
