"""Compile .metal sources into simulator modules (shared libraries), cached on disk.

The cache key is the translated C++ (so edits to included headers count), the
simulator headers it includes, the compiler and the flags. Writes are atomic
renames, so concurrent test processes can share the cache.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from .translate import TranslateError, translate

__all__ = ["CompileError", "cache_dir", "compile_file", "compile_source", "shim_include_dir"]

def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


_FLAGS = ("-std=c++17", "-O2", "-g", "-fPIC", "-shared", "-fvisibility=hidden", "-fno-strict-aliasing",
          "-Wno-unknown-pragmas", "-Wno-unused-variable", "-Wno-unused-but-set-variable",
          # Large stack frames probe every page, so an overflow hits the guard page
          # below the GPU thread's stack instead of the next thread's stack.
          *(("-fstack-clash-protection",) if sys.platform == "linux" else ()),
          # Hardware half<->float conversion instead of a libgcc call per element.
          *(("-mf16c",) if platform.machine() == "x86_64" and "f16c" in _cpu_flags() else ()))


class CompileError(RuntimeError):
    """A kernel source failed to translate or compile; the message holds the compiler's diagnostics."""


def shim_include_dir() -> Path:
    """The simulator's headers: packaged next to this file, or in the source tree."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "include", here.parent.parent / "csrc" / "sim" / "include"):
        if (candidate / "mtlsim" / "prelude.h").is_file():
            return candidate
    raise CompileError("the simulator's headers (mtlsim/prelude.h) are missing from this installation")


def cache_dir() -> Path:
    """``$MPS_EXT_CACHE_DIR`` or ``$XDG_CACHE_HOME/mps_ext`` (default ``~/.cache/mps_ext``), plus ``sim``."""
    root = os.environ.get("MPS_EXT_CACHE_DIR")
    if not root:
        root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "mps_ext")
    path = Path(root) / "sim"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _cxx() -> str:
    return os.environ.get("CXX", "c++")


@functools.lru_cache(maxsize=None)
def _toolchain_digest(cxx: str) -> str:
    h = hashlib.sha256()
    h.update(" ".join(_FLAGS).encode())
    h.update(subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.encode())
    for header in sorted((shim_include_dir() / "mtlsim").glob("*.h")):
        h.update(header.name.encode())
        h.update(header.read_bytes())
    return h.hexdigest()


def _write_atomically(path: Path, data: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    with os.fdopen(fd, "w") as f:
        f.write(data)
    os.replace(tmp, path)


def compile_source(source: str, name: str = "shader", include_dirs=(), constants=None) -> Path:
    """Compile MSL ``source`` text; it is stored as ``<cache>/<name>-<hash>.metal`` for diagnostics."""
    metal = cache_dir() / f"{name}-{hashlib.sha256(source.encode()).hexdigest()[:16]}.metal"
    if not metal.exists():
        _write_atomically(metal, source)
    return compile_file(metal, include_dirs, constants)


def compile_file(metal, include_dirs=(), constants=None) -> Path:
    """Translate and compile one .metal file; returns the path of the loadable module.

    ``constants`` ({name or index: value}) are the values of its function constants.
    """
    metal = Path(metal).resolve()
    cache, cxx = cache_dir(), _cxx()
    try:
        tr = translate(metal, include_dirs=(metal.parent, *include_dirs), cxx=cxx, constants=constants)
    except TranslateError as e:
        raise CompileError(str(e)) from None
    if not tr.kernels:
        raise CompileError(f"{metal}: no kernel functions found")
    key = hashlib.sha256((tr.cpp + _toolchain_digest(cxx)).encode()).hexdigest()[:20]
    lib = cache / f"{metal.stem}-{key}{'.dylib' if sys.platform == 'darwin' else '.so'}"
    if lib.exists():
        return lib
    cpp = cache / f"{metal.stem}-{key}.cpp"
    _write_atomically(cpp, tr.cpp)
    fd, tmp = tempfile.mkstemp(dir=cache, prefix=lib.name + ".", suffix=".tmp")
    os.close(fd)
    cmd = [cxx, *_FLAGS, "-I", str(shim_include_dir()), str(cpp), "-o", tmp]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        os.unlink(tmp)
        raise CompileError(f"compiling {metal} for the simulator failed:\n{proc.stderr.strip()}")
    os.replace(tmp, lib)
    return lib
