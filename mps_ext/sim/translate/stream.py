"""The token stream a translation walks and the replacement it records for each token: reading tokens,
brackets and attributes, and placing generated C++ at a token's ``.metal`` line."""

from __future__ import annotations

from .tokens import _TOKEN, TranslateError, _closing, _Tok


class _TokenStream:
    """What every part of the translator reads and edits through. Tokens are never removed or inserted:
    each keeps its index, and ``out`` says what the translation emits in its place."""

    def __init__(self, tokens: list[_Tok]):
        self.t = tokens
        self.out: list[list[_Tok] | None] = [None] * len(tokens)  # replacement per token; None keeps it
        self.cursor = 0  # where the main pass is: the position named when the translator itself fails

    def err(self, i: int, msg: str):
        raise TranslateError(f"{self.where(i)}: {msg}")

    def where(self, i: int) -> str:
        """``file:line`` of token i (the last token when i is past the end)."""
        if not self.t:
            return "<empty source>:1"
        tok = self.t[max(0, min(i, len(self.t) - 1))]
        return f"{tok.file}:{tok.line}"

    def find(self, i: int, stops, what: str) -> int:
        """Index of the first token from i whose text is in ``stops``; an error at the end of the input."""
        for j in range(i, len(self.t)):
            if self.t[j].text in stops:
                return j
        self.err(i, f"unexpected end of input: expected {what}")

    def text(self, i: int) -> str:
        return self.t[i].text if 0 <= i < len(self.t) else ""

    def is_attr_start(self, i: int) -> bool:
        return self.text(i) == "[" and self.text(i + 1) == "["

    def attr_end(self, i: int) -> int:
        """Index after the ``]]`` closing the attribute specifier at i."""
        depth = 0
        for j in range(i, len(self.t)):
            if self.t[j].text == "[":
                depth += 1
            elif self.t[j].text == "]":
                depth -= 1
                if depth == 0:
                    return j + 1
        self.err(i, "unterminated [[attribute]]")

    def attributes(self, i: int) -> list[tuple[str, list[_Tok]]]:
        """(name, argument tokens) of each attribute in the specifier at i."""
        end = self.attr_end(i)
        inner, attrs, k = self.t[i + 2:end - 2], [], 0
        while k < len(inner):
            if inner[k].text == ",":
                k += 1
                continue
            name = inner[k].text
            k += 1
            while k + 1 < len(inner) and inner[k].text == "::":  # clang::foo
                name += "::" + inner[k + 1].text
                k += 2
            args: list[_Tok] = []
            if k < len(inner) and inner[k].text == "(":
                depth, k = 1, k + 1
                while depth:
                    if k >= len(inner):
                        self.err(i, f"unbalanced '(' in [[{name}]]")
                    depth += {"(": 1, ")": -1}.get(inner[k].text, 0)
                    if depth:
                        args.append(inner[k])
                    k += 1
            attrs.append((name, args))
        return attrs

    def match(self, i: int, open_: str, close: str) -> int:
        """Index of the token closing the bracket opened at i."""
        j = _closing(self.t, i, open_, close)
        if j is None:
            self.err(i, f"unbalanced {open_!r}")
        return j

    def replace(self, i: int, toks: list[_Tok]):
        self.out[i] = toks

    def drop(self, start: int, end: int):
        for k in range(start, end):
            self.out[k] = []

    def new(self, text: str, at: int, kind: str = "punct") -> _Tok:
        ref = self.t[at]
        return _Tok(text, kind, ref.file, ref.line)

    def code(self, source: str, at: int) -> list[_Tok]:
        """Tokens of generated C++ placed at the line of token ``at``."""
        ref = self.t[at]
        return [_Tok(m.group(m.lastgroup), m.lastgroup, ref.file, ref.line)
                for m in _TOKEN.finditer(source) if m.lastgroup != "ws"]

    def site(self, at: int) -> str:
        tok = self.t[at]
        return f'::mtlsim::Site{{{_c_string(tok.file)}, {tok.line}, 0}}'

    def matching_angle(self, open_: int) -> int:
        """Index of the '>' closing the template argument list opened at ``open_``."""
        depth, j = 0, open_
        while j < len(self.t):
            s = self.t[j].text
            if s == "<" and (j == open_ or not (self.text(j - 1) == ")" or self.t[j - 1].kind == "num")):
                depth += 1  # (after ')' or a number, '<' compares: `enable_if_t<sizeof(T) < 8>`)
            elif s in (">", ">>"):
                depth -= len(s)
                if depth <= 0:
                    return j
            elif s in ("(", "["):
                j = self.match(j, s, ")" if s == "(" else "]")
            j += 1
        self.err(open_, "unbalanced '<'")

    def inside_attribute(self, start: int, k: int) -> bool:
        depth = 0
        for j in range(start, k):
            depth += {"[": 1, "]": -1}.get(self.t[j].text, 0)
        return depth > 0

    def matching_angle_back(self, close: int) -> int:
        depth = 0
        for j in range(close, -1, -1):
            s = self.t[j].text
            if s in (">", ">>"):
                depth += len(s)
            elif s == "<":
                depth -= 1
                if depth == 0:
                    return j
        self.err(close, "unbalanced '>'")

    def emitted(self, i: int) -> list[_Tok]:
        """What the translation emits for token i so far."""
        return self.out[i] if self.out[i] is not None else [self.t[i]]

    def translated(self, start: int, stop: int) -> str:
        """Tokens start..stop as the translation emits them (after every rewrite)."""
        return " ".join(t.text for k in range(start, stop) for t in self.emitted(k))

    def callee(self, i: int) -> str:
        """The name before the parenthesis that encloses token i."""
        depth = 0
        for j in range(i - 1, -1, -1):
            s = self.text(j)
            depth += {")": 1, "(": -1}.get(s, 0)
            if depth < 0:
                return self.text(j - 1)
        return ""


def _c_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
