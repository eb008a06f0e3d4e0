"""Reading a .metal file: the C preprocessor as Apple's compiler runs it, and the tokens of its
output, each with its .metal file and line."""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import subprocess
import tempfile
from pathlib import Path

METAL_VERSION = 310  # MSL 3.1: bfloat, macOS 14; the default target
# The MSL versions a source may target (``msl_version``), as __METAL_VERSION__ gives them.
MSL_VERSIONS = {"3.1": 310, "3.2": 320}

# Headers a kernel may include; they all map to the simulator's prelude.
_METAL_HEADERS = (
    "metal_stdlib", "metal_atomic", "metal_common", "metal_compute", "metal_geometric",
    "metal_integer", "metal_math", "metal_matrix", "metal_numeric", "metal_pack", "metal_relational",
    "metal_simdgroup", "metal_simdgroup_matrix", "metal_types", "metal_type_traits", "metal_utility",
    "metal_limits", "metal_array", "metal_quadgroup", "metal_bfloat", "metal_uniform",
)
# Headers of a later MSL than the oldest target: name -> (__METAL_VERSION__, what it holds).
VERSIONED_HEADERS = {"metal_logging": (320, "shader logging (<metal_logging>: os_log)")}


class TranslateError(Exception):
    """A construct the simulator cannot translate, with its ``.metal`` position."""


@dataclasses.dataclass
class _Tok:
    text: str
    kind: str  # id, num, str, chr, punct
    file: str
    line: int
    # A loop hint (`#pragma clang loop ...`, `#pragma unroll`) written before this token: the simulator's
    # C++ has no use for it; a GPU back end keeps it on the loop it precedes.
    loop_hint: str = ""


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
_LOOP_HINT = re.compile(r"#pragma\s+(?:clang\s+loop\b|unroll\b|nounroll\b)")
_LINEMARKER = re.compile(r'#(?:line)?\s+(\d+)\s+"((?:[^"\\]|\\.)*)"')


# What Apple's compiler predefines for MSL 3.1 on macOS, and what <metal_stdlib> defines.
PREDEFINED = {"__METAL__": "1", "__METAL_VERSION__": str(METAL_VERSION), "__METAL_MACOS__": "1",
              "__HAVE_BFLOAT__": "1", "__MTLSIM__": "1"}
_STDLIB_MACROS = "#ifndef METAL_FUNC\n#define METAL_FUNC inline __attribute__((__always_inline__))\n#endif\n"
# C and C++ library headers: MSL has none of them.
_STD_HEADERS = re.compile(
    r"(?:c?(?:assert|ctype|errno|float|limits|locale|math|setjmp|signal|stdarg|stddef|stdint|stdio|stdlib|string|"
    r"time|wchar|inttypes|stdbool|complex|fenv|uchar|wctype)(?:\.h)?|algorithm|array|atomic|bitset|chrono|"
    r"complex|deque|exception|functional|initializer_list|iomanip|ios|iosfwd|iostream|istream|iterator|list|map|"
    r"memory|mutex|new|numeric|optional|ostream|queue|random|ratio|set|sstream|stack|stdexcept|string|"
    r"string_view|thread|tuple|type_traits|typeinfo|unordered_map|unordered_set|utility|valarray|variant|vector|"
    r"bit|span|numbers|concepts|compare|format|any|cstdint|cstddef|cfloat|climits|cmath|cstdio|cstdlib|cstring)")


def msl_version_number(msl_version: str) -> int:
    """310 for "3.1": __METAL_VERSION__ of a target MSL version; a ValueError for one not supported."""
    if msl_version not in MSL_VERSIONS:
        raise ValueError(f"msl_version must be one of {', '.join(map(repr, MSL_VERSIONS))}, got {msl_version!r}")
    return MSL_VERSIONS[msl_version]


def version_name(number: int) -> str:
    """"3.2" for 320: an MSL version as __METAL_VERSION__ numbers it."""
    return f"{number // 100}.{number % 100 // 10}"


def needs_version(what: str, needed: int, version: int) -> str:
    """The 'msl version' rule's message: ``what`` needs MSL ``needed``, the source targets ``version`` (both
    __METAL_VERSION__ numbers)."""
    return f"{what} needs MSL {version_name(needed)}; the source targets MSL {version_name(version)} (msl_version)"


def preprocess(source_path: Path, include_dirs=(), cxx: str | None = None, defines=(),
               msl_version: str = "3.1") -> str:
    """Run the C preprocessor over a .metal file as Apple's compiler would see it for ``msl_version``."""
    version = msl_version_number(msl_version)
    predefined = {**PREDEFINED, "__METAL_VERSION__": str(version)}
    cxx = cxx or os.environ.get("CXX", "c++")
    with tempfile.TemporaryDirectory(prefix="mtlsim-pp-") as stubs:
        for name in (*_METAL_HEADERS, *(h for h, (needed, _) in VERSIONED_HEADERS.items() if version >= needed)):
            Path(stubs, name).write_text(_STDLIB_MACROS)
        cmd = [*shlex.split(cxx), "-E", "-x", "c++", "-std=c++17", "-undef", "-nostdinc", "-I", stubs,
               *(f"-D{k}={v}" for k, v in predefined.items())]
        for d in include_dirs:
            cmd += ["-I", str(d)]
        cmd += [f"-D{d}" for d in defines]
        cmd.append(str(source_path))
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise TranslateError(f"{source_path}:1: preprocessing failed: {e}") from None
    if proc.returncode != 0:
        # GCC says `fatal error: x: No such file or directory`, clang `fatal error: 'x' file not found`.
        missing = re.search(r"^(.*?:\d+):\d+: fatal error: (?:([^:']+): No such file|'([^']+)' file not found)",
                            proc.stderr, re.M)
        header = missing and (missing.group(2) or missing.group(3))
        if header in VERSIONED_HEADERS:
            needed, what = VERSIONED_HEADERS[header]
            raise TranslateError(f"{missing.group(1)}: MSL rule 'msl version': {needs_version(what, needed, version)}")
        if header and _STD_HEADERS.fullmatch(header):
            raise TranslateError(f"{missing.group(1)}: MSL rule 'no C/C++ standard library': <{header}> "
                                 f"is a C/C++ library header; MSL has only its own <metal_*> headers")
        raise TranslateError(proc.stderr.strip() or f"preprocessing {source_path} failed")
    return proc.stdout


def _closing(tokens: list[_Tok], i: int, open_: str, close: str) -> int | None:
    """Index of the token closing the bracket opened at tokens[i], or None when unbalanced."""
    depth = 0
    for j in range(i, len(tokens)):
        if tokens[j].text == open_:
            depth += 1
        elif tokens[j].text == close:
            depth -= 1
            if depth == 0:
                return j
    return None


_OPEN, _CLOSE = "([{", ")]}"


def split_parameters(indices: list[int], text) -> list[list[int]]:
    """A parameter list's token indices (without its parentheses) split at the commas that are not inside
    brackets, braces, parentheses or template arguments; ``text(i)`` is token i's text."""
    params, current, depth = [], [], 0
    for i in indices:
        s = text(i)
        if s in ("(", "[", "{", "<"):
            depth += 1
        elif s in (")", "]", "}", ">"):
            depth -= 1
        elif s == ">>":
            depth -= 2
        if s == "," and depth == 0:
            params.append(current)
            current = []
        else:
            current.append(i)
    params.append(current)
    return params


def _template_args_end(toks: list[_Tok], i: int) -> int | None:
    """Index of the ``>`` closing what looks like a template argument list opened at toks[i] (a ``<`` after a
    name), or None when it reads as a comparison."""
    if i == 0 or toks[i - 1].kind != "id":
        return None
    depth = angle = 0
    for j in range(i, len(toks)):
        t = toks[j].text
        if t in _OPEN:
            depth += 1
        elif t in _CLOSE:
            depth -= 1
            if depth < 0:
                return None
        elif depth == 0:
            if t in (";", "&&", "||", "?"):
                return None
            angle += {"<": 1, ">": -1, ">>": -2}.get(t, 0)
            if angle <= 0:
                return j
    return None


def _tokenize(text: str) -> list[_Tok]:
    tokens: list[_Tok] = []
    file, line, hint = "<unknown>", 1, ""
    for raw in text.split("\n"):
        stripped = raw.lstrip()
        if stripped.startswith("#"):
            m = _LINEMARKER.match(stripped)
            if m:
                line, file = int(m.group(1)), m.group(2).encode().decode("unicode_escape")
                continue
            if stripped.startswith("#pragma"):
                if _LOOP_HINT.match(stripped):
                    hint = stripped
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
                tokens.append(_Tok(m.group(kind), kind, file, line, hint))
                hint = ""
        line += 1
    return tokens


