"""The text side of a GGUF file as Hugging Face files: tokenizer.json + tokenizer_config.json (with the chat template),
special_tokens_map.json and generation_config.json (its EOS ids: the file's EOS and the chat template's end-of-turn
token).

The vocabulary and merges go through transformers' own GGUF tokenizer conversion (transformers.integrations.ggml,
what `AutoTokenizer.from_pretrained(..., gguf_file=...)` runs), with what that conversion gets wrong for these files
set from the file itself: a byte-level BPE's pre-tokenizer (transformers' Llama converter gives every byte-level Llama
GGUF GPT-2's regex and byte fallback, whatever tokenizer.ggml.pre says, and llama.cpp's converter then reads such a
tokenizer.json back as a SentencePiece vocabulary), the BOS / EOS / UNK / PAD strings (its Llama converter names the
BOS token for both BOS and EOS), BOS / EOS added on encoding only where the file says so (add_bos_token /
add_eos_token), and no clean-up of spaces on decoding (decode gives back exactly the tokens' text, as llama.cpp does).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import List, Optional

from ..checkpoint.gguf import GGUFError, GGUFFile
from ..spec.gguf import DEFAULT_PRE

__all__ = ["GGUFText", "read_text", "write_text_files"]

CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types of a control (special) token and a user-defined one
MARKER = "\u2063PADDLEVHA-END-OF-TURN-PROBE\u2063"


@dataclass
class GGUFText:
    """What the file says about text: tokenizer model, vocabulary size, special ids, chat template."""

    model: Optional[str]
    pre: Optional[str]  # tokenizer.ggml.pre: llama.cpp's name of a byte-level BPE's pre-tokenizer
    tokens: List[str]
    token_types: List[int]
    bos: Optional[int] = None
    eos: Optional[int] = None
    unk: Optional[int] = None
    pad: Optional[int] = None
    eot: Optional[int] = None  # tokenizer.ggml.eot_token_id, where the file has one
    add_bos: bool = False
    add_eos: bool = False
    chat_template: Optional[str] = None
    eos_ids: List[int] = field(default_factory=list)  # generation_config's, filled by write_text_files

    def token(self, i: Optional[int]) -> Optional[str]:
        return self.tokens[i] if i is not None else None


def _id(gf: GGUFFile, key: str, vocab: int) -> Optional[int]:
    value = gf.meta(f"tokenizer.ggml.{key}")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < vocab:
        raise GGUFError(f"{gf.path}: tokenizer.ggml.{key} = {value!r} is not a token id below {vocab}")
    return value


def read_text(gf: GGUFFile, vocab_size: int) -> Optional[GGUFText]:
    """The file's tokenizer metadata, checked (None when it has no vocabulary); GGUFError (one line) for a tokenizer
    model the conversion does not take or a vocabulary larger than the embedding."""
    tokens = gf.typed("tokenizer.ggml.tokens", (list, str), "a list of strings")
    if tokens is None:
        return None
    from ..families import GGUF_BPE, GGUF_SENTENCEPIECE

    model = gf.meta("tokenizer.ggml.model")
    if model not in (GGUF_BPE, GGUF_SENTENCEPIECE):
        raise GGUFError(f"{gf.path}: tokenizer.ggml.model {model!r:.60} is not one this importer converts "
                        f"({GGUF_BPE}: byte-level BPE, {GGUF_SENTENCEPIECE}: SentencePiece-style)")
    if len(tokens) > vocab_size:
        raise GGUFError(f"{gf.path}: the tokenizer has {len(tokens)} tokens, the embedding {vocab_size} rows")
    n = len(tokens)
    if model == GGUF_BPE and len(set(tokens)) != n:  # a byte-level BPE's vocabulary is a map from token to id
        seen = {}
        i, j = next((seen[t], i) for i, t in enumerate(tokens) if seen.setdefault(t, i) != i)
        raise GGUFError(f"{gf.path}: tokenizer.ggml.tokens holds {tokens[j]!r:.40} twice (ids {i} and {j}): a "
                        "byte-level BPE vocabulary maps each token to one id, so one of them would be lost")
    types = gf.typed("tokenizer.ggml.token_type", (list, int), "a list of integers") or [1] * n
    for key, kind, what in _CHECKED:  # read later by the conversion: their types are checked here, up front
        gf.typed(f"tokenizer.ggml.{key}", kind, what)
    if model == GGUF_BPE:
        _check_merges(gf, set(tokens))
    if len(types) != n:
        raise GGUFError(f"{gf.path}: tokenizer.ggml.token_type has {len(types)} entries for {n} tokens")
    return GGUFText(model=model, pre=gf.typed("tokenizer.ggml.pre", str, "a string"), tokens=list(tokens),
                    token_types=list(types), bos=_id(gf, "bos_token_id", n),
                    eos=_id(gf, "eos_token_id", n), unk=_id(gf, "unknown_token_id", n),
                    pad=_id(gf, "padding_token_id", n), eot=_id(gf, "eot_token_id", n),
                    add_bos=gf.typed("tokenizer.ggml.add_bos_token", bool, "true or false", False),
                    add_eos=gf.typed("tokenizer.ggml.add_eos_token", bool, "true or false", False),
                    chat_template=gf.typed("tokenizer.chat_template", str, "a string (a Jinja template)"))


def _check_merges(gf: GGUFFile, vocabulary: set) -> None:
    """Each merge "a b" of a byte-level BPE names two tokens whose join is a token too (the BPE model is built from
    them: one that is not refuses to build, after the plan); the first that does not, in one line."""
    for i, merge in enumerate(gf.meta("tokenizer.ggml.merges") or []):
        parts = merge.split(" ")
        missing = next((t for t in (parts + ["".join(parts)] if len(parts) == 2 else []) if t not in vocabulary),
                       None)
        if len(parts) != 2 or missing is not None:
            why = (f"{missing!r:.40} is not a token of the vocabulary" if len(parts) == 2 else
                   f"it is not two tokens separated by one space")
            raise GGUFError(f"{gf.path}: tokenizer.ggml.merges[{i}] = {merge!r:.60}: {why}")


_CHECKED = (("merges", (list, str), "a list of strings"), ("scores", (list, (int, float)), "a list of numbers"),
            ("add_space_prefix", bool, "true or false"))


def _converter_input(gf: GGUFFile, text: GGUFText) -> dict:
    """The dict transformers' GGUF converters take (the names its own GGUF loader gives the metadata)."""
    d = {"tokenizer_type": text.model, "tokens": text.tokens, "token_type": text.token_types}
    for key, name in (("scores", "scores"), ("merges", "merges"), ("add_space_prefix", "add_prefix_space")):
        value = gf.meta(f"tokenizer.ggml.{key}")
        if value is not None:
            d[name] = value
    for name, value in (("bos_token_id", text.bos), ("eos_token_id", text.eos), ("unk_token_id", text.unk),
                        ("pad_token_id", text.pad)):
        if value is not None:
            d[name] = value
    return d


def _post_processor(text: GGUFText):
    """BOS / EOS added on encoding where the file says so (None: nothing added)."""
    from tokenizers import processors

    bos = f"{text.token(text.bos)}:0 " if text.add_bos and text.bos is not None else ""
    eos = f" {text.token(text.eos)}:0" if text.add_eos and text.eos is not None else ""
    if not bos and not eos:
        return None
    specials = [(text.token(i), i) for i in dict.fromkeys(
        i for i, on in ((text.bos, text.add_bos), (text.eos, text.add_eos)) if on and i is not None)]
    return processors.TemplateProcessing(single=f"{bos}$A:0{eos}", pair=f"{bos}$A:0{eos} {bos}$B:1{eos}".strip(),
                                         special_tokens=specials)


def _end_of_turn(folder: str, text: GGUFText) -> Optional[int]:
    """The control token the chat template puts right after an assistant message (ChatML's <|im_end|>, Llama 3's
    <|eot_id|>), found by rendering the template around a marker; None if there is none or the template fails."""
    from ..serve.session import ServeError
    from ..serve.text import render_chat

    try:
        rendered = render_chat(folder, [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": MARKER}],
                               add_generation_prompt=False)
    except ServeError:
        return None
    at = rendered.find(MARKER)
    if at < 0:
        return None
    after = rendered[at + len(MARKER):].lstrip(" ")
    controls = sorted((i for i, t in enumerate(text.token_types) if t == CONTROL), key=lambda i: -len(text.tokens[i]))
    return next((i for i in controls if text.tokens[i] and after.startswith(text.tokens[i])), None)


def backend_tokenizer(gf: GGUFFile, text: GGUFText):
    """The `tokenizers` Tokenizer of the file's vocabulary. SentencePiece-style ("llama": scores, byte fallback):
    transformers' GGUF Llama converter. Byte-level BPE ("gpt2": merges): transformers' GGUF GPT-2 converter for the
    vocabulary and merges, with the pre-tokenizer llama.cpp names in tokenizer.ggml.pre (a base's GGUFPre; GPT-2's
    own for "default" and names no base describes), the control tokens as special tokens and user-defined ones as
    added tokens, matched before the model as llama.cpp matches them."""
    from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers
    from transformers.integrations.ggml import convert_gguf_tokenizer

    from ..families import GGUF_BPE, GGUF_SENTENCEPIECE, gguf_pre

    # transformers' converters by its own keys, which are llama.cpp's names of the two vocabularies
    spm = text.model == GGUF_SENTENCEPIECE
    try:
        tok, _ = convert_gguf_tokenizer(GGUF_SENTENCEPIECE if spm else GGUF_BPE, _converter_input(gf, text))
    except Exception as e:  # noqa: BLE001 - the tokenizers library raises its own bare Exception
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        raise GGUFError(f"{gf.path}: transformers cannot convert its tokenizer ({type(e).__name__}: {first})") from None
    if spm:
        return tok
    pre = gguf_pre(text.pre) or DEFAULT_PRE
    steps = [pre_tokenizers.Digits(individual_digits=True)] if pre.digits else []
    if pre.split is not None:
        steps += [pre_tokenizers.Split(Regex(pre.split), behavior="isolated"),
                  pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    else:
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps) if len(steps) > 1 else steps[0]
    tok.normalizer = normalizers.NFC() if pre.nfc else None
    tok.decoder = decoders.ByteLevel()
    if pre.ignore_merges:
        model = json.loads(tok.to_str())
        model["model"]["ignore_merges"] = True
        from tokenizers import Tokenizer

        tok = Tokenizer.from_str(json.dumps(model))
    specials = [AddedToken(t, normalized=False, special=True) for t, k in zip(text.tokens, text.token_types)
                if k == CONTROL]
    user = [AddedToken(t, normalized=False, special=False) for t, k in zip(text.tokens, text.token_types)
            if k == USER_DEFINED]
    tok.add_special_tokens(specials)
    tok.add_tokens(user)
    return tok


def write_text_files(gf: GGUFFile, text: GGUFText, folder: str, context: int) -> GGUFText:
    """Write the tokenizer files and generation_config.json into `folder` (`context`: the model's context length, the
    tokenizer's model_max_length); returns `text` with its EOS ids filled."""
    from transformers import PreTrainedTokenizerFast

    backend = backend_tokenizer(gf, text)
    post = _post_processor(text)
    if post is not None:  # else the converter's own (none, or byte-level offsets: nothing added)
        backend.post_processor = post
    specials = {f"{k}_token": text.token(i) for k, i in (("bos", text.bos), ("eos", text.eos), ("unk", text.unk),
                                                          ("pad", text.pad)) if i is not None}
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, chat_template=text.chat_template,
                                  clean_up_tokenization_spaces=False, model_max_length=context, **specials)
    tok.save_pretrained(folder, save_jinja_files=False)
    eot = text.eot if text.eot is not None else (_end_of_turn(folder, text) if text.chat_template else None)
    text.eos_ids = list(dict.fromkeys(i for i in (text.eos, eot) if i is not None))
    gen = {"bos_token_id": text.bos, "eos_token_id": text.eos_ids[0] if len(text.eos_ids) == 1 else text.eos_ids,
           "pad_token_id": text.pad}
    with open(os.path.join(folder, "generation_config.json"), "w", encoding="utf-8") as f:
        json.dump({k: v for k, v in gen.items() if v is not None and v != []}, f, indent=2)
        f.write("\n")
    return text
