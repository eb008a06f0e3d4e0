"""The translator: the state of one translation, the main pass that hands each declaration to the part
that rewrites it, and the passes after it, in order."""

from __future__ import annotations

import dataclasses

from .address_spaces import _AddressSpaces
from .arguments import _Arguments
from .copies import _Copies
from .expressions import _number
from .glue import Kernel, _Glue
from .kernels import _Kernels
from .program_scope import _ProgramScope
from .rules import _BUILTIN_ATTRIBUTES, _ERASED_ADDRESS_SPACES, _STANDARD_ATTRIBUTES
from .threadgroup import _ThreadgroupMemory
from .tokens import _Tok


@dataclasses.dataclass
class Translation:
    cpp: str
    kernels: list[Kernel]
    threadgroup_sites: int


class _Translator(_Kernels, _Arguments, _ProgramScope, _ThreadgroupMemory, _AddressSpaces, _Copies, _Glue):
    """Walks the tokens once, handing each declaration to its part, then runs the passes that need them all.
    Subclasses (tools/cuda_check/translate_cuda.py) replace ``add_entry``, ``threadgroup_declaration`` and
    ``rewrite_tokens`` to emit CUDA instead."""

    def __init__(self, tokens: list[_Tok], standalone: bool = True, constants=None):
        super().__init__(tokens)
        self.standalone = standalone
        # Function constants, built-in variables and constant-space variables (program_scope.py).
        self.constants = dict(constants or {})
        self.constants_used: set = set()
        self.function_constants: dict[str, bool] = {}  # name -> whether a value was given
        self.function_values: dict[str, bool | int | float] = {}  # name -> the value given
        self.builtins: dict[str, str] = {}  # program-scope built-in variable -> the C++ that reads it
        self.constant_inits: set[int] = set()  # `constant` of program-scope variables to check (MSL 4.2)
        # Kernels (kernels.py) and their entry points (glue.py).
        self.plain_kernels: dict[tuple[str, ...], dict] = {}  # kernels that are not templates
        self.kernel_bodies: list[dict] = []  # kernel definitions with a body, in source order
        self.defs: dict[tuple[str, ...], list[dict]] = {}  # (namespaces..., name) -> kernel definitions
        self.hosts: dict[str, str] = {}  # host name -> where its kernel is
        self.kernels: list[Kernel] = []
        self.glue: list[tuple] = []  # (host name, entry pointer, number, max threads, binders, threadgroup bytes)
        self.entries = 0
        self.sites = 0  # threadgroup variables, numbered for the simulator's reports (threadgroup.py)

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
        self.by_value_copies()
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

    def pass_attribute(self, i: int) -> int:
        """Index after the attribute specifier at i, which the output keeps only when every attribute in it is
        standard C++ (the others are Metal's, for the translator alone)."""
        end = self.attr_end(i)
        if not all(n in _STANDARD_ATTRIBUTES for n, _ in self.attributes(i)):
            self.drop(i, end)
        return end

    def rewrite_tokens(self) -> None:
        """Token-level rewrites of everything not already replaced."""
        i = 0
        while i < len(self.t):
            if self.out[i] is not None:
                i += 1
                continue
            tok = self.t[i]
            if self.is_attr_start(i):
                i = self.pass_attribute(i)
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
