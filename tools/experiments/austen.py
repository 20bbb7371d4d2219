"""English prose for the real-model study, offline from a Debian package: Jane Austen's six novels as shipped in
`r-cran-janeaustenr` (Debian main; the R package janeaustenr 1.0.0 by Julia Silge, MIT; the novels' text is Project
Gutenberg's, in the public domain).

    path = fetch_novels(cache)          # apt-get download + SHA-256 check + dpkg -x, once; then novels.json is reused
    novels = load_novels(path)          # {book: [lines]}
    docs = chapters(novels)             # [Chapter(book, index, text)]: one document per chapter
    train, held = split_documents(docs) # by document: every HELD_EVERY-th chapter of each novel is held out

The package stores the novels as R objects in a lazy-load database (data/Rdata.rdb, indexed by data/Rdata.rdx): each
entry is a 4-byte big-endian length and a zlib stream of R's serialization format (version 2 or 3, XDR), the index a
gzip-compressed serialization of a named list (variables: name -> (offset, length)). `read_lazy_load_db` reads them
with `unserialize`, a reader of that format for the object types these files hold (character, integer, logical,
double vectors, lists, pairlists with tags and attributes, symbols and references); R itself is not needed.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
import zlib
from dataclasses import dataclass
from typing import Dict, List, Tuple

__all__ = ["PACKAGE", "VERSION", "SHA256", "TextSourceError", "unserialize", "read_lazy_load_db", "fetch_novels",
           "load_novels", "Chapter", "chapters", "split_documents", "HELD_EVERY", "PROVENANCE"]

PACKAGE, VERSION = "r-cran-janeaustenr", "1.0.0-1"
SHA256 = "df6bddf211906d1ff404f8ff662c21b34e6660e7f54a311084e749050c019c95"
DATA = "usr/lib/R/site-library/janeaustenr/data/Rdata"
COPYRIGHT = "usr/share/doc/r-cran-janeaustenr/copyright"
HELD_EVERY, HELD_OFFSET = 10, 4  # chapter k of a novel (0-based) is held out when k % 10 == 4
PROVENANCE = (f"Debian package {PACKAGE} {VERSION} (section gnu-r; `apt-get download {PACKAGE}` + `dpkg -x`, SHA-256 "
              f"{SHA256[:16]}...): the R package janeaustenr 1.0.0 (Julia Silge, MIT licence), whose data are the "
              "six novels of Jane Austen from Project Gutenberg (public domain)")


class TextSourceError(RuntimeError):
    """The text could not be fetched or read; the message is one line."""


# --- R's serialization format (R Internals, "Serialization Formats"), XDR flavour ---------------------------------

NILVALUE, REFSXP = 254, 255
SPECIAL_NIL = {242, 241, 253, 251, 247, 254}  # empty / base / global env, missing arg, base namespace, NULL
SYMSXP, LISTSXP, CHARSXP, LGLSXP, INTSXP, REALSXP, STRSXP, VECSXP = 1, 2, 9, 10, 13, 14, 16, 19
NA_INTEGER = -(2 ** 31)


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.pos, self.refs = data, 0, []

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise TextSourceError(f"R serialization: truncated at byte {self.pos} (wanted {n} more)")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def int(self) -> int:
        return struct.unpack(">i", self.take(4))[0]

    def length(self) -> int:
        n = self.int()
        if n == -1:  # long vector: two more ints
            hi, lo = self.int(), self.int()
            n = (hi << 32) + (lo & 0xFFFFFFFF)
        return n


def _attributes(r: _Reader) -> dict:
    pairs = _item(r)  # a pairlist read as [(tag, value)]
    return dict(pairs) if isinstance(pairs, list) else {}


def _item(r: _Reader):
    flags = r.int()
    kind, has_attr, has_tag = flags & 0xFF, bool(flags & (1 << 9)), bool(flags & (1 << 10))
    if kind in SPECIAL_NIL:
        return None
    if kind == REFSXP:
        index = flags >> 8 or r.int()
        return r.refs[index - 1]
    if kind == SYMSXP:
        name = _item(r)  # a CHARSXP
        r.refs.append(name)
        return name
    if kind == LISTSXP:  # pairlist: [attributes] [tag] car cdr -> [(tag, value), ...]
        out = []
        while kind == LISTSXP:
            if has_attr:
                _attributes(r)
            tag = _item(r) if has_tag else None
            out.append((tag, _item(r)))
            flags = r.int()
            kind, has_attr, has_tag = flags & 0xFF, bool(flags & (1 << 9)), bool(flags & (1 << 10))
        if kind not in SPECIAL_NIL:
            raise TextSourceError(f"R serialization: pairlist ends in type {kind}, expected NULL")
        return out
    if kind == CHARSXP:
        n = r.int()
        latin1 = bool((flags >> 12) & (1 << 2))  # the LATIN1 mark in the levels; UTF-8 / ASCII / native otherwise
        return None if n == -1 else r.take(n).decode("latin-1" if latin1 else "utf-8")
    if kind in (LGLSXP, INTSXP):
        n = r.length()
        values = [None if v == NA_INTEGER else v for v in struct.unpack(f">{n}i", r.take(4 * n))]
    elif kind == REALSXP:
        n = r.length()
        values = list(struct.unpack(f">{n}d", r.take(8 * n)))
    elif kind in (STRSXP, VECSXP):
        values = [_item(r) for _ in range(r.length())]
    else:
        raise TextSourceError(f"R serialization: object type {kind} at byte {r.pos - 4} is not supported")
    attrs = _attributes(r) if has_attr else {}
    names = attrs.get("names")
    if kind == VECSXP and isinstance(names, list) and len(names) == len(values):
        return dict(zip(names, values))
    return values


def unserialize(data: bytes):
    """An R object from R's XDR serialization (versions 2 and 3): character / integer / logical / double vectors as
    lists (NA as None), a list with names as a dict, a pairlist as [(tag, value)]."""
    r = _Reader(data)
    if r.take(2) != b"X\n":
        raise TextSourceError("R serialization: not the XDR format (expected the header 'X\\n')")
    version = r.int()
    r.int(), r.int()  # the writer's R version, the minimal reader version
    if version == 3:
        r.take(r.int())  # the native encoding's name
    elif version != 2:
        raise TextSourceError(f"R serialization: version {version}, expected 2 or 3")
    return _item(r)


def read_lazy_load_db(rdb: bytes, rdx: bytes) -> Dict[str, object]:
    """{name: object} of an R lazy-load database (the .rdb bytes and its .rdx index)."""
    try:
        index = unserialize(gzip.decompress(rdx) if rdx[:2] == b"\x1f\x8b" else zlib.decompress(rdx[4:]))
    except (OSError, zlib.error) as e:
        raise TextSourceError(f"lazy-load index: cannot decompress ({e})") from None
    if not isinstance(index, dict) or not isinstance(index.get("variables"), dict):
        raise TextSourceError("lazy-load index: no 'variables' list")
    out = {}
    for name, (offset, length) in index["variables"].items():
        blob = rdb[offset:offset + length]
        if len(blob) != length or length < 5:
            raise TextSourceError(f"lazy-load database: entry {name} ({offset}+{length}) is past the file's end")
        try:
            raw = zlib.decompress(blob[4:])
        except zlib.error as e:
            raise TextSourceError(f"lazy-load database: entry {name} is not zlib data ({e}); only R's default "
                                  "compression is read") from None
        if len(raw) != struct.unpack(">I", blob[:4])[0]:
            raise TextSourceError(f"lazy-load database: entry {name} has the wrong length after decompression")
        out[name] = unserialize(raw)
    return out


# --- the package -------------------------------------------------------------------------------------------------

def fetch_novels(cache: str, log=print) -> str:
    """cache/novels.json ({book: [lines]}) and cache/copyright, from the Debian package (downloaded with apt-get,
    checked against SHA256, unpacked with dpkg -x) the first time; the path of novels.json."""
    out = os.path.join(cache, "novels.json")
    if os.path.isfile(out):
        return out
    os.makedirs(cache, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".austen-", dir=cache)
    try:
        log(f"[text] apt-get download {PACKAGE}={VERSION} into {cache}")
        r = subprocess.run(["apt-get", "download", f"{PACKAGE}={VERSION}"], cwd=tmp, capture_output=True, text=True)
        debs = [f for f in os.listdir(tmp) if f.endswith(".deb")]
        if r.returncode != 0 or not debs:
            last = (r.stderr.strip().splitlines() or ["?"])[-1]
            raise TextSourceError(f"apt-get download {PACKAGE}={VERSION} failed ({last}); run `apt-get update` once")
        deb = os.path.join(tmp, debs[0])
        with open(deb, "rb") as f:
            got = hashlib.sha256(f.read()).hexdigest()
        if got != SHA256:
            raise TextSourceError(f"{debs[0]}: SHA-256 {got}, expected {SHA256}; nothing kept")
        subprocess.run(["dpkg", "-x", deb, os.path.join(tmp, "x")], check=True, capture_output=True)
        with open(os.path.join(tmp, "x", DATA + ".rdb"), "rb") as f, open(os.path.join(tmp, "x", DATA + ".rdx"), "rb") as g:
            novels = read_lazy_load_db(f.read(), g.read())
        shutil.copy(os.path.join(tmp, "x", COPYRIGHT), os.path.join(cache, "copyright"))
        with open(os.path.join(tmp, "novels.json"), "w") as f:
            json.dump(novels, f)
        os.replace(os.path.join(tmp, "novels.json"), out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def load_novels(path: str) -> Dict[str, List[str]]:
    with open(path, encoding="utf-8") as f:
        novels = json.load(f)
    if not isinstance(novels, dict) or not all(isinstance(v, list) for v in novels.values()):
        raise TextSourceError(f"{path}: expected {{book: [lines]}}")
    return {k: [line or "" for line in v] for k, v in novels.items()}


# --- documents ---------------------------------------------------------------------------------------------------

CHAPTER_RE = re.compile(r"^\s*chapter\s+([0-9]+|[ivxlcdm]+)\b\.?\s*$", re.IGNORECASE)
HEADING_RE = re.compile(r"^\s*(volume|vol\.)\s+([0-9]+|[ivxlcdm]+)\b.*$|^\s*(the\s+)?end\.?\s*$", re.IGNORECASE)


@dataclass
class Chapter:
    book: str
    index: int  # 0-based chapter number within the book
    text: str  # paragraphs joined by blank lines, each paragraph's lines by spaces


def _paragraphs(lines: List[str]) -> str:
    paras, cur = [], []
    for line in lines:
        if line.strip():
            if not HEADING_RE.match(line):
                cur.append(line.strip())
        elif cur:
            paras.append(" ".join(cur))
            cur = []
    if cur:
        paras.append(" ".join(cur))
    return "\n\n".join(paras)


def chapters(novels: Dict[str, List[str]]) -> List[Chapter]:
    """One document per chapter (a 'CHAPTER I' / 'Chapter 1' heading line starts one; the title pages before the
    first chapter are dropped, and so are volume headings), books in sorted order."""
    out = []
    for book in sorted(novels):
        current = None
        for line in novels[book]:
            if CHAPTER_RE.match(line):
                if current is not None:
                    out.append(Chapter(book, len([c for c in out if c.book == book]), _paragraphs(current)))
                current = []
            elif current is not None:
                current.append(line)
        if current is not None:
            out.append(Chapter(book, len([c for c in out if c.book == book]), _paragraphs(current)))
    return [c for c in out if c.text]


def split_documents(docs: List[Chapter]) -> Tuple[List[Chapter], List[Chapter]]:
    """(train, held-out) by document: chapter k of each book is held out when k % HELD_EVERY == HELD_OFFSET."""
    held = [d for d in docs if d.index % HELD_EVERY == HELD_OFFSET]
    return [d for d in docs if d.index % HELD_EVERY != HELD_OFFSET], held
