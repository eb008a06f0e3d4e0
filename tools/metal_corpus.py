#!/usr/bin/env python3
"""The upstream Metal corpus: kernel sources that real projects ship, for the
simulator's regression tests (tests/test_metal_corpus.py).

- ggml's kernels/*.metal, from the llama-cpp-python sdist (vendor/llama.cpp);
- MLX's kernel headers (mlx/backend/metal/kernels/**/*.h), from the macOS
  mlx-metal wheel;
- PyTorch's c10/metal/*.h, from the macOS torch 2.15.0 wheel whose headers
  tools/check_macos.py keeps already;
- the .metal files of Python packages that ship Metal compute kernels as
  source (METAL_WHEELS).

Each package is pinned by version and sha256, fetched from PyPI once with
check_macos's helpers and kept (only the Metal sources) in
$MPS_EXT_CACHE_DIR/macos-v2/corpus. A .metal file is compiled as shipped; a
header is compiled as the one include of a .metal file that adds one trivial
kernel (the simulator wants at least one), after the includes MLX's own .metal
files put before it (utils.h and a few more, see MLX_PRELUDES); so is a .metal
file that other ggml kernel files include, after the includes they put before it.

    python tools/metal_corpus.py            fetch, compile everything, print the table
    python tools/metal_corpus.py --msl-version 3.2    the same, every file targeting MSL 3.2
    python tools/metal_corpus.py --fetch    fetch only
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib.util
import re
import sys
import tarfile
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent


def _check_macos():
    spec = importlib.util.spec_from_file_location("check_macos", ROOT / "tools" / "check_macos.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check_macos = _check_macos()

LLAMA = ("llama-cpp-python", "0.3.36", ".tar.gz", "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e")
MLX = ("mlx-metal", "0.32.4", "-py3-none-macosx_14_0_arm64.whl",
       "8019b2db622599267d66cc168b2f0dbf5af929790a6c3b3913e00eabc42a7947")
TORCH = ("torch", "2.15.0", check_macos.TORCH_WHEEL, "e808b63d616a43b326e1a5677d45a2e5babe7a8ce27edb03ddb48e7dd9b6d663")

# Packages whose wheels ship .metal files, each compiled as shipped: (package, version, wheel tag, sha256).
METAL_WHEELS = (
    ("fp4-fp8-for-torch-mps", "1.0.3", "-py3-none-any.whl",
     "e3460377560899552abbe79dbf17e4fd408d0e07b91dc30f65c89d3441b7551d"),
    ("late-interaction-kernels", "0.4.5", "-py3-none-any.whl",
     "ccb09faf2bb4a48a56ced3aaccf63f4616d64f58038e23d4a09c0300a52e5b34"),
)

GGML_PREFIX = "llama_cpp_python-0.3.36/vendor/llama.cpp/ggml/src/"
MLX_PREFIX = "mlx/include/"
MLX_KERNELS = "mlx/backend/metal/kernels/"

# MLX's kernel headers are not self-contained: MLX's own .metal files (not in the wheel) include
# utils.h first, and the steel kernels, quantization, scatter, reduction ops and searchsorted the headers below
# (as steel_gemm_*.metal, steel_conv*.metal, quantized.metal, scatter.metal and searchsorted.metal
# do); the corpus compiles each header after the same includes.
MLX_PRELUDES = (
    (("steel/gemm/kernels/", "quantized.h", "fp_quantized.h"), ("steel/gemm/gemm.h",)),
    (("steel/conv/kernels/", "steel/conv/loader"), ("steel/conv/conv.h", "steel/conv/params.h")),
    (("indexing/scatter",), ("atomic.h", "reduction/ops.h")),
    (("reduction/ops.h",), ("atomic.h",)),  # as reduce_utils.h includes it
    (("reduce.h", "reduction/reduce_"), ("atomic.h", "reduction/ops.h")),  # as reduce.metal includes them
    (("searchsorted.h",), ("sort.h",)),
)


def mlx_prelude(header: str) -> list[str]:
    """The includes (paths under the wheel's include directory) before an MLX kernel header."""
    extra = next((h for prefixes, h in MLX_PRELUDES if header.startswith(prefixes)), ())
    return [MLX_KERNELS + h for h in ("utils.h", *extra)]

PROBE = "kernel void corpus_probe(device int* x [[buffer(0)]]) { x[0] = 0; }\n"


def cache() -> Path:
    return check_macos.cache_dir() / "corpus"


def ggml_dir() -> Path:
    return cache() / f"ggml-{LLAMA[1]}"


def mlx_dir() -> Path:
    return cache() / f"mlx-metal-{MLX[1]}"


def wheel_dir(package: str, version: str) -> Path:
    return cache() / f"{package}-{version}"


def _unpack_metal(wheel, out: Path) -> None:
    """The wheel's .metal files, at their paths in it."""
    for name in wheel.namelist():
        if name.endswith(".metal"):
            target = out / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(wheel.read(name))


def torch_include() -> Path:
    return check_macos.torch_cache(TORCH[1]) / "include"


def _unpack_ggml(sdist: tarfile.TarFile, out: Path) -> None:
    """ggml-metal/ (kernels and the headers they include) and ggml-common.h."""
    for member in sdist.getmembers():
        name = member.name
        if not (member.isfile() and name.startswith(GGML_PREFIX)):
            continue
        rel = name[len(GGML_PREFIX):]
        if rel == "ggml-common.h" or (rel.startswith("ggml-metal/") and rel.endswith((".metal", ".h"))):
            target = out / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(sdist.extractfile(member).read())


def available() -> bool:
    return ggml_dir().is_dir() and mlx_dir().is_dir() and (torch_include() / "c10" / "metal").is_dir() and all(
        wheel_dir(package, version).is_dir() for package, version, *_ in METAL_WHEELS)


def fetch() -> None:
    """Downloads what is not cached yet (sha256-pinned); exits with a message when it cannot."""
    check_macos.fetch(*LLAMA[:3], ggml_dir(), _unpack_ggml, sha256=LLAMA[3])
    check_macos.fetch(*MLX[:3], mlx_dir(), lambda wheel, out: check_macos.extract(
        wheel, out / MLX_KERNELS, MLX_PREFIX + MLX_KERNELS), sha256=MLX[3])
    for package, version, tag, sha256 in METAL_WHEELS:
        check_macos.fetch(package, version, tag, wheel_dir(package, version), _unpack_metal, sha256=sha256)
    if not check_macos.torch_cache(TORCH[1]).is_dir():
        check_macos.install_tools()  # the torch cache keeps export lists made with llvm-nm
        check_macos.fetch(*TORCH[:3], check_macos.torch_cache(TORCH[1]), check_macos.unpack_torch, sha256=TORCH[3])


class Entry(NamedTuple):
    name: str  # e.g. "ggml/norm.metal", "mlx/unary.h", "c10/utils.h"
    source: Path  # the .metal file to compile
    include_dirs: tuple[Path, ...]
    file: Path  # the corpus file it compiles (source, or the file a wrapper includes)


def _wrapper(stem: str, text: str) -> Path:
    """A .metal file of ``text`` in the cache, named by its text too: checkouts that wrap a file differently
    share the cache."""
    wrapper = cache() / "wrappers" / f"{stem}-{hashlib.sha256(text.encode()).hexdigest()[:8]}.metal"
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    if not wrapper.is_file() or wrapper.read_text() != text:
        wrapper.write_text(text)
    return wrapper


def _ggml_entries() -> list[Entry]:
    """ggml's kernels/*.metal as shipped. One that other kernel files include (fa_common.metal) is compiled as
    they use it: after the includes that precede it there, with one trivial kernel (its kernels are templates
    that the including files instantiate)."""
    ggml = ggml_dir()
    kernels = ggml / "ggml-metal" / "kernels"
    files = sorted(kernels.glob("*.metal"))
    preamble = {}  # included file -> the lines before its #include in the first file including it
    for f in files:
        lines = f.read_text().splitlines(keepends=True)
        for k, line in enumerate(lines):
            included = re.fullmatch(r'\s*#include\s+"([^"]+\.metal)"\s*', line)
            if included:
                preamble.setdefault(included.group(1), "".join(l for l in lines[:k] if l.lstrip().startswith("#")))
    out = []
    for f in files:
        if f.name in preamble:
            text = f'{preamble[f.name]}#include "{f.name}"\n{PROBE}'
            wrapper = _wrapper(f"ggml__{f.name}", text)
            out.append(Entry(f"ggml/{f.name}", wrapper, (kernels, ggml / "ggml-metal", ggml), f))
        else:
            out.append(Entry(f"ggml/{f.name}", f, (ggml / "ggml-metal", ggml), f))
    return out


def entries() -> list[Entry]:
    """Every corpus file, as the .metal file that compiles it."""
    out = _ggml_entries()
    headers = [("mlx", mlx_dir(), h) for h in sorted((mlx_dir() / MLX_KERNELS).rglob("*.h"))]
    headers += [("c10", torch_include(), h) for h in sorted((torch_include() / "c10" / "metal").glob("*.h"))]
    for tag, root, header in headers:
        rel = header.relative_to(root).as_posix()
        short = rel[len(MLX_KERNELS):] if tag == "mlx" else rel[len("c10/metal/"):]
        prelude = "".join(f'#include "{h}"\n' for h in mlx_prelude(short)) if tag == "mlx" else ""
        text = f'#include <metal_stdlib>\n{prelude}#include "{rel}"\n{PROBE}'
        wrapper = _wrapper(f"{tag}__{rel.replace('/', '__')}", text)
        out.append(Entry(f"{tag}/{short}", wrapper, (root,), header))
    for package, version, *_ in METAL_WHEELS:
        root = wheel_dir(package, version)
        out += [Entry(f"{package}/{f.name}", f, (f.parent,), f) for f in sorted(root.rglob("*.metal"))]
    return out


def compile_entry(entry: Entry, msl_version: str = "3.1") -> None:
    """Compiles one corpus file for the simulator, building no library (raises mps_ext.sim.CompileError)."""
    from mps_ext.sim import compiler

    compiler.check_file(entry.source, include_dirs=entry.include_dirs, msl_version=msl_version)


# What reads differently when a source targets MSL 3.2 instead of 3.1 (mps_ext.sim's msl_version): the names
# 3.2 adds (<metal_logging>'s os_log and os_log_default, coherent(device)) and __METAL_VERSION__ compared with
# a number that 310 and 320 fall on different sides of.
_MSL32_NAMES = re.compile(r"\b(?:metal_logging|os_log|os_log_default|coherent)\b")
_VERSION_TEST = re.compile(r"__METAL_VERSION__\s*\)?\s*(>=|<=|==|!=|>|<)\s*(\d+)")
_COMPARE = {">=": int.__ge__, "<=": int.__le__, "==": int.__eq__, "!=": int.__ne__, ">": int.__gt__,
            "<": int.__lt__}
_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


@functools.cache
def _text(path: Path) -> str:
    return path.read_text(errors="replace")


@functools.cache
def _reads_differently_under_msl32(path: Path) -> bool:
    text = _text(path)
    return bool(_MSL32_NAMES.search(text)) or any(
        _COMPARE[op](310, int(n)) != _COMPARE[op](320, int(n)) for op, n in _VERSION_TEST.findall(text))


@functools.cache
def _included(f: Path, include_dirs: tuple[Path, ...]) -> tuple[Path, ...]:
    """The files ``f`` includes with quotes, found as the preprocessor finds them: next to ``f``, then in the
    include directories."""
    found = (next((d / name for d in (f.parent, *include_dirs) if (d / name).is_file()), None)
             for name in _INCLUDE.findall(_text(f)))
    return tuple(path.resolve() for path in found if path)


def _includes(entry: Entry) -> list[Path]:
    """The files an entry's source includes with quotes, directly or not, the source first."""
    seen, todo = {}, [entry.source]
    while todo:
        f = todo.pop()
        if f not in seen:
            seen[f] = None
            todo += _included(f, entry.include_dirs)
    return list(seen)


def msl32_entries(all_entries: list[Entry]) -> list[Entry]:
    """The entries that check the corpus under MSL 3.2 too. Only a file that reads differently under 3.2 (names
    what 3.2 adds, or tests __METAL_VERSION__ against 320) can compile differently, and what it changes is its
    own code: each such file is compiled under 3.2 once, by its own entry, or by the first entry that
    includes it when it has none. Any other entry compiles as under 3.1 (the simulator's 3.2 library only adds
    <metal_logging>'s names, which these files do not use)."""
    own = {e.file.resolve(): e for e in all_entries}
    chosen: dict[Path, Entry] = {}
    for entry in all_entries:
        for f in _includes(entry):
            if f not in chosen and _reads_differently_under_msl32(f):
                chosen[f] = own.get(f, entry)
    return [e for e in all_entries if e in chosen.values()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fetch", action="store_true", help="only fetch the corpus")
    parser.add_argument("--msl-version", default="3.1", help="the MSL version the files target (3.1 or 3.2)")
    args = parser.parse_args()
    fetch()
    if args.fetch:
        return 0
    sys.path.insert(0, str(ROOT))
    import mps_ext.sim

    ok = 0
    all_entries = entries()
    print("| file | compiles | why not |\n|---|---|---|")
    for entry in all_entries:
        start = time.time()
        try:
            compile_entry(entry, args.msl_version)
            ok += 1
            print(f"| {entry.name} | yes ({time.time() - start:.0f} s) | |", flush=True)
        except mps_ext.sim.CompileError as e:
            first = next((line for line in str(e).splitlines() if "error" in line), str(e).splitlines()[0])
            print(f"| {entry.name} | no | {first[:200]} |", flush=True)
    print(f"\n{ok} of {len(all_entries)} compile ({100 * ok / len(all_entries):.0f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
