"""Compile .metal sources into simulator modules (shared libraries), cached on disk.

The cache key is the translated C++ (so edits to included headers count), the
simulator headers it includes, the compiler and the flags. Writes are atomic
renames, so concurrent test processes can share the cache.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .translate import TranslateError, translate

__all__ = ["CompileError", "Toolchain", "cache_dir", "compile_file", "compile_source", "shim_include_dir", "toolchain"]

def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


_FLAGS = ("-O2", "-g", "-fPIC", "-shared", "-fvisibility=hidden", "-fno-strict-aliasing",
          "-Wno-unknown-pragmas", "-Wno-unused-variable", "-Wno-unused-but-set-variable",
          # Large stack frames probe every page, so an overflow hits the guard page
          # below the GPU thread's stack instead of the next thread's stack.
          *(("-fstack-clash-protection",) if sys.platform == "linux" else ()),
          # Hardware half<->float conversion instead of a libgcc call per element.
          *(("-mf16c",) if platform.machine() == "x86_64" and "f16c" in _cpu_flags() else ()))
# Address spaces as distinct types (mtlsim/address_space.h) need clang's
# address_space attribute and C++23's explicit object parameters.
ADDRESS_SPACE_FLAGS = ("-std=c++2b", "-DMTLSIM_ADDRESS_SPACES=1")
_ERASED_FLAGS = ("-std=c++17",)


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


@dataclasses.dataclass(frozen=True)
class Toolchain:
    """The compiler the simulator builds kernels with, and whether it keeps address spaces as types."""

    cxx: str
    address_spaces: bool
    note: str  # why address spaces are erased, or "" when they are kept

    @property
    def flags(self) -> tuple[str, ...]:
        return (*(ADDRESS_SPACE_FLAGS if self.address_spaces else _ERASED_FLAGS), *_FLAGS)


def _clang_candidates() -> list[str]:
    """clang++ on PATH, then clang++-NN newest first; on macOS, Xcode's."""
    found = ["clang++"] if shutil.which("clang++") else []
    versioned = set()
    for d in os.environ.get("PATH", "").split(os.pathsep):
        try:
            versioned.update(n for n in os.listdir(d) if re.fullmatch(r"clang\+\+-\d+", n))
        except OSError:
            pass
    found += sorted(versioned, key=lambda n: -int(n.rsplit("-", 1)[1]))
    if sys.platform == "darwin":
        xcrun = subprocess.run(["xcrun", "-f", "clang++"], capture_output=True, text=True)
        if xcrun.returncode == 0 and xcrun.stdout.strip():
            found.append(xcrun.stdout.strip())
    return found


@functools.lru_cache(maxsize=None)
def _keeps_address_spaces(cxx: str) -> bool:
    """Whether ``cxx`` compiles the shim's address-space header in strict mode."""
    probe = '#include "mtlsim/address_space.h"\nvoid f(MTLSIM_DEVICE float* p) { mtlsim::as_generic(*p) = 0; }\n'
    try:
        proc = subprocess.run([cxx, *ADDRESS_SPACE_FLAGS, "-fsyntax-only", "-x", "c++", "-I", str(shim_include_dir()), "-"],
                              input=probe, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


@functools.lru_cache(maxsize=None)
def _select(explicit: str | None, mode: str) -> Toolchain:
    if mode == "0":
        return Toolchain(explicit or os.environ.get("CXX", "c++"), False, "MPS_EXT_SIM_ADDRESS_SPACES=0")
    candidates = [explicit] if explicit else _clang_candidates()
    for cxx in candidates:
        if _keeps_address_spaces(cxx):
            return Toolchain(cxx, True, "")
    note = (f"{explicit} cannot keep address spaces (needs clang >= 18)" if explicit
            else "no clang >= 18 found (set MPS_EXT_SIM_CXX, or install clang)")
    if mode == "1":
        raise CompileError(f"MPS_EXT_SIM_ADDRESS_SPACES=1 but {note}")
    return Toolchain(explicit or os.environ.get("CXX", "c++"), False, note)


def toolchain() -> Toolchain:
    """The compiler for kernels: ``$MPS_EXT_SIM_CXX``, else the newest clang found (clang++, clang++-NN,
    Xcode's), which keeps MSL address spaces as distinct types; without one, ``$CXX`` (default ``c++``)
    with address spaces erased, so conversions between them go unchecked.

    ``MPS_EXT_SIM_ADDRESS_SPACES=1`` makes a missing clang an error, ``=0`` erases address spaces.
    """
    mode = os.environ.get("MPS_EXT_SIM_ADDRESS_SPACES", "")
    return _select(os.environ.get("MPS_EXT_SIM_CXX") or None, mode)



@functools.lru_cache(maxsize=None)
def _toolchain_digest(tc: Toolchain) -> str:
    h = hashlib.sha256()
    h.update(" ".join(tc.flags).encode())
    h.update(subprocess.run([tc.cxx, "--version"], capture_output=True, text=True).stdout.encode())
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
    cache, tc = cache_dir(), toolchain()
    try:
        tr = translate(metal, include_dirs=(metal.parent, *include_dirs), cxx=tc.cxx, constants=constants)
    except TranslateError as e:
        raise CompileError(str(e)) from None
    if not tr.kernels:
        raise CompileError(f"{metal}: no kernel functions found")
    key = hashlib.sha256((tr.cpp + _toolchain_digest(tc)).encode()).hexdigest()[:20]
    lib = cache / f"{metal.stem}-{key}{'.dylib' if sys.platform == 'darwin' else '.so'}"
    if lib.exists():
        return lib
    cpp = cache / f"{metal.stem}-{key}.cpp"
    _write_atomically(cpp, tr.cpp)
    fd, tmp = tempfile.mkstemp(dir=cache, prefix=lib.name + ".", suffix=".tmp")
    os.close(fd)
    cmd = [tc.cxx, *tc.flags, "-I", str(shim_include_dir()), str(cpp), "-o", tmp]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        os.unlink(tmp)
        raise CompileError(f"compiling {metal} for the simulator failed:\n{proc.stderr.strip()}")
    os.replace(tmp, lib)
    return lib
