"""Verbatim excerpts of the peers' Metal sources: the top-level declarations their kernels need.

A source file is split into top-level chunks (a preprocessor line, or a declaration /
definition up to its closing ';' or '}' at brace depth 0, with the comments before it).
`select(path, keep)` returns the text of the chunks for which `keep(chunk_text)` is true,
each preceded by a `#line` directive naming the original file and line, so the
translated CUDA and nvcc's messages point at the upstream source. Nothing inside a
chunk is changed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Chunk:
    text: str
    line: int  # 1-based line of the chunk's first character


def chunks(source: str) -> list[Chunk]:
    out: list[Chunk] = []
    i, n = 0, len(source)
    start, depth, paren = 0, 0, 0
    line = 1
    start_line = 1

    def flush(end: int):
        nonlocal start, start_line
        text = source[start:end]
        if text.strip():
            # the chunk starts at its first non-blank line
            lead = len(text) - len(text.lstrip("\n \t"))
            skipped = text[:lead].count("\n")
            out.append(Chunk(text.strip("\n"), start_line + skipped))
        start = end
        start_line = line

    at_line_start = True
    while i < n:
        c = source[i]
        if c == "\n":
            line += 1
            at_line_start = True
            i += 1
            continue
        if at_line_start and c in " \t":
            i += 1
            continue
        if at_line_start and c == "#" and depth == 0 and paren == 0:
            # a preprocessor line (with continuations) is a chunk of its own
            flush(i)
            j = i
            while True:
                k = source.find("\n", j)
                if k == -1:
                    k = n
                if source[k - 1] == "\\" and k < n:
                    j = k + 1
                    line += 1
                    continue
                break
            i = k
            flush(i)
            continue
        at_line_start = False
        if source.startswith("//", i):
            k = source.find("\n", i)
            i = n if k == -1 else k
            continue
        if source.startswith("/*", i):
            k = source.find("*/", i) + 2
            line += source.count("\n", i, k)
            i = k
            continue
        if c in "\"'":
            j = i + 1
            while source[j] != c:
                j += 2 if source[j] == "\\" else 1
            i = j + 1
            continue
        if c == "(":
            paren += 1
        elif c == ")":
            paren -= 1
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0 and paren == 0 and _ends_at_brace(source[start:i]):
                # a function (or namespace) definition ends here; a ';' right after belongs to it
                j = i + 1
                while j < n and source[j] in " \t":
                    j += 1
                if j < n and source[j] == ";":
                    i = j
                else:
                    i += 1
                    flush(i)
                    continue
        elif c == ";" and depth == 0 and paren == 0:
            i += 1
            flush(i)
            continue
        i += 1
    flush(n)
    return out


def _ends_at_brace(text: str) -> bool:
    """Whether a top-level '{...}' closes the declaration: a function or namespace body, not a class
    (typedef struct {...} name;) or an initializer (T x = {...};), which end at their ';'."""
    decl = head(text).strip()
    while decl.startswith("template"):
        # drop `template <...>`
        depth, k = 0, decl.find("<")
        if k < 0:
            break
        for j in range(k, len(decl)):
            depth += {"<": 1, ">": -1}.get(decl[j], 0)
            if depth == 0:
                decl = decl[j + 1:].strip()
                break
        else:
            break
    first = re.match(r"\w+", decl)
    if first and first.group(0) in ("typedef", "struct", "class", "union", "enum"):
        return False
    return "=" not in re.sub(r"\([^()]*\)", "", decl) or decl.startswith("namespace")


def select(path: Path, keep, label: str | None = None) -> str:
    """The chunks of `path` that `keep` accepts, each under a #line directive."""
    parts = []
    name = label or path.name
    for ch in chunks(path.read_text()):
        if keep(ch.text):
            parts.append(f'#line {ch.line} "{name}"\n{ch.text}\n')
    return "\n".join(parts)


def code(text: str) -> str:
    """The chunk without comments."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def head(text: str) -> str:
    """A chunk's declarator part: its code up to the first '{' (or all of it)."""
    body = code(text)
    k = body.find("{")
    return body if k < 0 else body[:k]
