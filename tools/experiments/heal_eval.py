"""The healing study's evaluation of one model against the original (docs/study/heal.md), on sets never used for
healing (tools/experiments/real_questions.py keeps them out of the data). The measures are tools/shrink_kv.py's
(paddle_vha/train/heal_report.py), on the study's sets:

    held-out text   perplexity and KL(original || model) per position on the held-out Austen chapters
                    (real_eval.heldout_windows: the windows of docs/study/real_model.md, so rows compare)
    held-out chat   the original's greedy answers (<= CHAT_NEW tokens, through the chat template) to real_eval.PROMPTS
                    (20) + HELDOUT_CHAT (30): teacher-forced token agreement with them, the KL per answer position;
                    identical greedy answers
    questions       QUESTIONS (60 checkable items): how many greedy answers hold a right answer
    Paris           the model's own answer to "What is the capital of France?"

identical=False leaves out the model's own answers to the 50 chat prompts (how many equal the original's: half the
generation of a row; the teacher-forced agreement measures the same answers without it).

`Evaluator(original_dir, text_held_path)` computes the original's side once (kept in memory); `evaluate(folder,
generate)` loads a checkpoint folder (any registered family) and returns the row; generate=False measures the
teacher-forced part only (the curves' points).
"""
from __future__ import annotations

import time
from typing import Dict

import numpy as np

from .real_eval import PROMPTS, heldout_windows
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
    def __init__(self, original: str, held_text: str, windows: int = 12, seq_len: int = 256, identical: bool = True):
        import json
        import os

        from paddle_vha.serve.text import generation_defaults, load_codec, render_chat
        from paddle_vha.train.heal_report import Reference

        self.original, self.identical = original, identical  # identical: generate the 50 chat answers too
        with open(os.path.join(original, "config.json"), encoding="utf-8") as f:
            self.codec = load_codec(original, int(json.load(f)["vocab_size"]))
        gen = generation_defaults(original)
        self.eos = [int(e) for e in np.atleast_1d(gen["eos"])]
        self.render = lambda text: self.codec.encode(render_chat(original, [{"role": "user", "content": text}]))
        with open(held_text, encoding="utf-8") as f:
            stream = np.asarray(self.codec.encode(f.read()), np.int64)
        held = np.stack([np.concatenate([x[0], y[0][-1:]]) for x, y in heldout_windows(stream, windows, seq_len)])
        t0 = time.time()
        ref = load_model(original)
        self.ref = Reference(ref, held, [self.render(p) for p in PROMPTS + HELDOUT_CHAT], self.eos, CHAT_NEW)
        self.original_row = self._row(ref, generate=True)
        self.seconds = time.time() - t0

    def _row(self, model, generate: bool) -> Dict:
        from paddle_vha.train.heal_report import greedy_answers, measure

        m = measure(model, self.ref, answers=generate and self.identical)
        row = dict(ppl=m["ppl"], kl=m["kl"], chat_agreement=m["chat_agreement"], chat_kl=m["chat_kl"],
                   chat_prompts=len(self.ref.prompts))
        if generate:
            if self.identical:
                row["chat_identical"] = int(m["identical_answers"])
            asks = [self.render(q) for q, _ in QUESTIONS] + [self.render(PARIS)]
            said = [self.codec.decode(a) for a in greedy_answers(model, asks, CHAT_NEW, self.eos)]
            row["qa_answers"], row["paris"] = said[:-1], said[-1]
            row["qa_right"] = int(sum(correct(a, ok) for a, (_, ok) in zip(said, QUESTIONS)))
            row["qa_items"] = len(QUESTIONS)
        return row

    def evaluate(self, folder: str, generate: bool = True) -> Dict:
        t0 = time.time()
        row = self._row(load_model(folder), generate)
        row["eval_seconds"] = time.time() - t0
        return row
