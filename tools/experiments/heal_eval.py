"""The healing study's evaluation of one model against the original (docs/study/heal.md), on sets never used for
healing (tools/experiments/real_questions.py keeps them out of the data):

    held-out text   perplexity and KL(original || model) on the held-out Austen chapters (real_eval.heldout_windows:
                    the windows of docs/study/real_model.md, so rows compare)
    held-out chat   the original's greedy answers (<= CHAT_NEW tokens, through the chat template) to real_eval.PROMPTS
                    (20) + HELDOUT_CHAT (30): teacher-forced token agreement with them and the mean KL on their
                    positions; identical greedy answers
    questions       QUESTIONS (60 checkable items): share of greedy answers holding a right answer
    Paris           the model's own answer to "What is the capital of France?"

`Evaluator(original_dir, text_held_path)` computes the original's side once (cached in memory); `evaluate(folder)`
loads a checkpoint folder (any registered family) and returns the row.
"""
from __future__ import annotations

import time
from typing import Dict, List

import numpy as np

from .real_eval import PROMPTS, chat_agreement, greedy_answer, heldout_metrics, heldout_windows, log_softmax, \
    paddle_logits, paddle_step, reference_logprobs
from .real_questions import HELDOUT_CHAT, QUESTIONS, correct

__all__ = ["Evaluator", "load_model", "CHAT_NEW"]

CHAT_NEW = 48
PARIS = "What is the capital of France?"


def load_model(folder: str):
    from paddle_vha.families import load_float32_model

    model, _ = load_float32_model(folder)
    model.eval()
    return model


class Evaluator:
    def __init__(self, original: str, held_text: str, windows: int = 12, seq_len: int = 256):
        from paddle_vha.serve.text import generation_defaults, load_codec, render_chat

        import json
        import os

        self.original = original
        with open(os.path.join(original, "config.json"), encoding="utf-8") as f:
            self.codec = load_codec(original, int(json.load(f)["vocab_size"]))
        gen = generation_defaults(original)
        self.eos = [int(e) for e in np.atleast_1d(gen["eos"])]
        self.render = lambda text: self.codec.encode(render_chat(original, [{"role": "user", "content": text}]))
        with open(held_text, encoding="utf-8") as f:
            stream = np.asarray(self.codec.encode(f.read()), np.int64)
        self.windows = heldout_windows(stream, windows, seq_len)
        t0 = time.time()
        ref = load_model(original)
        self.ref_logits = paddle_logits(ref)
        self.ref_lp = reference_logprobs(self.ref_logits, self.windows)
        self.chat_prompts = [self.render(p) for p in PROMPTS + HELDOUT_CHAT]
        step = paddle_step(ref)
        self.chat_answers = [greedy_answer(step, p, CHAT_NEW, self.eos) for p in self.chat_prompts]
        self.chat_ref = [log_softmax(self.ref_logits(np.asarray([p + a[:-1]], np.int64))[0, len(p) - 1:]).astype(
            np.float32) for p, a in zip(self.chat_prompts, self.chat_answers)]
        self.original_row = self._row(ref, original_side=True)
        self.seconds = time.time() - t0

    def _row(self, model, original_side: bool = False) -> Dict:
        fn = paddle_logits(model)
        step = paddle_step(model)
        held = heldout_metrics(fn, self.windows, None if original_side else self.ref_lp)
        agree = chat_agreement(fn, self.chat_prompts, self.chat_answers)
        kls: List[float] = []
        same = 0
        for p, a, ref in zip(self.chat_prompts, self.chat_answers, self.chat_ref):
            lp = log_softmax(fn(np.asarray([p + a[:-1]], np.int64))[0, len(p) - 1:])
            kls.append(float((np.exp(ref) * (ref - lp)).sum(-1).mean()))
        if not original_side:
            same = sum(greedy_answer(step, p, CHAT_NEW, self.eos) == a
                       for p, a in zip(self.chat_prompts, self.chat_answers))
        else:
            same = len(self.chat_prompts)
        qa_answers = [self.codec.decode(greedy_answer(step, self.render(q), CHAT_NEW, self.eos)) for q, _ in QUESTIONS]
        qa = [correct(ans, ok) for ans, (_, ok) in zip(qa_answers, QUESTIONS)]
        paris = self.codec.decode(greedy_answer(step, self.render(PARIS), CHAT_NEW, self.eos))
        return dict(ppl=held["ppl"], kl=held["kl"] or 0.0, chat_agreement=agree, chat_kl=float(np.mean(kls)),
                    chat_identical=int(same), chat_prompts=len(self.chat_prompts), qa_right=int(sum(qa)),
                    qa_items=len(qa), paris=paris, qa_answers=qa_answers)

    def evaluate(self, folder: str) -> Dict:
        t0 = time.time()
        row = self._row(load_model(folder))
        row["eval_seconds"] = time.time() - t0
        return row
