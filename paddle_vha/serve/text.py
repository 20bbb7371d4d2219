"""The text side of an export folder (or checkpoint folder): its tokenizer, stop tokens, sampling defaults and chat
template, read from the files the checkpoint ships beside its weights.

    codec = load_codec(folder, vocab_size)      # None when there is no way to turn text into ids
    ids = codec.encode("def fib(n):")           # no special tokens added (Qwen3 adds none)
    codec.decode(ids)                           # special tokens skipped; skip_special=False shows them
    gen = generation_defaults(folder)           # eos ids (a list), pad id, do_sample, temperature, top_k, top_p
    text = render_chat(folder, [{"role": "user", "content": "hi"}])   # the chat template, generation prompt added

Byte-level models (vocabulary 256, what tools/train.py makes on the embedded corpus) encode text as its UTF-8 bytes;
every other vocabulary needs the folder's tokenizer.json (Hugging Face `tokenizers`). EOS comes from
generation_config.json (`eos_token_id`, an id or a list: Qwen3 lists <|im_end|> and <|endoftext|>), else config.json.
The chat template is chat_template.jinja, else tokenizer_config.json's `chat_template`; it is rendered with Jinja2 in a
sandbox the way Hugging Face's `apply_chat_template` renders it (trim_blocks, lstrip_blocks, `tojson`,
`raise_exception`, `strftime_now`, loop controls; the special tokens as variables). Problems are one-line ServeErrors.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Callable, List, Optional

from .session import ServeError

__all__ = ["TextCodec", "load_codec", "generation_defaults", "chat_template", "render_chat", "BYTE_VOCAB"]

BYTE_VOCAB = 256


def _json(folder: str, name: str) -> Optional[dict]:
    """A JSON object beside the model, or None if the file is absent; ServeError if it is not one."""
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ServeError(f"{path}: not valid JSON ({type(e).__name__}: {e})") from None
    if not isinstance(obj, dict):
        raise ServeError(f"{path}: expected a JSON object")
    return obj


@dataclass
class TextCodec:
    """encode(text) -> ids; decode(ids, skip_special) -> text; special: the ids decode skips by default."""

    encode: Callable[[str], List[int]]
    _decode: Callable[[List[int], bool], str]
    source: str

    def decode(self, ids, skip_special: bool = True) -> str:
        return self._decode([int(i) for i in ids], skip_special)


def _byte_codec() -> TextCodec:
    def decode(ids, skip_special):
        return bytes(i for i in ids if 0 <= i < BYTE_VOCAB and (i != 0 or not skip_special)).decode(
            "utf-8", errors="replace")  # NUL ends a document in the byte corpus: a special token

    return TextCodec(lambda text: list(text.encode("utf-8")), decode, "UTF-8 bytes")


def load_codec(folder: str, vocab_size: int) -> Optional[TextCodec]:
    """The codec of a folder: UTF-8 bytes for a 256-token vocabulary, else its tokenizer.json; None if neither."""
    if vocab_size == BYTE_VOCAB:
        return _byte_codec()
    path = os.path.join(folder, "tokenizer.json")
    if not os.path.isfile(path):
        return None
    from ..checkpoint.tokenizer_file import guarded, open_tokenizer

    tok = open_tokenizer(path, ServeError)
    return TextCodec(guarded(lambda text: tok.encode(text, add_special_tokens=False).ids, path, "encode", ServeError),
                     guarded(lambda ids, skip: tok.decode(ids, skip_special_tokens=skip), path, "decode", ServeError),
                     "tokenizer.json")


def _ids(value, what: str) -> List[int]:
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise ServeError(f"{what} must be a token id or a list of ids, got {value!r}")
    return list(values)


def generation_defaults(folder: str) -> dict:
    """eos (list of ids, [] if none is declared), pad (an id or None), do_sample, temperature, top_k, top_p: from
    generation_config.json, EOS / pad falling back to config.json; missing sampling fields are left out."""
    gen = _json(folder, "generation_config.json") or {}
    cfg = _json(folder, "config.json") or {}
    out = {}
    for key, label in (("eos_token_id", "eos"), ("pad_token_id", "pad")):
        src, name = (gen, "generation_config.json") if gen.get(key) is not None else (cfg, "config.json")
        value = src.get(key)
        out[label] = [] if value is None else _ids(value, f"{os.path.join(folder, name)}: {key}")
    out["pad"] = out["pad"][0] if out["pad"] else (out["eos"][0] if out["eos"] else None)
    for key, kind in (("do_sample", bool), ("temperature", (int, float)), ("top_k", int), ("top_p", (int, float))):
        if isinstance(gen.get(key), kind) and (kind is bool or not isinstance(gen[key], bool)):
            out[key] = gen[key]
    return out


def chat_template(folder: str) -> Optional[str]:
    """chat_template.jinja, else tokenizer_config.json's chat_template (a string, or the "default" of a named list);
    None if the folder has neither."""
    path = os.path.join(folder, "chat_template.jinja")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return f.read()
    tpl = (_json(folder, "tokenizer_config.json") or {}).get("chat_template")
    if isinstance(tpl, list):  # [{"name": ..., "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict)}
        tpl = named.get("default")
    return tpl if isinstance(tpl, str) and tpl else None


def _special_tokens(folder: str) -> dict:
    """bos_token, eos_token, pad_token, unk_token ... as strings, from tokenizer_config.json then
    special_tokens_map.json (what the template sees as variables)."""
    out = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):  # the second wins
        for key, value in (_json(folder, name) or {}).items():
            if key.endswith("_token"):
                value = value.get("content") if isinstance(value, dict) else value
                if isinstance(value, str):
                    out[key] = value
    return out


def _environment():
    from datetime import datetime

    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def render_chat(folder: str, messages: List[dict], add_generation_prompt: bool = True, **kwargs) -> str:
    """The folder's chat template applied to `messages`; ServeError (one line) if it has none or it fails."""
    template = chat_template(folder)
    if template is None:
        raise ServeError(f"{folder}: no chat template (neither chat_template.jinja nor a chat_template in "
                         "tokenizer_config.json); drop --chat to use the prompt as it is")
    import jinja2

    try:
        return _environment().from_string(template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, **_special_tokens(folder), **kwargs)
    except jinja2.exceptions.TemplateError as e:
        raise ServeError(f"{folder}: the chat template fails ({type(e).__name__}: {e})") from None
