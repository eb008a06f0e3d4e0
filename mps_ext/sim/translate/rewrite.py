"""Rewriting MSL tokens into C++ for the simulator: address spaces, threadgroup variables, literals,
attributes and kernel bindings, explicit instantiations, and the glue that registers every kernel."""

from __future__ import annotations

import dataclasses
import re

from .rules import (_BUILTIN_ATTRIBUTES, _CONCRETE_TYPE, _ERASED_ADDRESS_SPACES, _FUNCTION_CONSTANT_TYPE,
                    _INDEX_ATTRIBUTES, _INDEX_TYPES, _MATCHING_ATTRIBUTES, _POSITION_ATTRIBUTES,
                    _POSITION_TYPES, _STANDARD_ATTRIBUTES, _UNSUPPORTED_ATTRIBUTES)
from .tokens import _CLOSE, _OPEN, _TOKEN, TranslateError, _closing, _template_args_end, _Tok

_SPECIFIERS = {"static", "constexpr", "const", "inline", "volatile", "extern", "constant"}
# Where a string literal stays one (not a `constant char*`): attributes and compile-time text.
_LITERAL_CALLEES = {"static_assert", "host_name", "__attribute__", "_Pragma", "asm", "deprecated", "nodiscard"}
# Buffer and threadgroup argument slots of a Metal kernel.
_SLOTS = 31

_DECIMAL_FLOAT = re.compile(r"(?:\d[\d']*\.[\d']*|\.\d[\d']*)(?:[eE][+-]?\d+)?|\d[\d']*[eE][+-]?\d+")
_HEX_FLOAT = re.compile(r"0[xX][\da-fA-F.']*[pP][+-]?\d+")


@dataclasses.dataclass
class Kernel:
    host_name: str
    file: str
    line: int


@dataclasses.dataclass
class Translation:
    cpp: str
    kernels: list[Kernel]
    threadgroup_sites: int


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


class _Translator:
    def __init__(self, tokens: list[_Tok], standalone: bool = True, constants=None):
        self.t = tokens
        self.standalone = standalone
        self.constants = dict(constants or {})
        self.constants_used: set = set()
        self.function_constants: dict[str, bool] = {}  # name -> whether a value was given
        self.function_values: dict[str, bool | int | float] = {}  # name -> the value given
        self.builtins: dict[str, str] = {}  # program-scope built-in variable -> the C++ that reads it
        self.constant_inits: set[int] = set()  # `constant` of program-scope variables to check (MSL 4.2)
        self.hosts: dict[str, str] = {}  # host name -> where its kernel is
        self.plain_kernels: dict[tuple[str, ...], dict] = {}  # kernels that are not templates
        self.cursor = 0
        self.out: list[list[_Tok] | None] = [None] * len(tokens)  # replacement per token; None keeps it
        self.kernels: list[Kernel] = []
        self.glue: list[tuple] = []  # (host name, entry pointer, number, max threads, binders, threadgroup bytes)
        self.kernel_bodies: list[dict] = []  # kernel definitions with a body, in source order
        self.defs: dict[tuple[str, ...], list[dict]] = {}  # (namespaces..., name) -> kernel definitions
        self.sites = 0
        self.entries = 0

    # -- helpers ------------------------------------------------------------
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

    # -- passes -------------------------------------------------------------
    def run(self) -> None:
        scopes: list[str | None] = []  # namespace name, or None for any other brace
        reopen: list[int] = []  # depths of user `namespace metal` blocks (see below)
        stmt_start = 0
        i = 0
        while i < len(self.t):
            self.cursor = i
            s = self.t[i].text
            at_namespace_scope = all(x is not None for x in scopes)
            if at_namespace_scope and s == "namespace" and self.t[i].kind == "id":
                j = self.find(i + 1, ("{", "=", ";"), "'{' after namespace")
                names = [t.text for t in self.t[i + 1:j] if t.kind == "id" and t.text != "inline"]
                if self.text(j) == "{":
                    if not self.standalone and not scopes and names[:1] == ["metal"]:
                        # Modules compiled into the extension keep their code in an unnamed
                        # namespace; a user's `namespace metal` extends the real one, as in MSL.
                        self.replace(i, self.code("} namespace", i))
                        reopen.append(len(scopes) + 1)
                    scopes.append("::".join(names))
                    i, stmt_start = j + 1, j + 1
                    continue
            if s == "{":
                scopes.append(None)
                stmt_start = i + 1
            elif s == "}":
                if reopen and reopen[-1] == len(scopes):
                    reopen.pop()
                    self.replace(i, self.code("} namespace {", i))
                if scopes:
                    scopes.pop()
                stmt_start = i + 1
            elif s == ";":
                stmt_start = i + 1
            elif at_namespace_scope and i == stmt_start and s == "template" and self.text(i + 1) != "<":
                i = self.instantiation(i, scopes)
                stmt_start = i
                continue
            elif at_namespace_scope and self.is_attr_start(i) and "function_constant" in dict(self.attributes(i)):
                i = self.function_constant(stmt_start, i)
                stmt_start = i
                continue
            elif at_namespace_scope and self.is_attr_start(i) and not self.in_parentheses(stmt_start, i) and \
                    _BUILTIN_ATTRIBUTES & dict(self.attributes(i)).keys():
                i = self.program_builtin(stmt_start, i)
                stmt_start = i
                continue
            elif at_namespace_scope and self.is_kernel_keyword(i):
                i = self.kernel_definition(stmt_start, i, scopes)
                stmt_start = i
                continue
            elif at_namespace_scope and i == stmt_start and s in ("constant", "static"):
                self.program_constant(i)
            elif s == "threadgroup" and not at_namespace_scope and self.starts_statement(i):
                i = self.threadgroup_declaration(i)
                stmt_start = i
                continue
            i += 1
        self.member_address_spaces()
        self.struct_copies()
        self.array_parameters()
        self.constant_objects()
        self.rewrite_tokens()
        for kernel in self.kernel_bodies:
            if kernel.get("sized"):
                self.threadgroup_sizer(kernel)

    def in_parentheses(self, start: int, i: int) -> bool:
        """Whether token i is inside parentheses opened since token ``start`` (a parameter list)."""
        return sum((self.text(k) == "(") - (self.text(k) == ")") for k in range(start, i)) > 0

    def starts_statement(self, i: int) -> bool:
        """Whether token i begins a statement (possibly after an attribute)."""
        return self.text(i - 1) in ("{", ";", "}", ":") or (self.text(i - 1) == "]" and self.text(i - 2) == "]")

    def is_kernel_keyword(self, i: int) -> bool:
        if self.t[i].text == "kernel" and self.text(i - 1) not in (".", "->", "::"):
            return True
        return self.is_attr_start(i) and any(n == "kernel" for n, _ in self.attributes(i))

    def kernel_definition(self, start: int, k: int, scopes) -> int:
        """A kernel function (template or not) from its statement start; returns where the main pass goes on."""
        templated = self.text(start) == "template" and self.text(start + 1) == "<"
        attrs = {}
        j = self.matching_angle(start + 1) + 1 if templated else start
        while j < len(self.t) and self.text(j) not in ("(", ";", "{", "}"):
            if self.is_attr_start(j):
                attrs.update((n, a) for n, a in self.attributes(j))
                j = self.attr_end(j)
                continue
            j += 1
        if self.text(j) != "(":
            self.err(k, "expected the kernel's parameter list")
        paren = j
        name_at = paren - 1
        if self.text(name_at) in (">", ">>"):
            self.err(paren, "explicit specializations of kernels are not supported; use an explicit instantiation")
        if self.t[name_at].kind != "id":
            self.err(paren, "expected the kernel's name before '('")
        name = self.text(name_at)
        self.check_kernel_return(start, name_at)
        close = self.match(paren, "(", ")")
        body = close + 1
        while self.text(body) not in ("{", ";"):
            if body >= len(self.t):
                self.err(close, f"unexpected end of input: kernel '{name}' has no body")
            if self.is_attr_start(body):
                attrs.update((n, a) for n, a in self.attributes(body))
                body = self.attr_end(body)
            else:
                body += 1
        binders = self.parameters(paren, close, check=self.text(body) == "{")
        limit = attrs.get("max_total_threads_per_threadgroup")
        definition = {
            # Qualified, so no function that `using namespace metal` brings in can make it ambiguous.
            "name": "::" + "::".join([*_namespaces(scopes), name]), "binders": binders, "at": name_at,
            "max_threads": "".join(t.text for t in limit) if limit else "0",
            "header": (start, self.matching_angle(start + 1) + 1) if templated else (start, start),
            "threadgroup": [],  # type-ids of its threadgroup variables
        }
        if self.text(body) == ";":
            return body + 1  # a declaration; the definition comes later
        if templated and limit:
            self.template_limit(start, definition, self.match(body, "{", "}"), scopes)
        definition["body"] = (body, self.match(body, "{", "}"))
        definition["sizer"] = "::".join([*_namespaces(scopes), f"mtlsim_threadgroup_bytes_{len(self.kernel_bodies)}"])
        self.kernel_bodies.append(definition)
        key = (*_namespaces(scopes), name)
        if key in self.plain_kernels or (key in self.defs and not templated):
            first = self.plain_kernels.get(key) or self.defs[key][0]
            self.err(name_at, f"MSL rule 'kernel overload': kernel functions cannot be overloaded; '{name}' is "
                              f"already defined at {self.where(first['at'])}")
        if not templated:
            self.plain_kernels[key] = definition
        self.defs.setdefault(key, []).append(definition)
        end = self.match(body, "{", "}")
        if not templated:
            host = _host_name(attrs.get("host_name")) or name
            self.add_entry(host, definition["name"], definition, at=name_at, insert_after=end, scopes=scopes)
        return body  # the main pass walks the body like any other block

    def template_limit(self, start: int, definition: dict, end: int, scopes) -> None:
        """``[[max_total_threads_per_threadgroup(N)]]`` of a kernel template: N may use the template's
        parameters, so it becomes a variable template beside the kernel, which each instantiation's glue
        names with its template arguments."""
        close = self.matching_angle(start + 1)
        header = " ".join(self.text(k) for k in range(start, close + 1))
        var = f"mtlsim_max_threads_{definition['at']}"
        kept = self.out[end] if self.out[end] is not None else [self.t[end]]
        self.out[end] = kept + self.code(f"{header} constexpr unsigned {var} = {definition['max_threads']};", end)
        qualified = "::" + "::".join([*_namespaces(scopes), var])
        definition["limit"] = (qualified, self.template_parameters(start + 1, close))

    def template_parameters(self, open_: int, close: int) -> set[str]:
        """The names declared by the template parameter list between ``open_`` and ``close``."""
        names, depth, default = set(), 0, False
        for k in range(open_ + 1, close + 1):
            s = self.text(k)
            if k == close or (depth == 0 and s in (",", "=")):
                if not default and self.t[k - 1].kind == "id":
                    names.add(self.text(k - 1))
                default = s == "="
            depth += (s in _OPEN or s == "<") - (s in _CLOSE or s == ">")
        return names

    def check_kernel_return(self, start: int, name_at: int) -> None:
        """MSL: kernel functions return void."""
        j, kept = start, []
        while j < name_at:
            s = self.text(j)
            if self.is_attr_start(j):
                j = self.attr_end(j)
                continue
            if s == "template" and self.text(j + 1) == "<":
                j = self.matching_angle(j + 1) + 1
                continue
            if s == "__attribute__" and self.text(j + 1) == "(":
                j = self.match(j + 1, "(", ")") + 1
                continue
            if s not in ("kernel", "static", "inline", "extern", "metal", "::"):
                kept.append(s)
            j += 1
        if kept != ["void"]:
            self.err(name_at, f"MSL rule 'kernel return type': kernel functions must return void, "
                              f"'{self.text(name_at)}' returns '{' '.join(kept)}'")

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

    def parameters(self, paren: int, close: int, check: bool) -> list[str]:
        """C++ binder types for the kernel parameters between the parentheses."""
        params, depth, cur = [], 0, []
        for j in range(paren + 1, close):
            s = self.t[j].text
            if s in "([{<":
                depth += 1
            elif s in ")]}>":
                depth -= 1
            if s == "," and depth == 0:
                params.append(cur)
                cur = []
            else:
                cur.append(j)
        if cur:
            params.append(cur)
        if len(params) == 1 and [self.t[j].text for j in params[0]] == ["void"]:
            params = []

        explicit, parsed, positions, types = {"buffer": set(), "threadgroup": set()}, [], {}, {}
        for p in params:
            binding = None
            for j in p:
                if self.is_attr_start(j):
                    for name, args in self.attributes(j):
                        if name in _UNSUPPORTED_ATTRIBUTES:
                            self.err(j, f"[[{name}]] is not supported by the simulator")
                        if name in ("buffer", "threadgroup"):
                            index = self.slot_index(j, name, args)
                            if index in explicit[name]:
                                self.err(j, f"[[{name}({index})]] is bound twice")
                            explicit[name].add(index)
                            binding = (name, index)
                        elif name not in _STANDARD_ATTRIBUTES and name != "function_constant" and binding is None:
                            binding = ("attr", name)
            if check:  # (a declaration's parameters may leave out the attributes of the definition)
                self.check_argument(p, binding)
            if binding is None:
                kind = "threadgroup" if any(self.t[j].text == "threadgroup" for j in p) else "buffer"
                binding = (kind, None)
            elif binding[1] in _POSITION_ATTRIBUTES or binding[1] in _INDEX_ATTRIBUTES:
                types[binding[1]] = (self.check_attribute_type(binding[1], p), p[0])
                if binding[1] in _POSITION_ATTRIBUTES:
                    positions[binding[1]] = (_components(self.t[j].text for j in p), p[0])
            parsed.append(binding)
        if len({n for n, _ in positions.values()}) > 1:
            declared = ", ".join(f"[[{a}]] with {n}" for a, (n, _) in positions.items())
            self.err(next(iter(positions.values()))[1],
                     f"MSL rule 'attribute type': the grid and threadgroup position attributes of a kernel have the "
                     f"same number of components; this kernel declares {declared}")
        self.check_matching_attributes(types)

        binders = []
        for kind, value in parsed:
            if kind == "attr":
                binders.append(f"::mtlsim::AttrArg<::mtlsim::Attr::{value}>")
                continue
            if value is None:  # Metal gives unattributed parameters the next free index
                value = next((n for n in range(_SLOTS) if n not in explicit[kind]), None)
                if value is None:
                    self.err(paren, f"kernel has more than {_SLOTS} {kind} parameters (Metal's limit)")
                explicit[kind].add(value)
            binders.append(f"::mtlsim::{'BufferArg' if kind == 'buffer' else 'ThreadgroupArg'}<{value}>")
        return binders

    def check_argument(self, param: list[int], binding) -> None:
        """MSL's rules for a kernel argument's address space and binding (MSL 4, 5.2.1)."""
        words, depth = [], 0
        for j in param:
            depth += {"[": 1, "]": -1}.get(self.text(j), 0)
            if depth == 0 and self.text(j) != "]":
                words.append(self.text(j))
        indirect = any(w in ("*", "&", "&&") for w in self.strip_angles(words)) or any(
            self.text(j) == "[" and "[" not in (self.text(j - 1), self.text(j + 1)) for j in param)  # an array
        space = "threadgroup" if "threadgroup" in words else "thread" if "thread" in words else None
        at = param[0]
        if binding is None and not indirect:
            self.err(at, "MSL rule 'kernel argument attribute': a kernel argument passed by value needs an attribute "
                         "([[buffer(n)]], or a built-in such as [[thread_position_in_grid]])")
        if indirect and space == "thread":
            self.err(at, "MSL rule 'kernel argument address space': a pointer or reference kernel argument is in the "
                         "device, constant or threadgroup address space, not thread")
        kind = binding[0] if binding else None
        if kind == "buffer" and space == "threadgroup":
            self.err(at, "MSL rule 'argument binding': a threadgroup pointer is bound with [[threadgroup(n)]], "
                         "not [[buffer(n)]]")
        if kind == "threadgroup" and space != "threadgroup":
            self.err(at, "MSL rule 'argument binding': [[threadgroup(n)]] binds a pointer or reference in the "
                         "threadgroup address space")

    @staticmethod
    def strip_angles(words: list[str]) -> list[str]:
        """The words outside template argument lists."""
        out, depth = [], 0
        for w in words:
            depth += {"<": 1, ">": -1, ">>": -2}.get(w, 0)
            if depth <= 0 and w not in (">", ">>"):
                out.append(w)
        return out

    def check_matching_attributes(self, types: dict) -> None:
        """MSL 5.2.3.6: attributes that describe one another are declared with the same type."""
        for group in _MATCHING_ATTRIBUTES:
            declared = [(a, *types[a]) for a in group if a in types and types[a][0]]
            if len({t for _, t, _ in declared}) > 1:
                listed = ", ".join(f"[[{a}]] as {t}" for a, t, _ in declared)
                self.err(declared[-1][2], f"MSL rule 'attribute type': these attributes are declared with the "
                                          f"same type; this kernel declares {listed}")
        position, index = types.get("thread_position_in_threadgroup"), types.get("thread_index_in_threadgroup")
        if position and index and position[0] and index[0] and position[0].startswith("uint") and index[0] != "uint":
            self.err(index[1], f"MSL rule 'attribute type': with [[thread_position_in_threadgroup]] a {position[0]}, "
                               f"[[thread_index_in_threadgroup]] is a uint, not {index[0]}")

    def slot_index(self, at: int, name: str, args) -> int:
        text = "".join(t.text for t in args)
        if text in self.function_values:  # MSL 5.8.1.4: a function constant as the index
            text = str(self.function_values[text])
        try:
            index = int(text.rstrip("uU"), 0)
        except ValueError:
            if text in self.function_constants:
                self.err(at, f"[[{name}({text})]]: the function constant '{text}' has no value")
            self.err(at, f"[[{name}({text})]]: the index must be an integer literal or a function constant")
        if not 0 <= index < _SLOTS:
            self.err(at, f"[[{name}({index})]]: Metal has {_SLOTS} {name} slots, 0 to {_SLOTS - 1}")
        return index

    def check_attribute_type(self, attribute: str, param: list[int]) -> str | None:
        """MSL: thread position attributes are uint/ushort scalars or 2-/3-vectors; index attributes scalars.
        Returns the type as uint/ushort[N], None for a type the translator cannot see through."""
        words, depth = [], 0
        for j in param:
            s = self.t[j].text
            depth += {"[": 1, "]": -1}.get(s, 0)
            if depth == 0 and s != "]" and (self.t[j].kind in ("id", "num") or s in ("<", ">", ",")):
                words.append(s)
        words = [w for w in words[:-1] if w not in ("const", "metal", "thread")]  # drop the parameter's name
        text = " ".join(words).replace("< ", "<").replace(" >", ">").replace(" , ", ",")
        allowed = _POSITION_TYPES if attribute in _POSITION_ATTRIBUTES else _INDEX_TYPES
        if text in allowed:
            return _normal_type(text)
        if not _CONCRETE_TYPE.fullmatch(text.replace("unsigned ", "u").split("<")[0]):
            return None  # a template parameter or typedef the translator cannot see through
        kinds = "uint or ushort, or a 2- or 3-vector of them" if allowed is _POSITION_TYPES else "uint or ushort"
        self.err(param[0], f"MSL rule 'attribute type': [[{attribute}]] must be {kinds}, not '{text}'")

    def function_constant(self, start: int, at: int) -> int:
        """``constant T name [[function_constant(i)]];`` -> a compile-time value given at compile time."""
        end = self.find(at, (";",), "';' after the function constant")
        index_tokens = dict(self.attributes(at))["function_constant"]
        decl = [k for k in range(start, at) if self.text(k) not in ("constant", "const", "static", "constexpr")]
        if not decl or self.text(decl[-1]) in ("]",) or self.t[decl[-1]].kind != "id":
            self.err(at, "expected 'constant T name [[function_constant(index)]];'")
        name = self.text(decl[-1])
        type_src = " ".join(self.text(k) for k in decl[:-1])
        index = "".join(t.text for t in index_tokens)
        if re.fullmatch(r"[\d+*()-]+", index):  # e.g. `FC_NORM + 0` after preprocessing
            try:
                index = str(eval(index, {"__builtins__": {}}))  # digits and + - * ( ) only
            except (SyntaxError, ArithmeticError):
                self.err(at, f"[[function_constant({index})]]: cannot evaluate the index")
        if re.fullmatch(r"-?\d+", index) and not 0 <= int(index) <= 65535:
            self.err(at, f"MSL rule 'function constant': [[function_constant({index})]]: the index is in 0..65535")
        if not _FUNCTION_CONSTANT_TYPE.fullmatch(" ".join(w for w in type_src.split() if w not in ("metal", "::"))):
            self.err(at, f"MSL rule 'function constant': '{name}' is a '{type_src}'; function constants are scalars "
                         f"or vectors")
        key = next((k for k in (name, index) if k in self.constants), None)
        if key is None and index.isdigit() and int(index) in self.constants:
            key = int(index)
        if key is not None and not isinstance(self.constants[key], (bool, int, float)):
            self.err(at, f"function constant '{name}': values are bool, int or float, "
                         f"got {type(self.constants[key]).__name__}")
        self.function_constants[name] = key is not None
        if key is not None:
            self.function_values[name] = self.constants[key]
        self.constants_used.add(key)
        value = _cpp_value(self.constants[key]) if key is not None else ""
        self.drop(start, end + 1)
        self.replace(start, self.code(f"constexpr {type_src} {name} = {type_src}({value});", start))
        return end + 1

    def program_constant(self, start: int) -> None:
        """MSL 4.2: a program-scope variable in the constant address space is initialized by a constant
        expression. Unless it is constexpr (which says as much), C++ checks it through MTLSIM_CONSTANT_INIT
        (constinit), and mps_ext.sim.compiler names the rule in the compiler's error."""
        depth, k, words, text = 0, start, [], False
        while k < len(self.t) and not (depth == 0 and (self.text(k) == ";" or
                                                       self.text(k) == "{" and "=" not in words)):
            if depth == 0:
                words.append(self.text(k))
            depth += (self.text(k) in _OPEN) - (self.text(k) in _CLOSE)
            text |= self.t[k].kind == "str"
            k += 1
        assigned = "=" in words and ("(" not in words or words.index("=") < words.index("("))
        # Left unchecked: string literals, constant-space text that the simulator reaches through an
        # address-space cast, which no C++ constant expression may contain (MLX's `constant os_log x("a", "b")`).
        if "constant" in words[:2] and "constexpr" not in words and assigned and not text:
            self.constant_inits.add(words.index("constant") + start)
        if "constant" in words[:2] and assigned:
            j = start + words.index("constant") + 1
            while self.text(j) in ("const", "static", "metal", "::"):
                j += 1
            if self.text(j) in ("half", "bfloat") and self.t[j + 1].kind == "id":
                eq = next(e for e in range(j, k) if self.text(e) == "=")
                self.small_float_elements(self.text(j), eq, k)

    def small_float_elements(self, kind: str, before: int, after: int) -> None:
        """``constant half t[] = {1.0f, NAN};``: each initializer between tokens ``before`` and ``after`` is
        converted to half explicitly, since C++ constructs no object in the constant address space through a
        converting constructor (the cast goes around the tokens, which keep their own rewrites)."""
        if self.text(before + 1) == "{" and before + 1 < after:
            close = self.match(before + 1, "{", "}")
            depth, element = 0, before + 1
            for j in range(before + 2, close + 1):
                depth += (self.text(j) in _OPEN) - (self.text(j) in _CLOSE)
                if (depth == 0 and self.text(j) == ",") or j == close:
                    if j > element + 1:
                        self.small_float_elements(kind, element, j)
                    element = j
            return
        for at, text in ((before, f"{kind} ("), (after, ")")):
            kept = self.out[at] if self.out[at] is not None else [self.t[at]]
            self.out[at] = kept + self.code(text, at) if at == before else self.code(text, at) + kept

    def program_builtin(self, start: int, at: int) -> int:
        """``uint2 gid [[thread_position_in_grid]];`` at program scope (MSL 3.1, 5.9): every use of the name
        becomes the calling thread's value (mtlsim::builtin, glue.h)."""
        end = self.find(at, (";",), "';' after the program-scope built-in")
        decl, k = [], start
        while k < end:
            if self.is_attr_start(k):
                k = self.attr_end(k)
                continue
            if self.text(k) not in ("const", "constant", "thread"):
                decl.append(k)
            k += 1
        attribute = next(n for n, _ in self.attributes(at) if n in _BUILTIN_ATTRIBUTES)
        if len(decl) < 2 or self.t[decl[-1]].kind != "id":
            self.err(at, f"expected 'T name [[{attribute}]];'")
        self.check_attribute_type(attribute, decl)
        type_src = " ".join(self.text(k) for k in decl[:-1])
        self.builtins[self.text(decl[-1])] = f"::mtlsim::builtin<{type_src}, ::mtlsim::Attr::{attribute}>()"
        self.drop(start, end + 1)
        return end + 1

    def instantiation(self, i: int, scopes) -> int:
        """An explicit instantiation: ``template [[host_name("x")]] kernel void f<T>(...);``, the same with
        deduced template arguments, the ``decltype`` form and the typedef form ``template ... kernel f_t f<T>;``."""
        end = self.find(i, (";",), "';' after the explicit instantiation")
        attrs, is_kernel, j = {}, False, i + 1
        while j < end:
            if self.is_attr_start(j):
                for n, a in self.attributes(j):
                    attrs[n] = a
                    is_kernel |= n in ("kernel", "host_name")
                j = self.attr_end(j)
                continue
            is_kernel |= self.t[j].text == "kernel"
            j += 1
        if not is_kernel:
            return end + 1  # an instantiation of an ordinary template
        host = _host_name(attrs.get("host_name"))
        if not host:
            self.err(i, "kernel instantiations need [[host_name(\"...\")]]")
        decl = [k for k in range(i, end) if self.t[k].text == "decltype"]
        paren = next((k for k in range(i + 1, end) if self.t[k].text == "(" and not self.inside_attribute(i, k)), None)
        if decl:
            start = self.match(decl[0] + 1, "(", ")") + 1
            stop = end
        elif paren is None:  # typedef form: the declarator ends the statement
            stop = end
            start = self.declarator_start(stop, i)
        else:
            stop = paren
            start = self.declarator_start(stop, i)
        if start >= stop:
            self.err(i, "expected the instantiated kernel's name")
        declarator = " ".join(self.t[k].text for k in range(start, stop))
        name = declarator.split("<")[0].split("::")[-1].strip()
        candidates = self.lookup(scopes, name)
        if not candidates:
            self.err(i, f"instantiation of unknown kernel template '{name}'")
        # Kernel templates may be overloaded: the one whose parameters the instantiation lists.
        count = self.count_parameters(paren) if paren is not None and not decl else None
        definition = next((d for d in candidates if len(d["binders"]) == count), candidates[-1])
        declarator = definition["name"] + (" " + declarator[declarator.index("<"):] if "<" in declarator else "")
        if paren is not None and not decl and self.text(stop - 1) not in (">", ">>"):
            # Deduced template arguments: the statement becomes the function type that selects the specialization.
            alias = f"mtlsim_signature_{self.entries}"
            self.drop(i, start)
            self.replace(i, self.code(f"using {alias} = void", i))
            self.drop(start, stop)
            self.add_entry(host, f"static_cast<{alias}*>(&{declarator})", definition, at=i, insert_after=end,
                           scopes=scopes, max_threads=self.instance_limit(definition, None, i))
            return end + 1
        self.drop(i, end + 1)
        args = declarator[declarator.index("<"):] if "<" in declarator else None
        self.add_entry(host, declarator, definition, at=i, insert_after=end, scopes=scopes,
                       max_threads=self.instance_limit(definition, args, i))
        return end + 1

    def instance_limit(self, definition: dict, args: str | None, at: int) -> str:
        """The thread limit of one instantiation of a kernel template (see template_limit)."""
        if "limit" not in definition:
            return definition["max_threads"]
        var, params = definition["limit"]
        if args is not None:
            return f"{var} {args}"
        used = params & set(re.findall(r"[A-Za-z_]\w*", definition["max_threads"]))
        if used:
            self.err(at, f"[[max_total_threads_per_threadgroup({definition['max_threads']})]] uses the template "
                         f"parameters {', '.join(sorted(used))}: instantiate the kernel with explicit template "
                         f"arguments")
        return definition["max_threads"]

    def count_parameters(self, paren: int) -> int:
        close, depth, count = self.match(paren, "(", ")"), 0, 0
        for j in range(paren + 1, close):
            s = self.t[j].text
            depth += {"(": 1, "[": 1, "<": 1, ")": -1, "]": -1, ">": -1, ">>": -2}.get(s, 0)
            count += s == "," and depth == 0
        return count + (close > paren + 1 and [t.text for t in self.t[paren + 1:close]] != ["void"])

    def declarator_start(self, stop: int, floor: int) -> int:
        """Start of the (possibly qualified, possibly templated) name that ends just before ``stop``."""
        start = stop - 1
        if self.text(start) in (">", ">>"):
            start = self.matching_angle_back(start) - 1
        while start - 2 > floor and self.text(start - 1) == "::":
            start -= 2
        return max(start, floor + 1)

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

    def lookup(self, scopes, name):
        ns = _namespaces(scopes)
        for n in range(len(ns), -1, -1):
            found = self.defs.get((*ns[:n], name))
            if found:
                return found
        return None

    def add_entry(self, host: str, function: str, definition: dict, at: int, insert_after: int, scopes,
                  max_threads: str | None = None) -> None:
        """Declares the kernel's entry point right after its definition or instantiation, in its namespace."""
        if host in self.hosts:
            self.err(at, f"two kernels have the host name '{host}' (the other is at {self.hosts[host]})")
        self.hosts[host] = self.where(at)
        n = self.entries
        self.entries += 1
        binders = ", ".join(definition["binders"])
        src = (f"constexpr ::mtlsim::Site mtlsim_site_{n} = {self.site(definition['at'])}; "
               f"constexpr void (*mtlsim_entry_{n})(const ::mtlsim::ThreadCtx*) = "
               f"&::mtlsim::entry<{function}, ::mtlsim::Bind<{binders}>, &mtlsim_site_{n}>; ")
        threadgroup = "0"  # deduced template arguments: not computed
        if not function.startswith("static_cast"):
            src = src.replace(f"entry<{function},", f"entry<&{function},")
            args = function[function.index("<"):] if "<" in function else ""
            src += f"constexpr uint32_t mtlsim_threadgroup_memory_{n} = {definition['sizer']} {args} (); "
            threadgroup = "::".join([*_namespaces(scopes), f"mtlsim_threadgroup_memory_{n}"])
            definition["sized"] = True
        kept = self.out[insert_after] if self.out[insert_after] is not None else [self.t[insert_after]]
        self.out[insert_after] = kept + self.code(src, at)
        qualified = "::".join([*_namespaces(scopes), f"mtlsim_entry_{n}"])
        ref = self.t[definition["at"]]
        self.kernels.append(Kernel(host, ref.file, ref.line))
        self.glue.append((host, qualified, n, max_threads or definition["max_threads"], definition["binders"],
                          threadgroup))

    def threadgroup_declaration(self, i: int) -> int:
        """``threadgroup T a[N], b;`` -> references to threadgroup-shared storage."""
        end, depth = i, 0
        while not (self.text(end) == ";" and depth == 0):
            if end >= len(self.t) or (depth == 0 and self.text(end) == "}"):
                self.err(i, "expected ';' after the threadgroup declaration")
            depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(self.text(end), 0)
            end += 1
        body = list(range(i + 1, end))
        first_name = None
        angle = 0
        for k in body:
            s = self.t[k].text
            if s == "<":
                angle += 1
            elif s in (">", ">>"):
                angle -= len(s)
            elif angle == 0 and s in ("*", "&", "&&"):
                return i + 1  # a pointer or reference into threadgroup memory: thread-private
            elif angle == 0 and s in ("[", ",", "=", ";") and first_name is None:
                first_name = k - 1
                break
        if first_name is None:
            first_name = end - 1
        type_src = " ".join(self.t[k].text for k in range(i + 1, first_name))
        declarators, cur = [], []
        depth = 0
        for k in range(first_name, end):
            s = self.t[k].text
            depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(s, 0)
            if s == "," and depth == 0:
                declarators.append(cur)
                cur = []
            else:
                cur.append(k)
        declarators.append(cur)
        src = []
        kernel = next((d for d in self.kernel_bodies if d["body"][0] < i < d["body"][1]), None)
        for d in declarators:
            name = self.t[d[0]].text
            if any(self.t[k].text == "=" for k in d):
                self.err(d[0], "threadgroup variables cannot have initializers")
            dims = " ".join(self.t[k].text for k in d[1:])
            if kernel:
                kernel["threadgroup"].append((i, f"{type_src} {dims}"))
            # Declared with its own type (not auto), so compiler messages spell it as written.
            src.append(f"threadgroup {type_src} ( & {name} ) {dims} = "
                       f"::mtlsim::threadgroup_var < threadgroup {type_src} {dims} > "
                       f"( {self.sites} , {self.site(i)} ) ;")
            self.sites += 1
        self.drop(i, end + 1)
        self.replace(i, self.code(" ".join(src), i))
        return end + 1

    def translated(self, start: int, stop: int) -> str:
        """Tokens start..stop as the translation emits them (after every rewrite)."""
        return " ".join(t.text for k in range(start, stop) for t in (self.out[k] if self.out[k] is not None
                                                                       else [self.t[k]]))

    def threadgroup_sizer(self, kernel: dict) -> None:
        """After a kernel's body: a constexpr function of its template parameters that gives the bytes of
        threadgroup memory its variables take, as Metal's staticThreadgroupMemoryLength does. The
        ``constexpr`` locals declared before them come along, since array sizes may use them; a size that
        uses another local (``const uint n = 64;``) is not computed (0). Emitted after every rewrite, from
        the header and locals as translated."""
        body, end = kernel["body"]
        last = max((at for at, _ in kernel["threadgroup"]), default=body)
        locals_, others, depth, start = [], set(), 0, body + 1
        for k in range(body + 1, last):
            s = self.text(k)
            depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(s, 0)
            if depth == 0 and s in (";", "}"):  # the end of a statement of the body itself
                words = [self.text(j) for j in range(start, min(start + 2, k))]
                if s == ";" and "constexpr" in words:
                    locals_.append(self.translated(start, k + 1))
                elif s == ";":  # the name it declares (or assigns), if any: before its first '=', '[' or '('
                    stop = next((j for j in range(start, k) if self.text(j) in ("=", "[", "(")), k)
                    others.add(self.text(stop - 1))
                start = k + 1
        used = {w for _, t in kernel["threadgroup"] for w in re.findall(r"[A-Za-z_]\w*", t)}
        sizes = ", ".join(f"{{sizeof(threadgroup {t}), alignof(threadgroup {t})}}" for _, t in kernel["threadgroup"])
        bytes_ = "0" if used & others else f"::mtlsim::threadgroup_bytes({{{sizes}}})"
        name = kernel["sizer"].split("::")[-1]
        src = (f"{self.translated(*kernel['header'])} constexpr uint32_t {name}() {{ "
               f"{'' if bytes_ == '0' else ' '.join(locals_)} return {bytes_}; }}")
        # Right after the '}', before the entry a kernel that is not a template has there, which uses it.
        kept = self.out[end] if self.out[end] is not None else [self.t[end]]
        self.out[end] = kept[:1] + self.code(src, end) + kept[1:]

    # -- member functions qualified with an address space ----------------------------------------
    # MSL qualifies a member function with the address space of the object it is called on
    # (`float get() const device`, `S() threadgroup`); C++ has no such qualifier. Each one loses
    # it and gets a name of its own, and the class gets a forwarder (mtlsim/address_space.h) by
    # the original name that calls it, through the thread-space view of the object, for objects
    # in that space only. Every class (not local to a function) also gets assignments for its
    # objects in any address space (MTLSIM_SPACE_ASSIGNMENT): `buf[i] = s;`, `buf[i] = {a, b};`.

    def member_address_spaces(self) -> None:
        enclosing: list[bool] = []  # per open brace: whether classes in it may have member templates
        for i, tok in enumerate(self.t):
            if tok.text == "{":
                name = self.class_name(i)
                scope = all(enclosing)  # not a block: local classes have no member templates
                if name is not None and scope:
                    self.class_members(i, self.match(i, "{", "}"))
                elif name:
                    self.local_class_assignment(i, self.match(i, "{", "}"), name)
                enclosing.append(scope and (name is not None or self.opens_namespace(i)))
            elif tok.text == "}" and enclosing:
                enclosing.pop()

    def local_class_assignment(self, open_: int, close: int, name: str) -> None:
        """A class local to a function gets its assignments in any address space without member templates
        (MTLSIM_LOCAL_SPACE_ASSIGNMENT), unless it declares an assignment of its own."""
        if any(self.text(k) == "operator" and self.text(k + 1) == "=" for k in range(open_, close)):
            return
        kept = self.out[close] if self.out[close] is not None else [self.t[close]]
        self.out[close] = self.code(f"MTLSIM_LOCAL_SPACE_ASSIGNMENT({name})", close) + kept

    def struct_copies(self) -> None:
        """``S s = buf[i];`` for a struct S of the file -> ``S s = MTLSIM_COPY(buf[i]);`` (see
        mtlsim/address_space.h): the initializer may be an object in any address space."""
        structs = {self.text(k + 1) for k in range(len(self.t) - 1)
                   if self.text(k) in ("struct", "class", "union") and self.t[k + 1].kind == "id"}
        for i, tok in enumerate(self.t):
            if tok.text not in structs or self.t[i + 1].kind != "id" or self.text(i + 2) != "=" or \
                    self.text(i + 3) == "{" or self.text(i - 1) in ("::", ".", "->"):
                continue
            j = i - 1
            while self.text(j) in ("const", "thread", "struct", "class", "union"):
                j -= 1
            if self.text(j) not in (";", "{", "}", ":"):
                continue  # not a declaration statement, or a constant one (program scope, static)
            end, depth = i + 3, 0
            while end < len(self.t) and not (depth == 0 and self.text(end) in (";", ",")):
                depth += (self.text(end) in _OPEN) - (self.text(end) in _CLOSE)
                end += 1
            if end == len(self.t) or self.out[i + 2] is not None:
                continue
            self.out[i + 2] = [self.t[i + 2], *self.code("MTLSIM_COPY (", i + 2)]
            kept = self.out[end] if self.out[end] is not None else [self.t[end]]
            self.out[end] = [self.new(")", end), *kept]

    def opens_namespace(self, brace: int) -> bool:
        j = brace - 1
        while j >= 0 and (self.t[j].kind == "id" or self.text(j) == "::") and self.text(j) != "namespace":
            j -= 1
        return self.text(j) == "namespace" or (self.t[j].kind == "str" and self.text(j - 1) == "extern")

    def class_name(self, brace: int) -> str | None:
        """The name of the class whose body opens at ``brace``, if it is one."""
        j = brace - 1
        while j >= 0 and self.text(j) not in (";", "{", "}"):
            j -= 1
        head = [k for k in range(j + 1, brace) if self.t[k].text != "typedef"]
        while head and self.text(head[0]) == "template" and self.text(head[0] + 1) == "<":
            after = self.matching_angle(head[0] + 1) + 1
            head = [k for k in head if k >= after]
        if not head or self.text(head[0]) not in ("struct", "class", "union"):
            return None
        depth = 0
        for k in head:
            depth += {"<": 1, ">": -1, ">>": -2}.get(self.text(k), 0)
            if depth <= 0 and self.text(k) == "(" and self.text(k - 1) not in ("alignas", "__attribute__", "("):
                return None  # `struct S f() {`: a function returning a struct
        names = [k for k in head[1:] if self.t[k].kind == "id" and self.text(k) not in ("final", "alignas")]
        return self.text(names[0]) if names else ""

    def class_members(self, open_: int, close: int) -> None:
        name = self.class_name(open_) or self.name_typedef_struct(open_)
        seen: set = set()
        forwards: dict[str, tuple] = {}  # forwarder key -> (spaces, macro call[, member name])
        j = open_ + 1
        while j < close:
            start, paren, end = j, None, None
            while j < close:
                s = self.text(j)
                if s == "template" and self.text(j + 1) == "<":
                    j = self.matching_angle(j + 1) + 1
                    continue
                if s in ("public", "private", "protected") and self.text(j + 1) == ":":
                    j += 2
                    start = j
                    continue
                if s == "(":
                    if paren is None and self.text(j - 1) not in ("__attribute__", "alignas", "operator"):
                        paren = j  # (the parameters of `operator()` come after its own parentheses)
                    j = self.match(j, "(", ")") + 1
                    continue
                if s == "[":
                    j = self.match(j, "[", "]") + 1
                    continue
                if s == "{":
                    k = self.match(j, "{", "}") + 1
                    if paren is not None and self.text(j - 1) in (")", "}") or self.is_body(paren, j):
                        end = k
                        j = k
                        break
                    j = k
                    continue
                if s == ";":
                    j += 1
                    end = j
                    break
                j += 1
            if end is None:
                break
            if paren is not None:
                self.member_function(start, paren, end, name, seen, forwards)
        calls = [f"MTLSIM_SPACE_ASSIGNMENT({name})"] if name else []
        for spaces, call, *member in forwards.values():
            calls.append(call.replace("MTLSIM_SPACES", ", ".join(sorted(spaces))))
            if member and member[0] not in seen:  # no member for the thread space: erased spaces call this one
                calls.append(call.replace("MTLSIM_SPACE_", "MTLSIM_ERASED_SPACE_").replace("MTLSIM_SPACES", ""))
        if calls:
            kept = self.out[close] if self.out[close] is not None else [self.t[close]]
            self.out[close] = self.code(" ".join(calls), close) + kept

    def name_typedef_struct(self, brace: int) -> str | None:
        """``typedef struct { ... } T;`` (ggml's block types) gets a tag of its own, so that its assignments
        can name the class; None for other unnamed classes."""
        if self.text(brace - 1) not in ("struct", "union") or self.text(brace - 2) != "typedef":
            return None
        tag = f"mtlsim_typedef_{brace}"
        kept = self.out[brace - 1] if self.out[brace - 1] is not None else [self.t[brace - 1]]
        self.out[brace - 1] = kept + self.code(tag, brace - 1)
        return tag

    def is_body(self, paren: int | None, brace: int) -> bool:
        """Whether the '{' at ``brace`` opens the body of the function whose parameters open at ``paren``."""
        if paren is None:
            return False
        close = self.match(paren, "(", ")")
        qualifiers = {"const", "volatile", "thread", "device", "constant", "threadgroup", "&", "&&", "noexcept",
                      "override", "final"}
        return all(self.text(k) in qualifiers for k in range(close + 1, brace))

    def member_function(self, start: int, paren: int, end: int, class_name, seen: set, forwards: dict) -> None:
        close = self.match(paren, "(", ")")
        k, spaces = close + 1, []
        while self.text(k) in ("const", "volatile", "thread", "device", "constant", "threadgroup", "&", "&&"):
            if self.text(k) in ("device", "constant", "threadgroup"):
                spaces.append(k)
            k += 1
        key = tuple(self.text(m) for m in range(start, k) if m not in spaces and self.text(m) != "thread")
        duplicate = key in seen
        seen.add(key)
        operator = next((m for m in range(start, paren) if self.text(m) == "operator"), None)
        name_at = paren - 1
        name = " ".join(self.text(m) for m in range(operator, paren)) if operator is not None else self.text(name_at)
        if not spaces:
            seen.add(name)  # a member for the thread space, which erased address spaces call instead
            return
        # By number (mtlsim::Space): the prelude defines `device`, `constant` and `threadgroup` as macros.
        space = {"device": "1", "constant": "2", "threadgroup": "3"}[self.text(spaces[0])]
        for m in spaces:
            self.replace(m, [])
        template = self.text(start) == "template" and self.text(start + 1) == "<"
        conversion = operator is not None and self.t[operator + 1].kind == "id" and \
            self.text(operator + 1) not in ("new", "delete")
        if self.text(name_at) == "~" or (operator is None and self.text(name_at) == class_name) or \
                (conversion and template):
            # Constructors (objects are constructed in the thread space only) and conversion templates
            # (their target is deduced, no other name can stand for them): the thread space's copy
            # serves, which MSL code writes with the same body.
            if duplicate:
                self.drop(start, end)
            if conversion:
                target = " ".join(self.text(m) for m in range(operator + 1, paren))
                params = " ".join(self.text(m) for m in range(start + 2, self.matching_angle(start + 1)))
                entry = forwards.setdefault("operator " + target, (set(), (
                    f"MTLSIM_SPACE_CONVERSION_TEMPLATE((MTLSIM_SPACES), ({params}), {target})")))
                entry[0].add(space)
            return
        # Others keep their body under a name of their own, which the forwarder for their space calls.
        n = len(forwards)
        renamed = f"mtlsim_space{space}_{self.text(name_at) if operator is None else f'operator{n}'}"
        if conversion:
            target = " ".join(self.text(m) for m in range(operator + 1, paren))
            self.replace(operator, self.code(f"{target} {renamed}", operator))
            self.drop(operator + 1, paren)
            forwards[renamed] = ({space}, f"MTLSIM_SPACE_CONVERSION_TO((MTLSIM_SPACES), {renamed}, {target})", name)
        else:
            self.replace(operator if operator is not None else name_at, self.code(renamed, name_at))
            if operator is not None:
                self.drop(operator + 1, paren)
            forwards.setdefault(renamed, ({space}, f"MTLSIM_SPACE_METHOD((MTLSIM_SPACES), {renamed}, {name})", name))

    def array_parameters(self) -> None:
        """``constant const int64_t strides[2]`` as a parameter -> ``(* strides)``: C++ adjusts an array
        parameter to a pointer as MSL does, but clang refuses the address space on the array's form."""
        for i, tok in enumerate(self.t):
            if tok.text != "[" or self.text(i + 1) == "[" or self.text(i - 1) == "[" or self.t[i - 1].kind != "id":
                continue
            close = self.match(i, "[", "]")
            if self.text(close + 1) not in (",", ")") or self.out[i - 1] is not None:
                continue
            j, depth, spaced = i - 2, 0, False
            while j >= 0:
                s = self.text(j)
                if s in (")", "]", ">", ">>"):
                    depth += 1
                elif s in ("(", "[", "<"):
                    if depth == 0:
                        break
                    depth -= 1
                elif s in (",", ";", "{", "}") and depth == 0:
                    break
                spaced |= depth == 0 and s in ("device", "constant", "threadgroup")
                j -= 1
            if spaced and self.text(j) in ("(", ","):
                self.replace(i - 1, self.code(f"( * {self.text(i - 1)} )", i - 1))
                self.drop(i, close + 1)

    def constant_objects(self) -> None:
        """Objects in the constant address space built by a constructor (MLX's logging.h:
        ``constant mlx::os_log logger("mlx", "binary_ops");``): string literals live in the constant
        address space in MSL, and ``constant T x(args);`` becomes ``constant T x = T(args);``, which
        clang allows for an object outside the generic space (the constructor runs on a temporary)."""
        for i, tok in enumerate(self.t):
            if tok.kind == "str" and self.out[i] is None and self.text(i - 1) in ("(", ","):
                end = i
                while self.t[end + 1].kind == "str":
                    end += 1
                if self.text(end + 1) in (")", ",") and self.callee(i) not in _LITERAL_CALLEES:
                    self.replace(i, self.code("( constant const char * )", i) + [tok])
            elif tok.text == "constant" and self.text(i - 1) in (";", "{", "}", "static") and self.out[i] is None:
                j = i + 1
                while self.text(j) not in ("(", ";", "=", "*", "&", "[", "{") and j < len(self.t) - 1:
                    j += 1
                if self.text(j) != "(" or self.t[j - 1].kind != "id" or self.text(self.match(j, "(", ")") + 1) != ";":
                    continue
                kind = [self.text(k) for k in range(i + 1, j - 1) if self.text(k) not in _SPECIFIERS]
                if kind:
                    self.replace(j, self.code(f"= {' '.join(kind)} (", j))

    def callee(self, i: int) -> str:
        """The name before the parenthesis that encloses token i."""
        depth = 0
        for j in range(i - 1, -1, -1):
            s = self.text(j)
            depth += {")": 1, "(": -1}.get(s, 0)
            if depth < 0:
                return self.text(j - 1)
        return ""

    def rewrite_tokens(self) -> None:
        """Token-level rewrites of everything not already replaced."""
        i = 0
        while i < len(self.t):
            if self.out[i] is not None:
                i += 1
                continue
            tok = self.t[i]
            if self.is_attr_start(i):
                end = self.attr_end(i)
                names = [n for n, _ in self.attributes(i)]
                if not all(n in _STANDARD_ATTRIBUTES for n in names):
                    self.drop(i, end)
                i = end
                continue
            if tok.kind == "id":
                if tok.text == "coherent" and self.text(i + 1) == "(":
                    # MSL 3.2 memory coherence (`coherent(device) device T*`): CPU memory is coherent.
                    self.drop(i, self.match(i + 1, "(", ")") + 1)
                elif tok.text == "is_function_constant_defined" and self.text(i + 1) == "(":
                    close = self.match(i + 1, "(", ")")
                    name = " ".join(t.text for t in self.t[i + 2:close])
                    if name not in self.function_constants:
                        self.err(i, f"is_function_constant_defined({name}): '{name}' is not a function constant")
                    self.drop(i, close + 1)
                    self.replace(i, [self.new("true" if self.function_constants[name] else "false", i, "id")])
                    i = close + 1
                    continue
                elif tok.text == "reinterpret_cast" and self.text(i - 1) != "::":
                    # Checks alignment, see mtlsim/glue.h.
                    self.replace(i, self.code("::mtlsim::aligned_cast", i))
                elif tok.text == "kernel" and self.text(i - 1) not in (".", "->", "::"):
                    self.replace(i, [])
                elif tok.text in self.builtins and self.text(i - 1) not in (".", "->", "::"):
                    self.replace(i, self.code(self.builtins[tok.text], i))
                elif tok.text in _ERASED_ADDRESS_SPACES:
                    self.replace(i, [])
                elif tok.text == "constant":
                    # `constant const T`, `static constant constexpr const T`: no duplicate const in C++.
                    check = self.code("MTLSIM_CONSTANT_INIT", i) if i in self.constant_inits else []
                    self.replace(i, check + [tok] + ([] if self.const_nearby(i) else [self.new("const", i, "id")]))
            elif tok.kind == "num":
                self.replace(i, _number(tok))
            i += 1

    def const_nearby(self, i: int) -> bool:
        """Whether the declaration of the address space at i says const or constexpr already."""
        j = i - 1
        while self.text(j) in _SPECIFIERS:
            if self.text(j) in ("const", "constexpr"):
                return True
            j -= 1
        j, depth = i + 1, 0
        while j < len(self.t):
            s = self.text(j)
            if s == "<":
                depth += 1
            elif s in (">", ">>"):
                depth -= len(s)
            elif depth <= 0 and s in ("*", "&", "&&", "=", ";", ",", "(", "[", "{", ")"):
                return False
            elif depth <= 0 and s in ("const", "constexpr"):
                return True
            j += 1
        return False

    def check_constants(self) -> None:
        unknown = [k for k in self.constants if k not in self.constants_used]
        if unknown:
            declared = ", ".join(sorted(self.function_constants)) or "none"
            raise TranslateError(f"{self.where(0)}: constants {unknown} match no [[function_constant]] of this "
                                 f"source (declared: {declared})")

    def emit(self, module_symbol: str, standalone: bool) -> str:
        # Kernels compiled into a separate module stand at global scope, as in MSL (so a user's
        # overload joins metal's instead of hiding it); those compiled into the extension keep
        # internal linkage, so two .metal files cannot clash at link time.
        lines = ["// Generated by mps_ext.sim.translate; do not edit.", '#include "mtlsim/prelude.h"']
        if not standalone:
            lines.append("namespace {")
        out: list[str] = []
        cur_file, cur_line = None, 0
        for i, tok in enumerate(self.t):
            for t in (self.out[i] if self.out[i] is not None else [tok]):
                if t.file != cur_file or t.line < cur_line or t.line - cur_line > 8:
                    out.append(f'\n#line {t.line} {_c_string(t.file)}\n')
                    cur_file, cur_line = t.file, t.line
                elif t.line > cur_line:
                    out.append("\n" * (t.line - cur_line))
                    cur_line = t.line
                out.append(t.text)
                out.append(" ")
        lines.append("".join(out))
        lines.append("#line 1 \"<mtlsim glue>\"")
        if standalone:
            lines.append("namespace {")
        infos = []
        for host, qualified, n, max_threads, binders, threadgroup in self.glue:
            args = ", ".join(_kernel_arg(b) for b in binders)
            lines.append(f"constexpr ::mtlsim::KernelArg mtlsim_args_{n}[] = {{{args or '{}'}}};")
            site = self.kernels[len(infos)]
            infos.append(f"{{{_c_string(host)}, {qualified}, {_c_string(site.file)}, {site.line}, "
                         f"uint32_t({max_threads}), {len(binders)}, mtlsim_args_{n}, {threadgroup}}}")
        if infos:
            lines.append("const ::mtlsim::KernelInfo mtlsim_kernels[] = {\n  " + ",\n  ".join(infos) + "\n};")
        kernels = "mtlsim_kernels" if infos else "nullptr"
        lines.append(f"const ::mtlsim::ModuleInfo mtlsim_module{{::mtlsim::kAbiVersion, {len(infos)}, {kernels}, "
                     f"{self.sites}}};")
        lines.append("}  // namespace")
        if standalone:  # built with -fvisibility=hidden: only the init function is exported
            lines.append("const mtlsim::RuntimeAPI* mtlsim_rt = nullptr;")
        lines.append(f"extern \"C\" __attribute__((visibility(\"default\"))) const ::mtlsim::ModuleInfo* "
                     f"{module_symbol}(const ::mtlsim::RuntimeAPI* rt) {{")
        if standalone:
            lines.append("  mtlsim_rt = rt;")
        else:
            lines.append("  (void)rt;")
        lines.append("  return &mtlsim_module;\n}\n")
        return "\n".join(lines)


def _normal_type(text: str) -> str:
    """uint32_t -> uint, vec<uint16_t,2> -> ushort2: one spelling per attribute type."""
    m = re.fullmatch(r"vec<(\w+),(\d)>", text)
    base, n = (m.group(1), m.group(2)) if m else (text, "")
    base = {"uint32_t": "uint", "unsigned int": "uint", "uint16_t": "ushort",
            "unsigned short": "ushort"}.get(base, base)
    return base + n


def _components(tokens) -> int:
    """Components of a kernel parameter's type (uint3 -> 3, vec<uint, 2> -> 2, uint -> 1)."""
    text = " ".join(t for t in tokens if not t.startswith("["))
    m = re.search(r"\bvec\s*<[^,>]+,\s*(\d)\s*>", text) or re.search(r"\b(?:u?int|u?short|u?long)([234])\b", text)
    return int(m.group(1)) if m else 1


def _namespaces(scopes) -> list[str]:
    return [s for s in scopes if s]


def _c_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _host_name(args) -> str | None:
    if not args:
        return None
    parts = [t.text for t in args if t.kind == "str"]
    return "".join(p[1:-1] for p in parts) or None


def _kernel_arg(binder: str) -> str:
    m = re.match(r"::mtlsim::(BufferArg|ThreadgroupArg)<(\d+)>", binder)
    if m:
        kind = "Buffer" if m.group(1) == "BufferArg" else "Threadgroup"
        return f"{{::mtlsim::ArgKind::{kind}, {m.group(2)}}}"
    attr = binder[binder.index("Attr::"):-1]
    return f"{{::mtlsim::ArgKind::Attribute, uint32_t(::mtlsim::{attr})}}"


def _cpp_value(value) -> str:
    """A Python bool, int or float as a C++ literal, exactly."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value) if -2**31 <= value < 2**31 else f"{value}ll" if -2**63 <= value < 2**63 else f"{value}ull"
    if isinstance(value, float):
        if value != value:
            return "__builtin_nanf(\"\")"
        if value in (float("inf"), float("-inf")):
            return ("-" if value < 0 else "") + "__builtin_inff()"
        return value.hex() + "f"  # MSL has no double: the float nearest the value
    raise TranslateError(f"function constant values are bool, int or float, got {type(value).__name__}")


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
