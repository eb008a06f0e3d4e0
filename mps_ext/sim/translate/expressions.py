"""MSL expressions that C++ would read differently, rewritten on token lists: the arms of a conditional,
cast to the type MSL gives it, and half and unsuffixed floating literals."""

from __future__ import annotations

import re

from .tokens import _CLOSE, _OPEN, _TOKEN, _closing, _template_args_end, _Tok

_DECIMAL_FLOAT = re.compile(r"(?:\d[\d']*\.[\d']*|\.\d[\d']*)(?:[eE][+-]?\d+)?|\d[\d']*[eE][+-]?\d+")
_HEX_FLOAT = re.compile(r"0[xX][\da-fA-F.']*[pP][+-]?\d+")


def _operand_end(toks: list[_Tok], i: int, middle: bool) -> int | None:
    """Index after the middle operand (the ``:`` itself) or the last operand of a conditional starting at i."""
    depth = nested = 0
    j = i
    while j < len(toks):
        t = toks[j].text
        if t == "<" and depth == 0:
            end = _template_args_end(toks, j)
            if end is not None:
                j = end + 1
                continue
        if t in _OPEN:
            depth += 1
        elif t in _CLOSE:
            if depth == 0:
                return None if middle else j
            depth -= 1
        elif depth == 0:
            if t == "?":
                nested += 1
            elif t == ":":
                if nested == 0:
                    return j
                nested -= 1
            elif t in (",", ";") and not middle:
                return j
            elif t == ";":
                return None
        j += 1
    return None if middle else j


_ARM_CAST = ("static_cast<::mtlsim::cond_t<decltype((", ")), decltype((", "))>>(", ")")


def _arm_cast(arm: list[_Tok], other: list[_Tok], at: _Tok) -> list[_Tok]:
    """``static_cast<::mtlsim::cond_t<decltype((arm)), decltype((other))>>(arm)``, at the line of ``at``."""
    a, b, c, d = ([_Tok(m.group(m.lastgroup), m.lastgroup, at.file, at.line)
                   for m in _TOKEN.finditer(piece) if m.lastgroup != "ws"] for piece in _ARM_CAST)
    return [*a, *arm, *b, *other, *c, *arm, *d]


def _bare_greater(toks: list[_Tok], i: int, end: int) -> bool:
    """Whether toks[i:end] has a ``>`` or ``>>`` outside brackets and outside template arguments."""
    depth, j = 0, i
    while j < end:
        t = toks[j].text
        if t == "<" and depth == 0:
            close = _template_args_end(toks, j)
            if close is not None:
                j = close + 1
                continue
        depth += (t in _OPEN) - (t in _CLOSE)
        if depth == 0 and t in (">", ">>"):
            return True
        j += 1
    return False


def _cast_conditional_arms(toks: list[_Tok]) -> list[_Tok]:
    """``c ? x : y`` with each arm cast to ``mtlsim::cond_t`` of both arms' types (see mtlsim/conditional.h):
    MSL's rules for the value types that are classes in the simulator."""
    out: list[_Tok] = []
    i = 0
    while i < len(toks):
        tok = toks[i]
        if tok.text == "[" and i + 1 < len(toks) and toks[i + 1].text == "[":  # attributes stay as written
            end = _closing(toks, i, "[", "]")
            out += toks[i:(end if end is not None else len(toks) - 1) + 1]
            i = (end if end is not None else len(toks) - 1) + 1
            continue
        colon = _operand_end(toks, i + 1, True) if tok.text == "?" else None
        if colon is None or colon == i + 1:  # not a conditional, or GNU `a ?: b`
            out.append(tok)
            i += 1
            continue
        end = _operand_end(toks, colon + 1, False)
        if _bare_greater(toks, colon + 1, end):
            # `c ? a : b > x` inside template arguments ends them at the `>`; elsewhere it compares. Which one
            # is unknown here, so the conditional stays as written (its arms are then rarely MSL value types).
            out.append(tok)
            i += 1
            continue
        middle = _cast_conditional_arms(toks[i + 1:colon])
        last = _cast_conditional_arms(toks[colon + 1:end])
        out += [tok, *_arm_cast(middle, last, tok), toks[colon], *_arm_cast(last, middle, toks[colon])]
        i = end
    return out


def _number(tok: _Tok) -> list[_Tok]:
    """Half literals become half(); unsuffixed floating literals become float, as in MSL."""
    text = tok.text
    body = text.rstrip("fFhHlL")
    suffix = text[len(body):]
    if not (_DECIMAL_FLOAT.fullmatch(body) or _HEX_FLOAT.fullmatch(body)):
        return [tok]
    if suffix.lower() == "h":
        return [_Tok("half", "id", tok.file, tok.line), _Tok("(", "punct", tok.file, tok.line),
                _Tok(body + "f", "num", tok.file, tok.line), _Tok(")", "punct", tok.file, tok.line)]
    if not suffix:
        return [_Tok(body + "f", "num", tok.file, tok.line)]
    return [tok]
