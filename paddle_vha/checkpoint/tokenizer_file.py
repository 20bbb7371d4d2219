"""A checkpoint's tokenizer.json opened by the tokenizers library, defensively: a file it cannot load, and one that
loads but panics when used (the library's Rust panics are Python BaseExceptions, e.g. a continuing_subword_prefix
longer than the tokens it is cut from), become one-line errors of the caller's type. Used by everything that reads
tokenizer.json (serve/text.py's codec, transform/text.py's calibration text)."""
from __future__ import annotations

__all__ = ["open_tokenizer", "guarded", "PROBE"]

PROBE = "Hello, world! 12 + 30 = 42.\n"  # encoded and decoded once at load: a tokenizer that cannot run fails here


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__


def guarded(fn, path: str, what: str, error):
    """fn, with any failure of the library (a panic included; not Ctrl-C) as error("PATH: the tokenizer fails to
    WHAT (...)")."""
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # noqa: BLE001 - the point: a Rust panic is a BaseException
            raise error(f"{path}: the tokenizer fails to {what} ({type(e).__name__}: {_first_line(e)})") from None
    return call


def open_tokenizer(path: str, error):
    """tokenizers.Tokenizer of `path`, loaded and probed (PROBE encoded and decoded); error (one line) otherwise."""
    from tokenizers import Tokenizer

    tok = guarded(Tokenizer.from_file, path, "load", error)(path)
    ids = guarded(tok.encode, path, "encode", error)(PROBE, add_special_tokens=False).ids
    guarded(tok.decode, path, "decode", error)(ids, skip_special_tokens=False)
    return tok
