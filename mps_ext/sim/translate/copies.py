"""Objects copied by value out of the device, constant and threadgroup address spaces.

MSL makes a thread-space copy wherever an object is initialized from one in another space: a new variable
(`S s = buf[i];`, `S s(buf[i]);`, `S s{buf[i]};`), a parameter taken by value (`f(buf[i])`), a value
returned (`return buf[i];`) and a functional cast (`S(buf[i])`). C++'s implicit copy constructor binds
thread-space objects only, and a constructor of the translator's own would take away a struct's aggregate
initialization, so each of these initializers is wrapped in MTLSIM_COPY (mtlsim/address_space.h), which
copies an object of another space and leaves every other expression as it is. The shim's own types (built-in types here) have constructors
for objects in every space and need no wrapping."""

from __future__ import annotations

from .rules import _CONCRETE_TYPE
from .stream import _TokenStream
from .tokens import _CLOSE, _OPEN, split_parameters

# What may stand between a function's parameters and its body.
_FUNCTION_QUALIFIERS = {"const", "volatile", "thread", "device", "constant", "threadgroup", "&", "&&", "noexcept",
                        "override", "final"}
# What may precede a function's return type; none of it is the type.
_SPECIFIERS = {"static", "inline", "constexpr", "METAL_FUNC", "const", "volatile", "thread", "typename", "struct",
               "class", "union", "metal", "::", "friend", "explicit"}
_STATEMENTS = {"if", "while", "for", "switch", "catch", "return", "sizeof", "alignof", "decltype", "static_assert"}
# Tokens after which `name(` is a call, not a declaration (which has a type before its name).
_BEFORE_CALL = {"=", "(", ",", "return", "{", "}", ";", ".", "->", "+", "-", "/", "%", "?", ":", "!", "[", "==",
                "!=", "<=", ">=", "&&", "||", "+=", "-=", "*=", "/=", "|", "^", "~"}


class _Copies(_TokenStream):
    def by_value_copies(self) -> None:
        """Wraps each initializer that MSL copies by value (see the module's docstring)."""
        structs = {self.text(k + 1) for k in range(len(self.t) - 1)
                   if self.text(k) in ("struct", "class", "union") and self.t[k + 1].kind == "id"}
        takes = self.by_value_parameters()
        scopes: list[bool | None] = []  # per open brace: None outside functions, else whether `return` copies
        for i, tok in enumerate(self.t):
            s = tok.text
            if s == "{":
                head = self.function_head(i)
                scopes.append(head[1] if head else (scopes[-1] if scopes else None))
            elif s == "}" and scopes:
                scopes.pop()
            elif s == "return" and scopes and scopes[-1] and self.text(i + 1) not in (";", "{"):
                end, depth = i + 1, 0
                while end < len(self.t) and not (depth == 0 and self.text(end) == ";"):
                    depth += (self.text(end) in _OPEN) - (self.text(end) in _CLOSE)
                    end += 1
                self.wrap(i, end)
            elif s in structs and self.text(i - 1) not in ("::", ".", "->"):
                self.declared_copy(i, in_function=bool(scopes) and scopes[-1] is not None)
            elif s in takes and s not in structs and self.is_call(i):
                self.argument_copies(i, takes[s])

    def wrap(self, before: int, after: int) -> None:
        """Wraps the tokens strictly between ``before`` and ``after`` in MTLSIM_COPY."""
        self.out[before] = self.emitted(before) + self.code("MTLSIM_COPY (", before)
        self.out[after] = [self.new(")", after), *self.emitted(after)]

    def declared_copy(self, i: int, in_function: bool) -> None:
        """``S s = X;``, ``S s{X};``, and in a function (where these declare no function) ``S s(X);`` and the
        functional casts ``S(X)``, ``S{X}`` in an expression."""
        k = self.matching_angle(i + 1) + 1 if self.text(i + 1) == "<" else i + 1
        if in_function and self.text(k) in ("(", "{") and self.text(i - 1) in _BEFORE_CALL - {"{", "}", ";", ":"}:
            args = self.arguments(k)
            if args is not None and len(args) == 1 and not self.declares(*args[0]):
                self.wrap(k, args[0][1])
            return
        j = i - 1
        while self.text(j) in ("const", "thread", "struct", "class", "union"):
            j -= 1
        if self.text(j) not in (";", "{", "}", ":") or self.t[k].kind != "id":
            return  # not a declaration statement, or a constant one (program scope, static)
        opener = self.text(k + 1)
        if opener == "=" and self.text(k + 2) != "{":
            end, depth, angles = k + 2, 0, False
            while end < len(self.t) and not (depth == 0 and self.text(end) in (";", ",")):
                depth += (self.text(end) in _OPEN) - (self.text(end) in _CLOSE)
                angles |= depth == 0 and self.text(end) in ("<", ">", ">>")
                end += 1
            if end < len(self.t) and not (angles and self.text(end) == ","):  # (a comma of template arguments)
                self.wrap(k + 1, end)
        elif opener == "{" or (opener == "(" and in_function):
            args = self.arguments(k + 1)
            if args is not None and len(args) == 1 and not self.declares(*args[0]):
                self.wrap(k + 1, args[0][1])

    def declares(self, start: int, end: int) -> bool:
        """Whether tokens start..end read as a parameter (a type, then a name): ``S f(T x);``."""
        return end - start >= 2 and self.t[start].kind == "id" and self.t[start + 1].kind == "id"

    def arguments(self, open_: int) -> list[tuple[int, int]] | None:
        """(start, end) of each argument between the bracket at ``open_`` and its match, or None when an
        argument cannot be told apart with certainty (template arguments, a braced list, nothing)."""
        close = self.match(open_, self.text(open_), ")" if self.text(open_) == "(" else "}")
        args, start, depth = [], open_ + 1, 0
        for k in range(open_ + 1, close + 1):
            s = self.text(k)
            if depth == 0 and s in ("<", ">", ">>"):
                return None  # a comma may separate template arguments here
            if k == close or (depth == 0 and s == ","):
                if k == start or self.text(start) == "{":
                    return None
                args.append((start, k))
                start = k + 1
            else:
                depth += (s in _OPEN) - (s in _CLOSE)
        return args

    def is_call(self, i: int) -> bool:
        """Whether the name at i, followed by '(', is called (not declared)."""
        if self.text(i + 1) != "(":
            return False
        j = i - 1
        while self.text(j) == "::" and self.t[j - 1].kind == "id":
            j -= 2
        return self.text(j) in _BEFORE_CALL

    def argument_copies(self, i: int, positions: set[int]) -> None:
        args = self.arguments(i + 1)
        for n, (start, end) in enumerate(args or []):
            if n in positions:
                self.wrap(start - 1, end)

    def function_head(self, brace: int) -> tuple[str, bool] | None:
        """(name, whether it returns by value an object that may be a struct: not a built-in type, void or a
        reference) of the function whose body opens at ``brace``; None for other braces."""
        j = brace - 1
        while self.text(j) in _FUNCTION_QUALIFIERS:
            j -= 1
        if self.text(j) != ")":
            return None
        open_ = self.matching_paren_back(j)
        name_at = open_ - 1
        operator = next((k for k in range(open_ - 1, max(open_ - 4, -1), -1) if self.text(k) == "operator"), None)
        if operator is not None:
            name_at = operator
        elif self.t[name_at].kind != "id" or self.text(name_at) in _STATEMENTS:
            return None
        start = name_at
        while self.text(start - 1) == "::" and self.t[start - 2].kind == "id":
            start -= 2
        k = start - 1
        while k >= 0 and self.text(k) not in (";", "{", "}", ")", "]", ":", ","):
            if self.text(k) in (">", ">>"):
                if self.text(self.matching_angle_back(k) - 1) == "template":
                    break
                k = self.matching_angle_back(k)
            k -= 1
        kind = [self.text(m) for m in range(k + 1, start) if self.text(m) not in _SPECIFIERS]
        by_value = bool(kind) and not {"&", "&&", "void"} & set(kind) and "decltype" not in kind and \
            not _CONCRETE_TYPE.fullmatch(kind[0])
        return self.text(name_at), by_value

    def matching_paren_back(self, close: int) -> int:
        depth = 0
        for j in range(close, -1, -1):
            depth += {")": 1, "(": -1}.get(self.text(j), 0)
            if depth == 0:
                return j
        self.err(close, "unbalanced ')'")

    def by_value_parameters(self) -> dict[str, set[int]]:
        """Function name -> the positions at which every definition of that name takes an object of a class
        (or a template parameter) by value."""
        found: dict[str, list[list[bool]]] = {}
        for i, tok in enumerate(self.t):
            if tok.text != "{":
                continue
            head = self.function_head(i)
            if head is None:
                continue
            j = i - 1
            while self.text(j) in _FUNCTION_QUALIFIERS:
                j -= 1
            found.setdefault(head[0], []).append(self.parameters_by_value(self.matching_paren_back(j), j))
        takes = {}
        for name, definitions in found.items():
            positions = {n for n in range(max(map(len, definitions)))
                         if all(n < len(d) and d[n] for d in definitions)}
            if positions:
                takes[name] = positions
        return takes

    def parameters_by_value(self, open_: int, close: int) -> list[bool]:
        tokens, k = [], open_ + 1
        while k < close:
            if self.is_attr_start(k):
                k = self.attr_end(k)
                continue
            tokens.append(k)
            k += 1
        params = split_parameters(tokens, self.text)
        result = []
        for param in params:
            words = [self.text(m) for m in param]
            if "=" in words:
                words = words[:words.index("=")]
            if "..." in words:
                return []  # a pack takes the arguments from here on
            kind = [w for w in words[:-1] if w not in _SPECIFIERS]
            result.append(len(words) >= 2 and self.t[param[len(words) - 1]].kind == "id" and bool(kind) and
                          not {"&", "&&", "*", "[", "device", "constant", "threadgroup"} & set(words) and
                          not _CONCRETE_TYPE.fullmatch(kind[0]))
        return result
