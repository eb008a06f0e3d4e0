"""Translate mps_ext's Metal kernels into CUDA C++ (one .cu per .metal file).

Reuses the simulator's translator (mps_ext/sim/translate/, loaded by
its path: nothing here needs the compiled package) for preprocessing, tokens with
their .metal lines, attributes, kernel bindings and [[host_name]]
instantiations, and changes what CUDA needs differently:

- address-space words are rewritten in the token stream (`device` and
  `threadgroup` in types vanish, `constant` becomes `const`), never by macros:
  `#define device` would break CUDA's own `__device__`;
- threadgroup variables become `__shared__` arrays;
- every function definition at namespace or class scope gets `__device__`
  (nvcc has no device-by-default mode), kernels included;
- MSL's vector and half types are renamed to mtl_* (CUDA's float4 is a struct
  without arithmetic), multi-letter swizzles become calls (v.xy -> v.xy()),
  and unqualified calls of Metal functions are qualified with metal:: (CUDA's
  global max/min/exp would make them ambiguous);
- each host name gets an `extern "C" __global__` trampoline (mtlk_<host name>) that computes
  Metal's position attributes from CUDA's indices and calls the kernel;
- loop unroll hints (`#pragma clang loop unroll(full)`, `#pragma unroll N`) are
  kept in nvcc's spelling: without them nvcc may leave a small constant loop
  rolled and put the arrays it indexes on the stack, where Apple's compiler
  unrolls as told;
- `#line` directives are kept, so nvcc's and compute-sanitizer's reports name
  .metal lines.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


sys.path.insert(0, str(ROOT / "tools"))
from generate_sources import load_translator  # noqa: E402 (the simulator's translator, by file path)

T = load_translator()

_SCALARS = ("float", "half", "bfloat", "int", "uint", "short", "ushort", "char", "uchar", "bool")
_RENAMED = {"half": "mtl_half", "bfloat": "mtl_bfloat"}
_RENAMED.update({f"{s}{n}": f"mtl_{s}{n}" for s in _SCALARS for n in (2, 3, 4)})
_SWIZZLE = re.compile(r"[xyzw]{2,4}|[rgba]{2,4}")
# Metal functions called unqualified after `using namespace metal` that CUDA also declares globally.
# The most threads per threadgroup the host launches each kernel with (csrc/ops/*.cpp), as
# __launch_bounds__: a bound of 1024 for every kernel would cap registers at 64 per thread and spill
# kernels that Apple's compiler is free to give more (a Metal pipeline lowers its own thread limit instead).
LAUNCH_BOUNDS = [(re.compile(r"(log_)?softmax_block_"), 1024), (re.compile(r"gemv_splitk_"), 512),
                 (re.compile(r"(fp8_linear|scaled_mm)_gemv_stream_|fp8_grouped_mm_stream\d"), 1024),
                 (re.compile(r"(fp8_linear|scaled_mm)_gemv_"), 512)]
DEFAULT_LAUNCH_BOUND = 256


_UNROLL_FULL = re.compile(r"#pragma\s+(?:clang\s+loop\s+unroll\s*\(\s*(?:full|enable)\s*\)|unroll)\s*$")
_UNROLL_COUNT = re.compile(r"#pragma\s+(?:clang\s+loop\s+unroll_count\s*\((.+)\)|unroll\s*\((.+)\)|unroll\s+(\w+))\s*$")
_NO_UNROLL = re.compile(r"#pragma\s+(?:clang\s+loop\s+unroll\s*\(\s*disable\s*\)|nounroll)\s*$")


def _nvcc_unroll(hint: str) -> str:
    """A Metal source's loop hint as nvcc spells it (a count may be any constant expression, as in clang);
    other hints (vectorize, ...) have no nvcc form."""
    if _UNROLL_FULL.match(hint):
        return "#pragma unroll"
    if m := _UNROLL_COUNT.match(hint):
        return f"#pragma unroll ({next(g for g in m.groups() if g).strip()})"
    return "#pragma unroll 1" if _NO_UNROLL.match(hint) else ""


def launch_bound(host: str) -> int:
    return next((n for pattern, n in LAUNCH_BOUNDS if pattern.match(host)), DEFAULT_LAUNCH_BOUND)


# The CUDA symbol of a host name's trampoline (a kernel whose host name is its own name would clash).
SYMBOL_PREFIX = "mtlk_"
_METAL_CALLS = {"max", "min", "exp", "log", "fabs", "isnan", "isinf", "clamp", "dot", "ceil", "floor", "sqrt",
                "rsqrt", "as_type", "fma", "popcount", "mulhi"}


@dataclasses.dataclass
class Entry:
    host: str
    function: str
    binders: list[str]
    file: str
    line: int


class CudaTranslator(T._Translator):
    """The project's kernels against the shim; a subclass changes the class attributes and hooks for other
    code bases (tools/cuda_check/peer_sources.py)."""

    renamed = _RENAMED
    headers = ("mtlcuda.h",)
    # [[threadgroup(n)]] parameters need dynamic shared memory, which only include/peer_ext.h provides.
    threadgroup_args = False

    def __init__(self, tokens, constants=None):
        super().__init__(tokens, standalone=True, constants=constants)
        self.entries_cuda: list[Entry] = []

    @staticmethod
    def source_forms(text: str) -> str:
        """The preprocessed source before tokenizing (a hook for forms nvcc rejects)."""
        return text

    @staticmethod
    def launch_bound(host: str) -> int:
        return launch_bound(host)

    def add_entry(self, host, function, definition, at, insert_after, scopes, max_threads=None):
        if host in self.hosts:
            self.err(at, f"two kernels have the host name '{host}'")
        if function.startswith("static_cast"):
            self.err(at, "instantiations with deduced template arguments are not supported by the CUDA check")
        self.hosts[host] = self.where(at)
        ref = self.t[definition["at"]]
        self.kernels.append(T.Kernel(host, ref.file, ref.line))
        binders = [b.replace("::mtlsim::", "::mtlcuda::") for b in definition["binders"]]
        for b in binders:
            if "ThreadgroupArg" in b and not self.threadgroup_args:
                self.err(at, "[[threadgroup(n)]] kernel parameters are not supported by the CUDA check")
        self.entries_cuda.append(Entry(host, function, binders, ref.file, ref.line))

    def threadgroup_declaration(self, i):
        end, depth = i, 0
        while not (self.text(end) == ";" and depth == 0):
            depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(self.text(end), 0)
            end += 1
        angle = 0
        for k in range(i + 1, end):
            s = self.text(k)
            angle += {"<": 1, ">": -1, ">>": -2}.get(s, 0)
            if angle == 0 and s in ("*", "&", "&&"):
                return i + 1  # a pointer or reference into threadgroup memory
            if angle == 0 and s in ("[", ",", "="):
                break
        self.replace(i, [self.new("__shared__", i, "id")])
        return i + 1

    def rewrite_tokens(self):
        i = 0
        while i < len(self.t):
            if self.out[i] is not None:
                i += 1
                continue
            tok = self.t[i]
            if self.is_attr_start(i):
                i = self.pass_attribute(i)
                continue
            prev = self.text(i - 1)
            if tok.kind == "id":
                if tok.text == "kernel" and prev not in (".", "->", "::"):
                    self.replace(i, [self.new("__device__", i, "id")])
                elif tok.text in ("device", "threadgroup", "thread") and prev not in (".", "->", "::"):
                    self.replace(i, [])
                elif tok.text == "constant" and prev not in (".", "->", "::"):
                    self.replace(i, [] if self.const_nearby(i) else [self.new("const", i, "id")])
                elif tok.text in _METAL_CALLS and prev not in (".", "->", "::") and self.text(i + 1) in ("(", "<"):
                    self.replace(i, self.code(f"::metal::{tok.text}", i))
                elif prev == "." and _SWIZZLE.fullmatch(tok.text) and self.text(i + 1) != "(":
                    self.replace(i, self.code(f"{tok.text}()", i))
            elif tok.kind == "num":
                self.replace(i, T._number(tok))
            i += 1
        self.mark_device_functions()

    def mark_device_functions(self):
        """`__device__` before every function definition at namespace or class scope, a member qualified after its
        parameters (`void clear() thread {`, `operator T() const thread noexcept {`) included; braces inside
        parentheses (a default argument `OffY off_y = Int<0>{}`) are not a statement's end."""
        qualifiers = {"const", "thread", "device", "threadgroup", "constant", "noexcept", "volatile", "override",
                      "final", "&", "&&"}
        scopes = []  # "ns", "class", "fn", "init" (braces inside parentheses)
        stmt_start, paren = 0, 0
        for i, tok in enumerate(self.t):
            s = tok.text
            if s == "(":
                paren += 1
            elif s == ")":
                paren -= 1
            elif s == "{":
                outer = scopes[-1] if scopes else "ns"
                stmt = [t.text for t in self.t[stmt_start:i]]
                j = i - 1
                while j > stmt_start and self.text(j) in qualifiers:
                    j -= 1
                if outer in ("fn", "init"):
                    kind = outer
                elif paren > 0:
                    kind = "init"
                elif "namespace" in stmt:
                    kind = "ns"
                elif self.text(j) == ")":
                    kind = "fn"
                    if "kernel" not in stmt:
                        self.insert_device(stmt_start, i)
                elif any(w in stmt for w in ("struct", "class", "union", "enum")):
                    kind = "class"
                else:
                    kind = "fn"  # an initializer: nothing inside is a definition
                scopes.append(kind)
                if kind != "init":
                    stmt_start = i + 1
            elif s == "}":
                if (scopes.pop() if scopes else None) != "init":
                    stmt_start = i + 1
            elif s == ";" or (s == ":" and scopes and scopes[-1] == "class" and self.text(i - 1) in (
                    "public", "private", "protected")):
                stmt_start = i + 1

    def insert_device(self, start, body):
        j = start
        while self.text(j) == "template" and self.text(j + 1) == "<":
            j = self.matching_angle(j + 1) + 1
        while self.is_attr_start(j):
            j = self.attr_end(j)
        if j >= body:
            return
        kept = self.emitted(j)
        self.out[j] = [self.new("__device__", j, "id")] + kept

    def emit_cuda(self) -> str:
        lines = ["// Generated by tools/cuda_check/translate_cuda.py; do not edit.",
                 *(f'#include "{h}"' for h in self.headers)]
        lines.append(self.source_text(lambda tok: _nvcc_unroll(tok.loop_hint),
                                      lambda t: self.renamed.get(t.text, t.text) if t.kind == "id" else t.text))
        for e in self.entries_cuda:
            function = re.sub(r"\b\w+\b", lambda m: self.renamed.get(m.group(0), m.group(0)), e.function)
            lines.append(f"#line {e.line} {T._c_string(e.file)}")
            lines.append(f'extern "C" __global__ void __launch_bounds__({self.launch_bound(e.host)}) '
                         f"{SYMBOL_PREFIX}{e.host}(::mtlcuda::Args a) {{ "
                         f"::mtlcuda::Entry<&{function}>::run<{', '.join(e.binders)}>(a); }}")
        return "\n".join(lines) + "\n"


def translate(source: Path, include_dirs=(), constants=None, defines=(),
              translator: type[CudaTranslator] = CudaTranslator) -> tuple[str, list[Entry]]:
    """(CUDA source, kernels) for one .metal file; constants: values of its [[function_constant]]s."""
    text = translator.source_forms(T.preprocess(Path(source), include_dirs, defines=defines))
    tokens = T._tokenize(text)
    tr = translator(tokens, constants)
    T.check_rules(tokens)
    tr.run()
    if constants:
        tr.check_constants()
    return tr.emit_cuda(), tr.entries_cuda


def main(argv=None):
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("metal", nargs="+", type=Path)
    ap.add_argument("-o", "--out", type=Path, required=True, help="directory for the .cu files")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for m in args.metal:
        cu, entries = translate(m, [ROOT / "metal" / "include"])
        (args.out / (m.stem + ".cu")).write_text(cu)
        print(f"{m}: {len(entries)} kernels")


if __name__ == "__main__":
    main()
