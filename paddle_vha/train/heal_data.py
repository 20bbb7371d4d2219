"""Healing data written by the original model itself (tools/make_heal_data.py): its sampled chat answers to a
diverse prompt set through its own chat template, and its continuations of general text.

The model runs through its ONNX export with the KV cache (paddle_vha/serve: batched, left-padded prompts, sampled
with temperature / top-p), so a 135M model writes a few hundred tokens a second on two cores. Work goes in rounds of
`batch` sequences; each finished round is appended to the journal (PREFIX.jsonl, one JSON object per document and a
closing {"round": ...} line), so an interrupted run resumes after its last whole round and gives the same documents
as an uninterrupted one (every round draws from its own seed: (seed, kind, round)).

Documents (token ids exactly as the model read and wrote them, never re-tokenized; the journal adds each one's text,
special tokens shown, for reading it and for tools that take text, e.g. convert_to_vha.py --calib-data PREFIX.jsonl):
    chat        the chat template around one prompt (heal_prompts.py: a task prompt or a self-written question) and the
                model's sampled answer, its end-of-turn token included when it stopped by itself
    question    the chat template around QUESTION_REQUEST and the model's reply (where the self-questions come from)
    text        CONTEXT tokens of a text file (a random place in it) and the model's continuation (no chat template)
When the journal holds the tokens asked for, PREFIX.bin / PREFIX.idx (PaddleFormers' pretraining format, what
tools/train.py's dataset=pretrain and tools/store_teacher.py read) and PREFIX.json (settings, sources, licences,
counts, generation speed) are written, each through a temporary file renamed into place.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator, List, Optional

import numpy as np

from .heal_prompts import QUESTION_REQUEST, TASKS, TOPICS, excluded_set, held_out, parse_question, question_requests, \
    task_prompts

__all__ = ["HealSettings", "HealData", "Journal", "KINDS"]

KINDS = ("chat", "question", "text")
PROMPT_LICENCE = "paddle-vha's own topic list and templates (paddle_vha/train/heal_prompts.py), the project's licence"


@dataclass
class HealSettings:
    """What the data is made of; the journal keeps them and a resumed run must ask for the same (the token targets
    may grow)."""
    chat_tokens: int = 262_144  # tokens of chat + question documents to write (prompts and answers)
    text_tokens: int = 131_072  # tokens of text documents (context and continuation)
    samples: int = 2  # sampled answers per prompt
    question_share: float = 0.5  # share of a round's prompts that are the model's own questions
    batch: int = 16  # sequences decoded together
    max_new: int = 256  # answer tokens at most
    text_context: int = 64
    text_new: int = 192
    temperature: float = 0.7
    top_p: float = 0.9
    top_k: int = 0
    seed: int = 0
    text_files: List[str] = field(default_factory=list)

    def fixed(self) -> dict:
        """The settings a resumed run must share (the targets excluded)."""
        d = asdict(self)
        d.pop("chat_tokens")
        d.pop("text_tokens")
        d["text_files"] = [os.path.abspath(p) for p in self.text_files]
        return d

    def check(self) -> None:
        for name in ("samples", "batch", "max_new", "text_context", "text_new"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.chat_tokens < 0 or self.text_tokens < 0 or self.chat_tokens + self.text_tokens == 0:
            raise ValueError("chat-tokens and text-tokens must be >= 0, not both 0")
        if not 0 <= self.question_share <= 1:
            raise ValueError(f"question-share must be in [0, 1], got {self.question_share}")
        if not (self.temperature > 0 and 0 < self.top_p <= 1 and self.top_k >= 0):
            raise ValueError("temperature must be > 0, top-p in (0, 1], top-k >= 0")
        if self.samples > self.batch:
            raise ValueError(f"samples {self.samples} > batch {self.batch}: one round answers at least one prompt")
        if self.text_tokens and not self.text_files:
            raise ValueError("text-tokens > 0 needs --text FILE (general text to continue); or --text-tokens 0")


class Journal:
    """PREFIX.jsonl: {"settings": ...} first, then each round's documents and its closing {"round": r, "kind": k,
    "seconds": s, "new_tokens": n}. Lines after the last closing line (a round cut short) are dropped on reading."""

    def __init__(self, path: str):
        self.path = path
        self.settings: Optional[dict] = None
        self.docs: List[dict] = []
        self.rounds: List[dict] = []
        if os.path.exists(path):
            self._read()

    def _read(self) -> None:
        pending: List[dict] = []
        good_bytes = pending_bytes = 0  # bytes of the whole rounds read so far, and of the round being read
        with open(self.path, "rb") as f:
            for raw in f:
                if not raw.endswith(b"\n"):
                    break  # a line cut by an interruption: the round it belongs to is redone
                try:
                    rec = json.loads(raw)
                except ValueError:
                    break
                if "settings" in rec:
                    self.settings = rec["settings"]
                    good_bytes += len(raw)
                elif "round" in rec:
                    self.docs += pending
                    self.rounds.append(rec)
                    pending, good_bytes, pending_bytes = [], good_bytes + pending_bytes + len(raw), 0
                else:
                    pending.append(rec)
                    pending_bytes += len(raw)
        if self.settings is None:
            raise ValueError(f"{self.path}: not a healing-data journal (no settings line); move it away")
        self._good = good_bytes

    def start(self, settings: dict) -> None:
        """A new journal with `settings`, or check a resumed one's against them (ValueError naming the first that
        differs); the tail of a round cut short is cut off."""
        if self.settings is None:
            with open(self.path, "w", encoding="utf-8") as f:
                f.write(json.dumps({"settings": settings}) + "\n")
            self.settings, self._good = settings, os.path.getsize(self.path)
            return
        for k, v in settings.items():
            if self.settings.get(k) != v:
                raise ValueError(f"{self.path} was written with {k}={self.settings.get(k)!r}, not {v!r}; give the same "
                                 "settings to resume it (only --chat-tokens / --text-tokens may change), or another "
                                 "--out")
        with open(self.path, "r+b") as f:
            f.truncate(self._good)

    def tokens(self, kinds) -> int:
        return sum(len(d["ids"]) for d in self.docs if d["kind"] in kinds)

    def next_round(self, kind: str) -> int:
        return sum(1 for r in self.rounds if r["kind"] == kind)

    def append(self, docs: List[dict], closing: dict) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            for d in docs:
                f.write(json.dumps(d, ensure_ascii=False) + "\n")
            f.write(json.dumps(closing) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.docs += docs
        self.rounds.append(closing)
        self._good = os.path.getsize(self.path)


class HealData:
    """The rounds that write the data: `session` (a paddle_vha.serve decoder session of the original), `codec` (its
    tokenizer), `render(prompt) -> text` (its chat template around one user message), `stop` its end-of-turn ids."""

    def __init__(self, session, codec, render: Callable[[str], str], stop, pad: int, settings: HealSettings,
                 journal: Journal, excluded=(), context_length: Optional[int] = None):
        self.session, self.codec, self.render, self.stop, self.pad = session, codec, render, stop, pad
        self.s, self.journal = settings, journal
        self.excluded = excluded_set(excluded)
        self.context_length = context_length
        self._text = None
        self._pool = None
        self.dropped_held_out = 0

    # --- one batch through the model --------------------------------------------------------------------------

    def _sample(self, prompts: List[List[int]], max_new: int, seed: int):
        """Sampled continuations of token lists (left-padded into one batch): (new ids per row, stopped per row)."""
        from ..serve.generate import generate

        width = max(len(p) for p in prompts)
        ids = np.array([[self.pad] * (width - len(p)) + list(p) for p in prompts], np.int64)  # (B, W) left-padded
        mask = np.array([[0] * (width - len(p)) + [1] * len(p) for p in prompts], np.int64)
        s = self.s
        res = generate(self.session, ids, max_new, do_sample=True, temperature=s.temperature, top_k=s.top_k,
                       top_p=s.top_p, seed=seed, eos_token_id=self.stop, pad_token_id=self.pad, attention_mask=mask)
        return [res.row(i, keep_eos=True).tolist() for i in range(len(prompts))], res.finished.tolist()

    def _seed(self, kind: str, r: int) -> int:
        return int(np.random.SeedSequence([self.s.seed, KINDS.index(kind), r]).generate_state(1)[0])

    # --- chat rounds --------------------------------------------------------------------------------------------

    def chat_round(self, r: int) -> List[dict]:
        """Round r: its self-questions asked and parsed, its task prompts taken, every prompt answered `samples`
        times."""
        s = self.s
        n_prompts = s.batch // s.samples
        n_q = int(round(n_prompts * s.question_share))
        seed = self._seed("chat", r)
        docs: List[dict] = []
        questions: List[str] = []
        if n_q:
            requests = question_requests(np.random.default_rng([s.seed, 1]), (r + 1) * n_q)[r * n_q:]
            ids = [self.codec.encode(self.render(q)) for q in requests]
            replies, stopped = self._sample(ids, 48, seed + 1)
            for req, p, a, ok in zip(requests, ids, replies, stopped):
                docs.append(dict(kind="question", prompt=req, ids=p + a, new=len(a), eos=bool(ok),
                                 text=self.codec.decode(p + a, skip_special=False)))
                q = parse_question(self.codec.decode(a))
                if q is None:
                    continue
                if held_out(q, self.excluded):
                    self.dropped_held_out += 1
                    continue
                questions.append(q)
        pool = self._task_pool()
        k = n_prompts - len(questions)
        start = (r * n_prompts) % len(pool)
        tasks = [pool[(start + i) % len(pool)] for i in range(k)]
        prompts = questions + tasks
        ids = [self.codec.encode(self.render(p)) for p in prompts for _ in range(s.samples)]
        answers, stopped = self._sample(ids, s.max_new, seed)
        for i, (p, a, ok) in enumerate(zip(ids, answers, stopped)):
            docs.append(dict(kind="chat", prompt=prompts[i // s.samples], ids=p + a, new=len(a), eos=bool(ok),
                             source="self-question" if i // s.samples < len(questions) else "task",
                             text=self.codec.decode(p + a, skip_special=False)))
        return docs

    def _task_pool(self) -> List[str]:
        """The task prompts in the seed's order, the held-out ones left out."""
        if self._pool is None:
            self._pool = [t for t in task_prompts(np.random.default_rng([self.s.seed, 0]))
                          if not held_out(t, self.excluded)]
            if not self._pool:
                raise ValueError("every task prompt is held out (--exclude)")
        return self._pool

    # --- text rounds --------------------------------------------------------------------------------------------

    def _text_tokens(self) -> np.ndarray:
        if self._text is None:
            chunks = []
            for path in self.s.text_files:
                with open(path, encoding="utf-8") as f:
                    chunks.append(np.asarray(self.codec.encode(f.read()), np.int64))
            self._text = np.concatenate(chunks) if chunks else np.zeros(0, np.int64)
            if len(self._text) <= self.s.text_context:
                raise ValueError(f"the --text files hold {len(self._text)} tokens, not more than --text-context "
                                 f"{self.s.text_context}")
        return self._text

    def text_round(self, r: int) -> List[dict]:
        s = self.s
        text = self._text_tokens()
        rng = np.random.default_rng(self._seed("text", r))
        starts = rng.integers(0, len(text) - s.text_context, s.batch)
        ctx = [text[a:a + s.text_context].tolist() for a in starts]
        conts, stopped = self._sample(ctx, s.text_new, self._seed("text", r) + 1)
        return [dict(kind="text", prompt=f"text@{int(a)}", ids=c + n, new=len(n), eos=bool(ok),
                     text=self.codec.decode(c + n, skip_special=False)) for a, c, n, ok in zip(starts, ctx, conts, stopped)]

    # --- the run ------------------------------------------------------------------------------------------------

    def rounds(self) -> Iterator[dict]:
        """Run rounds until the journal holds the asked tokens of each kind; yields each round's closing record."""
        s = self.s
        for kind, target, run in (("chat", s.chat_tokens, self.chat_round), ("text", s.text_tokens, self.text_round)):
            kinds = ("chat", "question") if kind == "chat" else ("text",)
            while self.journal.tokens(kinds) < target:
                r = self.journal.next_round(kind)
                t0 = time.perf_counter()
                docs = run(r)
                dt = time.perf_counter() - t0
                closing = dict(round=r, kind=kind, seconds=dt, new_tokens=sum(d["new"] for d in docs),
                               tokens=sum(len(d["ids"]) for d in docs))
                self.journal.append(docs, closing)
                yield closing


def summary(journal: Journal) -> dict:
    """Counts, tokens and generation speed by kind, from the journal."""
    out = {}
    for kind in KINDS:
        docs = [d for d in journal.docs if d["kind"] == kind]
        out[kind] = dict(documents=len(docs), tokens=sum(len(d["ids"]) for d in docs),
                         new_tokens=sum(d["new"] for d in docs), stopped=sum(1 for d in docs if d["eos"]))
    for kind in ("chat", "text"):
        rounds = [r for r in journal.rounds if r["kind"] == kind]
        secs = sum(r["seconds"] for r in rounds)
        new = sum(r["new_tokens"] for r in rounds)
        out[kind + "_rounds"] = dict(rounds=len(rounds), seconds=round(secs, 1),
                                     new_tokens_per_second=round(new / secs, 1) if secs else None)
    out["prompt_sources"] = dict(
        tasks=len(TASKS), topics=len(TOPICS), question_request=QUESTION_REQUEST, licence=PROMPT_LICENCE,
        self_questions=sum(1 for d in journal.docs if d.get("source") == "self-question") ,
        task_answers=sum(1 for d in journal.docs if d.get("source") == "task"))
    return out
