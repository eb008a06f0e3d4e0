"""Translate Metal Shading Language compute kernels into C++ for the simulator.

Runs at build time for the package's own ``metal/*.metal`` files and at run
time for ``mps_ext.sim.compile_shader``. It has no dependency on the rest of the
package (``setup.py`` loads this file directly).

The translation:

1. preprocesses the source with the C++ compiler against empty ``<metal_*>``
   headers, so macros (kernel instantiation macros above all) and
   ``#if __METAL_VERSION__`` expand exactly as for Apple's compiler;
2. tokenizes the result, keeping every token's ``.metal`` file and line;
3. rewrites what C++ cannot express: address spaces, ``threadgroup`` variables
   (to storage shared by the threadgroup), half and unsuffixed float literals,
   MSL attributes (recording each kernel parameter's binding), and explicit
   kernel instantiations with ``[[host_name]]``;
4. emits C++ with ``#line`` directives, so compiler errors and the simulator's
   reports name ``.metal`` lines, plus glue that registers every kernel by its
   host name.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import subprocess
import tempfile
from pathlib import Path

__all__ = ["TranslateError", "Translation", "translate", "preprocess"]

METAL_VERSION = 310  # MSL 3.1: bfloat, macOS 14

# Headers a kernel may include; they all map to the simulator's prelude.
_METAL_HEADERS = (
    "metal_stdlib", "metal_atomic", "metal_common", "metal_compute", "metal_geometric",
    "metal_integer", "metal_math", "metal_matrix", "metal_numeric", "metal_pack", "metal_relational",
    "metal_simdgroup", "metal_simdgroup_matrix", "metal_types", "metal_type_traits", "metal_utility",
    "metal_limits", "metal_array", "metal_quadgroup", "metal_bfloat",
)

_ADDRESS_SPACES = {"device", "thread", "threadgroup", "threadgroup_imageblock", "ray_data", "object_data"}
# Attributes that mean the same in C++ and stay.
_STANDARD_ATTRIBUTES = {"maybe_unused", "likely", "unlikely", "fallthrough", "nodiscard", "noreturn", "deprecated"}
# MSL: these must all be scalars, or vectors of one size, within a kernel.
_POSITION_ATTRIBUTES = {"thread_position_in_grid", "threads_per_grid", "thread_position_in_threadgroup",
                        "threads_per_threadgroup", "threadgroup_position_in_grid", "dispatch_threads_per_threadgroup",
                        "threadgroups_per_grid"}
_UNSUPPORTED_ATTRIBUTES = {"function_constant", "stage_in", "texture", "sampler", "visible_function_table"}


class TranslateError(Exception):
    """A construct the simulator cannot translate, with its ``.metal`` position."""


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


@dataclasses.dataclass
class _Tok:
    text: str
    kind: str  # id, num, str, chr, punct
    file: str
    line: int


_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<str>(?:u8|u|U|L)?"(?:[^"\\\n]|\\.)*")
  | (?P<chr>(?:u8|u|U|L)?'(?:[^'\\\n]|\\.)*')
  | (?P<num>\.?\d(?:[eEpP][+-]|[\w.'])*)
  | (?P<id>[A-Za-z_]\w*)
  | (?P<punct>::|->\*?|\.\*|\.\.\.|<<=|>>=|<=>|[-+*/%^&|<>=!]=|&&|\|\||<<|>>|\+\+|--|\#\#|[{}\[\]();:,.?~+\-*/%^&|<>=!#])
    """,
    re.VERBOSE,
)
_LINEMARKER = re.compile(r'#(?:line)?\s+(\d+)\s+"((?:[^"\\]|\\.)*)"')
_DECIMAL_FLOAT = re.compile(r"(?:\d[\d']*\.[\d']*|\.\d[\d']*)(?:[eE][+-]?\d+)?|\d[\d']*[eE][+-]?\d+")
_HEX_FLOAT = re.compile(r"0[xX][\da-fA-F.']*[pP][+-]?\d+")


def preprocess(source_path: Path, include_dirs=(), cxx: str | None = None, defines=()) -> str:
    """Run the C preprocessor over a .metal file as Apple's compiler would see it."""
    cxx = cxx or os.environ.get("CXX", "c++")
    with tempfile.TemporaryDirectory(prefix="mtlsim-pp-") as stubs:
        for name in _METAL_HEADERS:
            Path(stubs, name).write_text("")
        cmd = [*shlex.split(cxx), "-E", "-x", "c++", "-std=c++17", "-undef", "-nostdinc", f"-D__METAL_VERSION__={METAL_VERSION}",
               "-D__METAL_MACOS__=1", "-D__HAVE_BFLOAT__=1", "-D__MTLSIM__=1", "-I", stubs]
        for d in include_dirs:
            cmd += ["-I", str(d)]
        cmd += [f"-D{d}" for d in defines]
        cmd.append(str(source_path))
        proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise TranslateError(proc.stderr.strip() or f"preprocessing {source_path} failed")
    return proc.stdout


def _tokenize(text: str) -> list[_Tok]:
    tokens: list[_Tok] = []
    file, line = "<unknown>", 1
    for raw in text.split("\n"):
        stripped = raw.lstrip()
        if stripped.startswith("#"):
            m = _LINEMARKER.match(stripped)
            if m:
                line, file = int(m.group(1)), m.group(2).encode().decode("unicode_escape")
                continue
            if stripped.startswith("#pragma"):
                line += 1
                continue
        pos = 0
        while pos < len(raw):
            m = _TOKEN.match(raw, pos)
            if not m:
                raise TranslateError(f"{file}:{line}: cannot tokenize {raw[pos:pos + 20]!r}")
            pos = m.end()
            kind = m.lastgroup
            if kind != "ws":
                tokens.append(_Tok(m.group(kind), kind, file, line))
        line += 1
    return tokens


class _Translator:
    def __init__(self, tokens: list[_Tok]):
        self.t = tokens
        self.out: list[list[_Tok] | None] = [None] * len(tokens)  # replacement per token; None keeps it
        self.kernels: list[Kernel] = []
        self.glue: list[tuple] = []  # (host name, entry pointer, number, max threads, binders)
        self.defs: dict[tuple[str, ...], dict] = {}  # (namespaces..., name) -> kernel definition
        self.sites = 0
        self.entries = 0

    # -- helpers ------------------------------------------------------------
    def err(self, i: int, msg: str):
        tok = self.t[min(i, len(self.t) - 1)]
        raise TranslateError(f"{tok.file}:{tok.line}: {msg}")

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
                    depth += {"(": 1, ")": -1}.get(inner[k].text, 0)
                    if depth:
                        args.append(inner[k])
                    k += 1
            attrs.append((name, args))
        return attrs

    def match(self, i: int, open_: str, close: str) -> int:
        """Index of the token closing the bracket opened at i."""
        depth = 0
        for j in range(i, len(self.t)):
            if self.t[j].text == open_:
                depth += 1
            elif self.t[j].text == close:
                depth -= 1
                if depth == 0:
                    return j
        self.err(i, f"unbalanced {open_!r}")

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
        stmt_start = 0
        i = 0
        while i < len(self.t):
            s = self.t[i].text
            at_namespace_scope = all(x is not None for x in scopes)
            if at_namespace_scope and s == "namespace" and self.t[i].kind == "id":
                j = i + 1
                names = []
                while self.text(j) not in ("{", "=", ";"):
                    if self.t[j].kind == "id" and self.t[j].text != "inline":
                        names.append(self.t[j].text)
                    j += 1
                if self.text(j) == "{":
                    scopes.append("::".join(names))
                    i, stmt_start = j + 1, j + 1
                    continue
            if s == "{":
                scopes.append(None)
                stmt_start = i + 1
            elif s == "}":
                if scopes:
                    scopes.pop()
                stmt_start = i + 1
            elif s == ";":
                stmt_start = i + 1
            elif at_namespace_scope and i == stmt_start and s == "template" and self.text(i + 1) != "<":
                i = self.instantiation(i, scopes)
                stmt_start = i
                continue
            elif at_namespace_scope and self.is_kernel_keyword(i):
                i = self.kernel_definition(stmt_start, i, scopes)
                stmt_start = i
                continue
            elif s == "threadgroup" and not at_namespace_scope and self.starts_statement(i):
                i = self.threadgroup_declaration(i)
                stmt_start = i
                continue
            i += 1
        self.rewrite_tokens()

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
        j = start
        while j < len(self.t) and self.text(j) != "(":
            if self.is_attr_start(j):
                attrs.update((n, a) for n, a in self.attributes(j))
                j = self.attr_end(j)
                continue
            j += 1
        paren = j
        name_at = paren - 1
        if self.text(name_at) in (">", ">>"):
            self.err(paren, "explicit specializations of kernels are not supported; use an explicit instantiation")
        name = self.text(name_at)
        close = self.match(paren, "(", ")")
        body = close + 1
        while self.text(body) not in ("{", ";"):
            if self.is_attr_start(body):
                attrs.update((n, a) for n, a in self.attributes(body))
                body = self.attr_end(body)
            else:
                body += 1
        binders = self.parameters(paren, close)
        limit = attrs.get("max_total_threads_per_threadgroup")
        definition = {
            "name": name, "binders": binders, "at": name_at,
            "max_threads": "".join(t.text for t in limit) if limit else "0",
        }
        if self.text(body) == ";":
            return body + 1  # a declaration; the definition comes later
        self.defs[(*_namespaces(scopes), name)] = definition
        if not templated:
            host = _host_name(attrs.get("host_name")) or name
            self.add_entry(host, name, definition, at=name_at, insert_after=self.match(body, "{", "}"), scopes=scopes)
        return body  # the main pass walks the body like any other block

    def parameters(self, paren: int, close: int) -> list[str]:
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

        explicit, parsed, positions = {"buffer": set(), "threadgroup": set()}, [], {}
        for p in params:
            binding = None
            for j in p:
                if self.is_attr_start(j):
                    for name, args in self.attributes(j):
                        if name in _UNSUPPORTED_ATTRIBUTES:
                            self.err(j, f"[[{name}]] is not supported by the simulator")
                        if name in ("buffer", "threadgroup"):
                            index = int("".join(t.text for t in args).rstrip("uU"), 0)
                            explicit[name].add(index)
                            binding = (name, index)
                        elif name not in _STANDARD_ATTRIBUTES and binding is None:
                            binding = ("attr", name)
            if binding is None:
                kind = "threadgroup" if any(self.t[j].text == "threadgroup" for j in p) else "buffer"
                binding = (kind, None)
            elif binding[1] in _POSITION_ATTRIBUTES:
                positions[binding[1]] = (_components(self.t[j].text for j in p), p[0])
            parsed.append(binding)
        if len({n for n, _ in positions.values()}) > 1:
            declared = ", ".join(f"[[{a}]] with {n}" for a, (n, _) in positions.items())
            self.err(next(iter(positions.values()))[1],
                     f"Metal requires the grid and threadgroup position attributes of a kernel to have the same "
                     f"number of components; this kernel declares {declared}")

        binders = []
        for kind, value in parsed:
            if kind == "attr":
                binders.append(f"::mtlsim::AttrArg<::mtlsim::Attr::{value}>")
                continue
            if value is None:  # Metal gives unattributed parameters the next free index
                value = next(n for n in range(64) if n not in explicit[kind])
                explicit[kind].add(value)
            binders.append(f"::mtlsim::{'BufferArg' if kind == 'buffer' else 'ThreadgroupArg'}<{value}>")
        return binders

    def instantiation(self, i: int, scopes) -> int:
        """``template [[host_name("x")]] kernel void f<T>(...);`` or the decltype form."""
        end = i
        while self.text(end) != ";":
            end += 1
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
        if decl:
            start = self.match(decl[0] + 1, "(", ")") + 1
            stop = end
        else:
            stop = next(k for k in range(i + 1, end)
                        if self.t[k].text == "(" and not self.inside_attribute(i, k))
            start = stop - 1
            if self.text(start) in (">", ">>"):
                start = self.matching_angle_back(start)
            start -= 1
            while self.text(start - 1) == "::":
                start -= 2
        declarator = " ".join(self.t[k].text for k in range(start, stop))
        name = declarator.split("<")[0].split("::")[-1].strip()
        definition = self.lookup(scopes, name)
        if definition is None:
            self.err(i, f"instantiation of unknown kernel template '{name}'")
        self.drop(i, end + 1)
        self.add_entry(host, declarator, definition, at=i, insert_after=end, scopes=scopes)
        return end + 1

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

    def add_entry(self, host: str, function: str, definition: dict, at: int, insert_after: int, scopes) -> None:
        """Declares the kernel's entry point right after its definition or instantiation, in its namespace."""
        n = self.entries
        self.entries += 1
        binders = ", ".join(definition["binders"])
        src = (f"constexpr ::mtlsim::Site mtlsim_site_{n} = {self.site(definition['at'])}; "
               f"constexpr void (*mtlsim_entry_{n})(const ::mtlsim::ThreadCtx*) = "
               f"&::mtlsim::entry<&{function}, ::mtlsim::Bind<{binders}>, &mtlsim_site_{n}>; ")
        kept = self.out[insert_after] if self.out[insert_after] is not None else [self.t[insert_after]]
        self.out[insert_after] = kept + self.code(src, at)
        qualified = "::".join([*_namespaces(scopes), f"mtlsim_entry_{n}"])
        ref = self.t[definition["at"]]
        self.kernels.append(Kernel(host, ref.file, ref.line))
        self.glue.append((host, qualified, n, definition["max_threads"], definition["binders"]))

    def threadgroup_declaration(self, i: int) -> int:
        """``threadgroup T a[N], b;`` -> references to threadgroup-shared storage."""
        end, depth = i, 0
        while not (self.text(end) == ";" and depth == 0):
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
                self.replace(i, [])  # a pointer or reference into threadgroup memory: thread-private
                return i + 1
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
        for d in declarators:
            name = self.t[d[0]].text
            if any(self.t[k].text == "=" for k in d):
                self.err(d[0], "threadgroup variables cannot have initializers")
            dims = " ".join(self.t[k].text for k in d[1:])
            src.append(f"auto & {name} = ::mtlsim::threadgroup_var < {type_src} {dims} > "
                       f"( {self.sites} , {self.site(i)} ) ;")
            self.sites += 1
        self.drop(i, end + 1)
        self.replace(i, self.code(" ".join(src), i))
        return end + 1

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
                if tok.text == "reinterpret_cast" and self.text(i - 1) != "::":
                    # Checks alignment, see mtlsim/glue.h.
                    self.replace(i, self.code("::mtlsim::aligned_cast", i))
                elif tok.text == "kernel" and self.text(i - 1) not in (".", "->", "::"):
                    self.replace(i, [])
                elif tok.text in _ADDRESS_SPACES:
                    self.replace(i, [])
                elif tok.text == "constant":
                    # `constant const T` would be a duplicate const in C++.
                    dup = self.text(i - 1) == "const" or self.text(i + 1) == "const"
                    self.replace(i, [] if dup else [self.new("const", i, "id")])
            elif tok.kind == "num":
                self.replace(i, _number(tok))
            i += 1

    def emit(self, module_symbol: str, standalone: bool) -> str:
        lines = ["// Generated by mps_ext.sim.translate; do not edit.", '#include "mtlsim/prelude.h"', "namespace {"]
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
        infos = []
        for host, qualified, n, max_threads, binders in self.glue:
            args = ", ".join(_kernel_arg(b) for b in binders)
            lines.append(f"constexpr ::mtlsim::KernelArg mtlsim_args_{n}[] = {{{args or '{}'}}};")
            site = self.kernels[len(infos)]
            infos.append(f"{{{_c_string(host)}, {qualified}, {_c_string(site.file)}, {site.line}, "
                         f"uint32_t({max_threads}), {len(binders)}, mtlsim_args_{n}}}")
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


def translate(source_path: Path, *, include_dirs=(), module_symbol: str = "mtlsim_module_init",
              standalone: bool = True, cxx: str | None = None, defines=()) -> Translation:
    """Translate one .metal file into one C++ translation unit.

    ``standalone`` modules are shared libraries loaded at run time (they get the
    runtime's API table from their init function); others are compiled into the
    extension itself, where the runtime defines it.
    """
    text = preprocess(Path(source_path), include_dirs, cxx, defines)
    tr = _Translator(_tokenize(text))
    tr.run()
    return Translation(tr.emit(module_symbol, standalone), tr.kernels, tr.sites)
