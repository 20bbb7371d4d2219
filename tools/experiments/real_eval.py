"""The real-model study's measurements on held-out text, each written from its definition over a `logits_fn`
(ids (B, S) int64 -> logits (B, S, V)), so a test can check them on any model, and tools/experiments/
real_model_study.py runs them on a Paddle model (`paddle_logits`):

    held-out   on fixed windows of the held-out token stream: NLL = mean over positions of -log p(next token),
               perplexity = exp(NLL), KL = mean over positions of sum_v p_ref(v) (log p_ref(v) - log p(v)) against the
               original model's log-probabilities on the same windows (float32, computed once per process)
    cloze      LAMBADA-style: the last word of a held-out sentence (alphabetic, >= MIN_LETTERS letters) after the
               CONTEXT tokens before it (the same chapter's text, across sentence ends); an item counts as right when
               every token of " word" is the model's argmax given the context and the word's earlier tokens (teacher
               forced: a greedy decoder would write exactly those tokens)
    chat       the original's greedy answer to each prompt through the chat template (until an EOS id or
               max_new tokens); agreement = share of the answer's tokens (its EOS included) that the model's argmax
               predicts, teacher-forced on the prompt and the answer so far; and, for the models whose answers are
               generated too (`greedy_answer`), how many of the 20 answers are identical
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["log_softmax", "heldout_windows", "reference_logprobs", "heldout_metrics", "ClozeItem", "build_cloze",
           "cloze_accuracy", "PROMPTS", "chat_agreement", "greedy_answer", "paddle_logits", "MIN_LETTERS"]

LogitsFn = Callable[[np.ndarray], np.ndarray]
MIN_LETTERS = 4


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, np.float64)
    m = z.max(-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(-1, keepdims=True))


# --- held-out text ------------------------------------------------------------------------------------------------

def heldout_windows(stream: np.ndarray, count: int, seq_len: int) -> List[Tuple[np.ndarray, np.ndarray]]:
    """`count` non-overlapping windows (1, seq_len) of the held-out stream, evenly spaced over it, with their
    next-token labels: the same for every model."""
    span = seq_len + 1
    if len(stream) < count * span:
        raise ValueError(f"the held-out stream has {len(stream)} tokens, fewer than {count} windows of {span}")
    starts = np.linspace(0, len(stream) - span, count).astype(np.int64)
    return [(stream[s:s + seq_len][None].astype(np.int64), stream[s + 1:s + span][None].astype(np.int64))
            for s in starts]


def reference_logprobs(logits_fn: LogitsFn, windows) -> np.ndarray:
    """The reference model's log-probabilities on `windows`, (windows, S, V) float32 (kept in memory: the shared disk
    is the scarcer resource)."""
    return np.stack([log_softmax(logits_fn(x))[0].astype(np.float32) for x, _ in windows])


def heldout_metrics(logits_fn: LogitsFn, windows, ref: Optional[np.ndarray]) -> dict:
    """nll (nats/token), ppl = exp(nll) and kl (nats/token, None without `ref`) over every position of `windows`."""
    nll, kl = [], []
    for k, (x, y) in enumerate(windows):
        lp = log_softmax(logits_fn(x))[0]  # (S, V) float64
        nll.append(-np.take_along_axis(lp, y[0][:, None], axis=-1)[:, 0])
        if ref is not None:
            lr = np.asarray(ref[k], np.float64)
            kl.append((np.exp(lr) * (lr - lp)).sum(-1))
    m = float(np.concatenate(nll).mean())
    return dict(nll=m, ppl=float(np.exp(m)), kl=float(np.concatenate(kl).mean()) if kl else None,
                tokens=int(sum(len(n) for n in nll)))


# --- cloze --------------------------------------------------------------------------------------------------------

SENTENCE_END = re.compile(r"(?<=[.!?])[\"'\u201d_)]*\s+")
LAST_WORD = re.compile(r"([A-Za-z]+)[\"'\u201d_)]*[.!?][\"'\u201d_)]*$")


@dataclass
class ClozeItem:
    context: List[int]  # the CONTEXT tokens before the word
    target: List[int]  # the tokens of " word"
    word: str
    where: str  # "book chapter" of the sentence


def build_cloze(docs, encode: Callable[[str], List[int]], n_items: int, context_tokens: int,
                min_letters: int = MIN_LETTERS) -> List[ClozeItem]:
    """`n_items` cloze items from the held-out documents (objects with .book, .index, .text), evenly spaced over every
    candidate: a sentence ending in an alphabetic word of >= min_letters letters followed by its end mark, with at
    least `context_tokens` tokens of the same document before the word. Context and word are tokenized apart (the
    word with its leading space), and an item is kept only when tokenizing them together gives the same tokens."""
    candidates = []
    for doc in docs:
        text = doc.text
        for m in SENTENCE_END.finditer(text + " "):
            sentence_end = m.start()
            w = LAST_WORD.search(text[:sentence_end])
            if not w or len(w.group(1)) < min_letters:
                continue
            before = text[:w.start(1)]
            if not before.endswith(" "):
                continue  # the word must follow a space (not a dash or a quote)
            candidates.append((doc, before[:-1], w.group(1)))
    if not candidates:
        return []
    picks = np.unique(np.linspace(0, len(candidates) - 1, min(len(candidates), 3 * n_items)).astype(int))
    items = []
    for k in picks:
        doc, before, word = candidates[k]
        ctx, tgt = encode(before), encode(" " + word)
        if len(ctx) < context_tokens or not tgt or encode(before + " " + word)[-len(tgt):] != tgt:
            continue
        items.append(ClozeItem(ctx[-context_tokens:], tgt, word, f"{doc.book} {doc.index}"))
    if len(items) > n_items:
        items = [items[i] for i in np.linspace(0, len(items) - 1, n_items).astype(int)]
    return items


def cloze_accuracy(logits_fn: LogitsFn, items: Sequence[ClozeItem], batch: int = 8) -> float:
    """Share of items whose every target token is the argmax given the context and the earlier target tokens."""
    right = 0
    by_len = {}
    for it in items:
        by_len.setdefault((len(it.context), len(it.target)), []).append(it)
    for (c, t), group in by_len.items():
        for a in range(0, len(group), batch):
            chunk = group[a:a + batch]
            ids = np.asarray([it.context + it.target[:-1] for it in chunk], np.int64)  # (b, c + t - 1)
            pred = logits_fn(ids)[:, c - 1:c - 1 + t].argmax(-1)  # (b, t): the predictions of the target tokens
            right += int((pred == np.asarray([it.target for it in chunk])).all(-1).sum())
    return right / max(1, len(items))


# --- chat -----------------------------------------------------------------------------------------------------------

PROMPTS = [
    "What is the capital of France?",
    "Give me three tips for staying healthy.",
    "Explain photosynthesis in one sentence.",
    "Write a haiku about the sea.",
    "What is 12 times 7?",
    "Who wrote Pride and Prejudice?",
    "Translate 'good morning' into Spanish.",
    "What is the boiling point of water at sea level?",
    "Name three planets in our solar system.",
    "Why is the sky blue?",
    "Suggest a name for a friendly dog.",
    "What does a thermometer measure?",
    "Describe a cat in two sentences.",
    "How many days are there in a leap year?",
    "What is the opposite of 'ancient'?",
    "Write a short greeting for a birthday card.",
    "What is the largest ocean on Earth?",
    "List two uses of a paperclip.",
    "What language is spoken in Brazil?",
    "Summarize the story of Cinderella in one sentence.",
]


def chat_agreement(logits_fn: LogitsFn, prompts: Sequence[List[int]], answers: Sequence[List[int]]) -> float:
    """Share of the answers' tokens (over all prompts) that the model's argmax predicts, teacher-forced on the prompt
    and the answer so far."""
    hit = total = 0
    for p, a in zip(prompts, answers):
        if not a:
            continue
        ids = np.asarray([list(p) + list(a[:-1])], np.int64)
        pred = logits_fn(ids)[0, len(p) - 1:].argmax(-1)  # (len(a),)
        hit += int((pred == np.asarray(a)).sum())
        total += len(a)
    return hit / max(1, total)


def greedy_answer(step_fn, prompt: List[int], max_new: int, eos: Sequence[int]) -> List[int]:
    """Greedy tokens after `prompt` until an id in `eos` (kept) or max_new tokens. step_fn(new_ids, state) ->
    (last-position logits (V,), state): the model's cached forward (state None at the start)."""
    logits, state = step_fn(list(prompt), None)
    out = []
    for _ in range(max_new):
        tok = int(np.argmax(logits))
        out.append(tok)
        if tok in eos:
            break
        logits, state = step_fn([tok], state)
    return out


# --- a Paddle model as logits_fn / step_fn ----------------------------------------------------------------------------

def paddle_logits(model) -> LogitsFn:
    """logits_fn of a Paddle causal LM (eval mode, no gradients, float32 logits)."""
    import paddle

    def fn(ids):
        model.eval()
        with paddle.no_grad():
            return model(paddle.to_tensor(np.asarray(ids, np.int64)), return_dict=True).logits.astype(
                "float32").numpy()
    return fn


def paddle_step(model):
    """step_fn of greedy_answer for a Paddle causal LM: its own KV cache (past_key_values), the positions passed
    (PaddleFormers' Qwen3 restarts them at 0 on a cached step without them; its Llama counts them from the cache)."""
    import paddle

    def fn(new_ids, state):
        past, done = state if state is not None else (None, 0)
        model.eval()
        pos = paddle.to_tensor(np.arange(done, done + len(new_ids), dtype=np.int64)[None])
        with paddle.no_grad():
            out = model(paddle.to_tensor(np.asarray([new_ids], np.int64)), past_key_values=past, position_ids=pos,
                        use_cache=True, return_dict=True)
        return out.logits[0, -1].astype("float32").numpy(), (out.past_key_values, done + len(new_ids))
    return fn
