"""MSL's language rules that a C++ compiler would not enforce, and the facts about MSL's attributes
and types that the rules and the rewriting share. Each error names its rule and the .metal line;
docs/msl_rules.md is the checklist."""

from __future__ import annotations

import re

from .tokens import (_CLOSE, _OPEN, TranslateError, _closing, _Tok, needs_version, split_parameters,
                     version_name)

# `device`, `constant` and `threadgroup` stay: the simulator's prelude defines them (distinct
# types under clang, see mtlsim/address_space.h). `thread` is the default address space.
_ERASED_ADDRESS_SPACES = {"thread", "threadgroup_imageblock", "ray_data", "object_data"}
# Attributes that mean the same in C++ and stay.
_STANDARD_ATTRIBUTES = {"maybe_unused", "likely", "unlikely", "fallthrough", "nodiscard", "noreturn", "deprecated"}
# MSL: these must all be scalars, or vectors of one size, within a kernel.
_POSITION_ATTRIBUTES = {"thread_position_in_grid", "threads_per_grid", "thread_position_in_threadgroup",
                        "threads_per_threadgroup", "threadgroup_position_in_grid", "dispatch_threads_per_threadgroup",
                        "threadgroups_per_grid"}
# Attributes on kernel parameters the simulator does not bind. (A parameter's [[function_constant(c)]]
# makes it optional: it keeps its [[buffer(n)]] binding, which the host leaves empty when c is false.)
_UNSUPPORTED_ATTRIBUTES = {"stage_in", "texture", "sampler", "visible_function_table"}
# MSL: these are uint or ushort scalars.
_INDEX_ATTRIBUTES = {"thread_index_in_threadgroup", "thread_index_in_simdgroup", "thread_index_in_quadgroup",
                     "simdgroup_index_in_threadgroup", "quadgroup_index_in_threadgroup", "threads_per_simdgroup",
                     "simdgroups_per_threadgroup", "quadgroups_per_threadgroup", "thread_execution_width",
                     "dispatch_simdgroups_per_threadgroup", "dispatch_quadgroups_per_threadgroup"}
# MSL 5.2.3.6: attributes declared with the same type when a kernel declares more than one of a group.
_MATCHING_ATTRIBUTES = (("thread_position_in_grid", "threads_per_grid"),
                        ("threadgroup_position_in_grid", "threadgroups_per_grid"),
                        ("thread_index_in_simdgroup", "threads_per_simdgroup", "thread_execution_width"),
                        ("simdgroup_index_in_threadgroup", "simdgroups_per_threadgroup"),
                        ("quadgroup_index_in_threadgroup", "quadgroups_per_threadgroup"))
_BUILTIN_ATTRIBUTES = _POSITION_ATTRIBUTES | _INDEX_ATTRIBUTES
_INDEX_TYPES = {"uint", "ushort", "uint32_t", "uint16_t", "unsigned int", "unsigned short"}
_POSITION_TYPES = _INDEX_TYPES | {f"{t}{n}" for t in ("uint", "ushort") for n in (2, 3)} | {
    f"vec<{t},{n}>" for t in ("uint", "ushort", "uint32_t", "uint16_t") for n in (2, 3)}


_ADDRESS_SPACE_WORDS = _ERASED_ADDRESS_SPACES | {"device", "threadgroup", "constant"}
_FORBIDDEN_KEYWORDS = {
    "double": ("no double", "MSL has no double precision type"),
    "new": ("no dynamic allocation", "MSL has no new/delete"),
    "try": ("no exceptions", "MSL has no exception handling"),
    "catch": ("no exceptions", "MSL has no exception handling"),
    "throw": ("no exceptions", "MSL has no exception handling"),
    "virtual": ("no virtual functions", "MSL has no virtual functions"),
    "typeid": ("no RTTI", "MSL has no run-time type identification (typeid)"),
    "dynamic_cast": ("no RTTI", "MSL has no dynamic_cast"),
    "goto": ("no goto", "MSL has no goto"),
    "thread_local": ("no thread_local", "MSL has no thread_local storage"),
    "register": ("no register", "MSL has no register storage class"),
}
_C_LIBRARY = {"printf", "fprintf", "sprintf", "snprintf", "vprintf", "puts", "putchar", "fputs", "fopen", "fclose",
              "fread", "fwrite", "malloc", "calloc", "realloc", "free", "aligned_alloc", "exit", "abort", "atexit",
              "memcpy", "memmove", "memset", "memcmp", "strlen", "strcpy", "strncpy", "strcmp", "strcat", "atoi",
              "atof", "strtol", "strtod", "rand", "srand", "qsort", "bsearch", "time", "clock", "getenv", "system",
              "scanf", "sscanf", "setjmp", "longjmp", "raise", "signal"}
_FUNCTION_CONSTANT_TYPE = re.compile(r"(?:bool|char|uchar|short|ushort|int|uint|long|ulong|half|bfloat|float|"
                                     r"u?int(?:8|16|32|64)_t)[234]?|vec <.*>|unsigned(?: int| short| char)?")
_MATRIX_TYPE = re.compile(r"(?:half|float|bfloat)([234])x([234])")
_VECTOR_TYPE = re.compile(r"(?:packed_)?(?:bool|char|uchar|short|ushort|int|uint|long|ulong|half|bfloat|float)([234])")
# Built-in types (and `vec`): pointers and references to them must carry an address space, and the
# attribute type rule judges them (template parameters and typedefs may carry a space or be anything,
# so they are not judged).
_CONCRETE_TYPE = re.compile(r"void|bool|char|uchar|short|ushort|int|uint|long|ulong|half|bfloat|float|size_t|"
                            r"ptrdiff_t|u?int(?:8|16|32|64)_t|(?:packed_)?(?:bool|char|uchar|short|ushort|int|uint|"
                            r"long|ulong|half|bfloat|float)[234]|(?:half|float|bfloat)[234]x[234]|vec|"
                            r"atomic_(?:int|uint|bool|float)|unsigned|signed")


# Constructs that need a later MSL than the oldest target: name -> (__METAL_VERSION__, what it is); a call
# of the first, the metal names of the second (a file may declare names of its own that a later MSL takes).
_VERSIONED = {"coherent": (320, "memory coherence (coherent(device))")}
_VERSIONED_NAMES = {name: (320, f"shader logging ({name}, <metal_logging>)") for name in ("os_log", "os_log_default")}


class _Rules:
    """One pass over the tokens with a scope stack (namespace, class, function, block, initializer)."""

    def __init__(self, tokens: list[_Tok], version: int):
        self.t = tokens
        self.version = version
        self.structs = {t2.text for t1, t2 in zip(tokens, tokens[1:])
                        if t1.text in ("struct", "class", "union") and t2.kind == "id"}
        self.bodies: list[tuple[int, int]] = []  # (start, end) of each namespace-scope function body
        self.kernels: set[str] = set()  # names of the kernel functions

    def text(self, i: int) -> str:
        return self.t[i].text if 0 <= i < len(self.t) else ""

    def fail(self, i: int, rule: str, msg: str):
        tok = self.t[min(i, len(self.t) - 1)]
        raise TranslateError(f"{tok.file}:{tok.line}: MSL rule '{rule}': {msg}")

    def close_of(self, i: int, open_: str, close: str) -> int:
        j = _closing(self.t, i, open_, close)
        return len(self.t) if j is None else j  # unbalanced: the translator reports it

    def run(self) -> None:
        self.tokens()
        kinds: list[str] = []  # "ns", "class", "func", "block", "init"
        start, pending_ns = 0, False
        for i, tok in enumerate(self.t):
            s = tok.text
            if s == "namespace":
                pending_ns = True
            elif s == "{":
                kind = "ns" if pending_ns else self.brace_kind(start, i, kinds)
                pending_ns = False
                if kind == "func":
                    self.parameters(start, i)
                    if not kinds or all(k == "ns" for k in kinds):
                        self.note_function(start, i)
                kinds.append(kind)
                start = i + 1
            elif s == "}":
                if kinds:
                    kinds.pop()
                start = i + 1
            elif s == ";":
                pending_ns = False
                self.statement(start, i, kinds[-1] if kinds else "ns")
                start = i + 1
            elif s == ":" and kinds and kinds[-1] in ("class",) and self.text(i - 1) in ("public", "private",
                                                                                       "protected"):
                start = i + 1
        self.kernel_calls()
        self.matrix_indices()
        self.vector_initializers()

    # token-level rules
    def tokens(self) -> None:
        declared = {self.t[k].text for k in range(1, len(self.t) - 1)
                    if self.t[k].kind == "id" and self.text(k + 1) == "(" and
                    (self.t[k - 1].kind == "id" or self.text(k - 1) in ("*", "&", ">"))}
        own = self.structs | {self.t[k].text for k in range(1, len(self.t) - 1)
                              if self.text(k - 1) == "using" and self.text(k + 1) == "="}
        for i, tok in enumerate(self.t):
            s = tok.text
            if tok.kind != "id":
                if s == "[" and self.text(i + 1) != "[" and self.text(i - 1) != "[":
                    self.lambda_at(i)
                continue
            prev = self.text(i - 1)
            if prev in (".", "->"):
                continue
            if s in _VERSIONED and self.text(i + 1) == "(" and self.version < _VERSIONED[s][0]:
                self.fail(i, "msl version", needs_version(_VERSIONED[s][1], _VERSIONED[s][0], self.version))
            if (s in _VERSIONED_NAMES and self.version < _VERSIONED_NAMES[s][0] and s not in own and
                    (prev != "::" or self.text(i - 2) == "metal")):
                self.fail(i, "msl version", needs_version(_VERSIONED_NAMES[s][1], _VERSIONED_NAMES[s][0],
                                                          self.version))
            if s in _FORBIDDEN_KEYWORDS and prev != "::":
                rule, msg = _FORBIDDEN_KEYWORDS[s]
                self.fail(i, rule, msg)
            elif s == "long" and self.text(i + 1) == "double":
                self.fail(i, "no double", "MSL has no long double")
            elif s == "delete" and prev != "=":
                self.fail(i, "no dynamic allocation", "MSL has no new/delete")
            elif s == "std" and self.text(i + 1) == "::" and prev != "::":
                self.fail(i, "no C/C++ standard library", "the C++ standard library (std::) is not available in MSL; "
                                                           "use the metal:: equivalents")
            elif s in _C_LIBRARY and self.text(i + 1) == "(" and prev != "::" and s not in declared:
                self.fail(i, "no C/C++ standard library", f"{s}() is a C library function; MSL has no C library")

    def lambda_at(self, i: int) -> None:
        prev = self.t[i - 1] if i else None
        if prev is not None and (prev.kind in ("id", "num", "str", "chr") and prev.text != "return"
                                 or prev.text in (")", "]", ">", "operator")):
            return  # a subscript, an array declarator or operator[]
        close = self.close_of(i, "[", "]")
        if self.text(close + 1) in ("(", "{", "mutable", "->", "<"):
            self.fail(i, "no lambdas", f"lambda expressions need MSL 4; the source targets MSL "
                                       f"{version_name(self.version)} (msl_version)")

    # scopes
    def brace_kind(self, start: int, i: int, kinds: list[str]) -> str:
        inside_function = any(k in ("func", "block") for k in kinds)
        words = [self.t[k].text for k in range(start, i)]
        while words[:2] == ["template", "<"]:  # the header's default arguments say nothing about the brace
            depth, n = 0, 1
            for n in range(1, len(words)):
                depth += {"<": 1, ">": -1, ">>": -2}.get(words[n], 0)
                if depth <= 0:
                    break
            words = words[n + 1:]
        prev = self.text(i - 1)
        if prev in ("=", ",", "(", "return", "{", "?", ":") or (prev == "]" and not inside_function and "=" in words):
            return "init"
        if inside_function:
            return "block" if prev in (")", "else", "do", ";", "{", "}", "try") or prev == "" or \
                self.t[i - 1].kind != "id" else "init"
        if any(w in ("struct", "class", "union") for w in words) and "(" not in words:
            return "class"
        if "enum" in words:
            return "init"
        if ")" in words:
            return "func"
        if words[:2] == ["extern", '"C"'] or (words and words[0] == "extern"):
            return "ns"
        return "init" if "=" in words else "class"

    # statements
    def decl_tokens(self, start: int, end: int) -> list[int]:
        """Indices of the statement's tokens without attributes."""
        out, k = [], start
        while k < end:
            if self.text(k) == "[" and self.text(k + 1) == "[":
                k = self.close_of(k, "[", "]") + 1
                continue
            if self.text(k) == "__attribute__" and self.text(k + 1) == "(":
                k = self.close_of(k + 1, "(", ")") + 1
                continue
            out.append(k)
            k += 1
        return out

    def statement(self, start: int, end: int, kind: str) -> None:
        idx = self.decl_tokens(start, end)
        if not idx:
            return
        words = [self.t[k].text for k in idx]
        if words[0] in ("typedef", "using", "template", "static_assert", "friend", "namespace", "return", "break",
                        "continue", "case", "default", "struct", "class", "union", "enum", "if", "for", "while",
                        "switch", "do", "else"):
            return
        top = self.top_level(idx)
        is_function = "(" in top and ("=" not in top or top.index("(") < top.index("="))
        if kind == "ns":
            if is_function:
                self.parameters(start, end)
                return
            builtin = any(self.text(k) in _BUILTIN_ATTRIBUTES and self.text(k - 1) in ("[", ",")
                          for k in range(start, end))  # MSL 3.1: built-in variables at program scope
            if not any(w in words for w in ("constant", "constexpr")) and self.looks_like_variable(top) and not builtin:
                self.fail(idx[0], "program scope variable",
                          "variables at program scope must be declared in the constant address space "
                          "('constant T name = ...;')")
        elif kind == "class":
            if is_function:
                self.parameters(start, end)
                return
            if "static" in words and not any(w in words for w in ("constant", "constexpr")):
                self.fail(idx[0], "static variable", "static variables must be declared in the constant address "
                                                     "space ('static constant T name = ...;')")
            self.pointer_declaration(idx, "class member")
        elif kind in ("func", "block"):
            if "static" in words[:4] and "threadgroup" not in words:
                self.fail(idx[0], "static variable", "functions cannot declare static variables, in the constant "
                                                     "address space or not; declare a 'constant' one at program "
                                                     "scope")
            self.local_declaration(idx)

    def top_level(self, idx: list[int]) -> list[str]:
        """The statement's tokens outside (), [], {} and <> (the brackets themselves kept)."""
        out, depth = [], 0
        for k in idx:
            s = self.t[k].text
            if depth == 0:
                out.append(s)
            if s in ("(", "[", "{"):
                depth += 1
            elif s in (")", "]", "}"):
                depth -= 1
                if depth == 0:
                    out.append(s)
        return out

    def looks_like_variable(self, top: list[str]) -> bool:
        names = [w for w in top if re.fullmatch(r"[A-Za-z_]\w*", w)]
        return len(names) >= 2 and top[0] not in ("extern",) and "operator" not in top

    def local_declaration(self, idx: list[int]) -> None:
        """``float* p = ...;`` / ``const float& r = ...;`` inside a function: the address space is required."""
        k = 0
        while k < len(idx) and self.t[idx[k]].text in ("const", "constexpr", "static", "volatile"):
            k += 1
        if k >= len(idx):
            return
        base = self.t[idx[k]].text
        if not (_CONCRETE_TYPE.fullmatch(base) or base in self.structs) or self.text(idx[k] + 1) in ("(", "{", "::"):
            return
        self.pointer_declaration(idx, "variable")

    def pointer_declaration(self, idx: list[int], what: str) -> None:
        depth = 0
        for n, k in enumerate(idx):
            s = self.t[k].text
            if s in ("<", "(", "["):
                depth += 1
            elif s in (">", ")", "]"):
                depth -= 1
            elif s == ">>":
                depth -= 2
            elif s in ("=", ",", ";", "{"):
                return
            elif depth == 0 and s in ("*", "&", "&&"):
                prefix = [self.t[j].text for j in idx[:n]]
                if any(w in _ADDRESS_SPACE_WORDS for w in prefix):
                    return
                base = next((w for w in reversed(self.strip_template_args(prefix))
                             if w not in ("const", "volatile", "metal", "::", "static", "constexpr", "inline")), "")
                if _CONCRETE_TYPE.fullmatch(base) or base in self.structs:
                    self.fail(k, "address space", f"a pointer or reference {what} needs an address space "
                                                  f"(device, constant, threadgroup or thread): "
                                                  f"'{' '.join(prefix)} {s}'")
                return

    @staticmethod
    def strip_template_args(words: list[str]) -> list[str]:
        out, depth = [], 0
        for w in words:
            if w == "<":
                depth += 1
            elif w in (">", ">>"):
                depth -= len(w)
            elif depth == 0:
                out.append(w)
        return out

    def parameters(self, start: int, end: int) -> None:
        """Pointer and reference parameters of a function declared or defined in [start, end)."""
        idx = self.decl_tokens(start, end)
        k = 0
        if idx and self.t[idx[0]].text == "template" and self.text(idx[0] + 1) == "<":
            depth = 0
            for k, j in enumerate(idx):
                s = self.t[j].text
                depth += {"<": 1, ">": -1, ">>": -2}.get(s, 0)
                if depth <= 0 and k > 0:
                    k += 1
                    break
        paren = None
        for n in range(k, len(idx)):
            j = idx[n]
            if self.t[j].text == "(":
                if self.text(j - 1) == "operator":
                    continue
                if self.text(j - 1) == ")" and self.text(j - 2) == "(" and self.text(j - 3) == "operator":
                    paren = j
                    break
                if self.t[j - 1].kind == "id" or self.text(j - 1) in (">", ">>"):
                    if self.text(j - 1) in ("decltype", "sizeof", "alignof", "__attribute__"):
                        return
                    paren = j
                    break
                return
        if paren is None:
            return
        close = self.close_of(paren, "(", ")")
        for p in split_parameters(self.decl_tokens(paren + 1, close), self.text):
            if p:
                self.pointer_declaration(p, "parameter")

    # functions (recursion is allowed: MSL 1.5.4, Metal 2.4 and later)
    def note_function(self, start: int, brace: int) -> None:
        self.bodies.append((brace, self.close_of(brace, "{", "}")))
        if any(self.text(j) == "kernel" for j in range(start, brace)):
            top = self.strip_template_args(self.top_level(self.decl_tokens(start, brace)))
            if "(" in top:
                self.kernels.add(top[top.index("(") - 1])

    def kernel_calls(self) -> None:
        for body, end in self.bodies:
            for k in range(body + 1, end):
                if self.text(k) in self.kernels and self.text(k + 1) in ("(", "<") and \
                        self.text(k - 1) not in (".", "->", "::"):
                    self.fail(k, "kernel call", f"'{self.text(k)}' is a kernel function; kernel functions cannot "
                                                f"be called from other functions")

    def matrix_indices(self) -> None:
        """A constant index past a matrix's columns (``m[4]`` of a float4x4) or rows (``m[0][3]`` of a
        float4x3): the variable's most recent declaration gives its type."""
        shapes: dict[str, tuple[int, int]] = {}
        for i, tok in enumerate(self.t):
            if tok.kind != "id" or self.text(i - 1) in (".", "->", "::"):
                continue
            after = i + 1 + (self.text(i + 1) in ("&", "&&"))
            declares = self.t[after].kind == "id" if after < len(self.t) else False
            m = _MATRIX_TYPE.fullmatch(tok.text)
            if m and declares:
                shapes[self.text(after)] = (int(m.group(1)), int(m.group(2)))
            elif declares and self.text(after + 1) in ("=", ";", ",", ")", "[", "{", "("):
                shapes.pop(self.text(after), None)  # the name declared again with another type
            elif tok.text in shapes and self.text(i + 1) == "[":
                close = self.close_of(i + 1, "[", "]")
                self.constant_index(i + 1, close, shapes[tok.text][0], "columns", tok.text)
                if self.text(close + 1) == "[":
                    self.constant_index(close + 1, self.close_of(close + 1, "[", "]"), shapes[tok.text][1], "rows",
                                        tok.text)

    def constant_index(self, open_: int, close: int, bound: int, what: str, name: str) -> None:
        if close != open_ + 2 or self.t[open_ + 1].kind != "num":
            return
        try:
            index = int(self.text(open_ + 1).rstrip("uUlL"), 0)
        except ValueError:
            return
        if index >= bound:
            self.fail(open_, "matrix index", f"'{name}[{index}]': the matrix has {bound} {what}; a constant index "
                                             f"out of range is a compile-time error")


    def vector_initializers(self) -> None:
        """A braced initializer of a vector variable with more elements than the vector has lanes
        (``float2 v = {1, 2, 3}``): each element gives one lane or more."""
        for i, tok in enumerate(self.t):
            m = _VECTOR_TYPE.fullmatch(tok.text)
            if not m or self.text(i - 1) in (".", "->", "::") or self.t[i + 1].kind != "id":
                continue
            brace = i + 2 + (self.text(i + 2) == "=")
            if self.text(brace) != "{":
                continue
            close, elements, depth = self.close_of(brace, "{", "}"), 0, 0
            for k in range(brace + 1, min(close, len(self.t))):
                depth += (self.text(k) in _OPEN) - (self.text(k) in _CLOSE)
                elements += depth == 0 and self.text(k) == "," and self.text(k + 1) != "}"
            elements += close > brace + 1
            if elements > int(m.group(1)):
                self.fail(brace, "vector initializer", f"'{tok.text} {self.text(i + 1)}' has {m.group(1)} lanes; its "
                                                       f"initializer gives {elements} elements")


def check_rules(tokens: list[_Tok], version: int = 310) -> None:
    """Raises TranslateError naming the first MSL language rule the tokens break for the target version
    (__METAL_VERSION__)."""
    _Rules(tokens, version).run()

