"""Compile .metal sources into simulator modules (shared libraries), cached on disk.

The cache key is the translated C++ (so edits to included headers count), the
simulator headers it includes, the compiler and the flags. A library is
loaded only from a directory that no other user can write, and only if its
bytes match the SHA-256 recorded when this user built it; otherwise it is
rebuilt. Writes are atomic renames, so concurrent test processes can share
the cache. The cache keeps to ``$MPS_EXT_SIM_CACHE_MB`` (default 2048): a
build that takes it past that removes the libraries used longest ago.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import importlib.util
import math
import os
import platform
import re
import resource
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .translate import TranslateError, translate

__all__ = ["CompileError", "Toolchain", "cache_dir", "check_file", "compile_file", "compile_source", "shim_include_dir",
           "source_digest", "toolchain"]

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

# A name= becomes part of a file name in the cache, nothing more.
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
_LIBRARY_SUFFIX = ".dylib" if sys.platform == "darwin" else ".so"


class CompileError(RuntimeError):
    """A kernel source failed to translate or compile; the message holds the compiler's diagnostics."""


def shim_include_dir() -> Path:
    """The simulator's headers: packaged next to this file, or in the source tree."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "include", here.parent.parent / "csrc" / "sim" / "include"):
        if (candidate / "mtlsim" / "prelude.h").is_file():
            return candidate
    raise CompileError("the simulator's headers (mtlsim/prelude.h) are missing from this installation")


def _private_dir(path: Path) -> None:
    """Creates `path` (mode 0700) or checks that only this user can write it: libraries loaded from a
    directory another user can write would run their code in this process."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = path.stat()
    except OSError as e:
        raise CompileError(f"cannot create the simulator's cache directory {path}: {e}") from None
    if st.st_uid != os.geteuid():
        raise CompileError(f"the simulator's cache directory {path} is owned by uid {st.st_uid}, not by this user "
                           f"(uid {os.geteuid()}); set MPS_EXT_CACHE_DIR to a directory of your own")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CompileError(f"the simulator's cache directory {path} is writable by other users (mode "
                           f"{stat.S_IMODE(st.st_mode):o}); make it private (chmod 700) or set MPS_EXT_CACHE_DIR")


def cache_dir() -> Path:
    """``$MPS_EXT_CACHE_DIR`` or ``$XDG_CACHE_HOME/mps_ext`` (default ``~/.cache/mps_ext``), plus ``sim``.

    Both are created private (0700); ones owned by another user or writable by group or others are
    refused with :class:`CompileError`.
    """
    root = os.environ.get("MPS_EXT_CACHE_DIR")
    if not root:
        root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "mps_ext")
    path = Path(root) / "sim"
    _private_dir(Path(root))
    _private_dir(path)
    return path


# A library used (built or loaded) in the last ten minutes is never removed to make room: another
# process may be about to load it.
_KEEP_RECENT_S = 600
# A process measures the cache after a build at most this often (a scan of a large cache takes tens of
# milliseconds, a build seconds; the test suite builds hundreds).
_PRUNE_EVERY_S = 30
_last_prune = -math.inf


def _cache_limit() -> int:
    """``$MPS_EXT_SIM_CACHE_MB`` (default 2048) in bytes."""
    return int(_env_limit("MPS_EXT_SIM_CACHE_MB", 2048, "megabytes", _MOST_MEGABYTES) * 2 ** 20)


def _used(path: Path) -> None:
    # A cached file's modification time is when it was last used: what _prune removes first is the oldest.
    try:
        os.utime(path)
    except OSError:
        pass


def _prune(directory: Path) -> None:
    """Past the cache's size limit, removes whole entries (a library with its C++, digest and check mark,
    or a kept .metal source), the ones used longest ago first, until it is back under three quarters of
    the limit; entries used in the last ``_KEEP_RECENT_S`` seconds stay. At most every ``_PRUNE_EVERY_S``
    seconds per process."""
    global _last_prune
    limit = _cache_limit()
    if time.monotonic() - _last_prune < _PRUNE_EVERY_S:
        return
    _last_prune = time.monotonic()
    entries: dict[str, list] = {}  # name up to its first dot -> [(path, size, mtime)]
    with os.scandir(directory) as it:
        for f in it:
            if f.name.endswith(".tmp") or not f.is_file(follow_symlinks=False):
                continue
            try:
                st = f.stat(follow_symlinks=False)
            except OSError:  # removed meanwhile by another process
                continue
            entries.setdefault(f.name.split(".", 1)[0], []).append((f.path, st.st_size, st.st_mtime))
    total = sum(size for files in entries.values() for _, size, _ in files)
    if total <= limit:
        return
    recent = time.time() - _KEEP_RECENT_S
    for files in sorted(entries.values(), key=lambda files: max(mtime for _, _, mtime in files)):
        if total <= limit * 3 // 4 or max(mtime for _, _, mtime in files) > recent:
            break
        for path, size, _ in files:
            Path(path).unlink(missing_ok=True)
            total -= size


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
    """clang++ on PATH, then clang++-NN newest first; on macOS, Xcode's; last, the clang of the ``ziglang``
    package (``pip install "mps_ext[strict]"``), for a user who cannot install a system clang."""
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
    if importlib.util.find_spec("ziglang") is not None:
        found.append(shlex.join([sys.executable, "-m", "ziglang", "c++"]))
    return found


# The largest values the limits take: what the operating system's calls hold (a wait's milliseconds in a
# C int, an rlimit's bytes in 64 bits).
_MOST_SECONDS = 2 ** 31 // 1000 - 1
_MOST_MEGABYTES = 2 ** 43


def _env_limit(name: str, default: float, unit: str, most: float) -> float:
    """``$name`` as a number, ``default`` when unset; anything but a positive number up to ``most`` (``inf``,
    ``1e400``, words) is an error naming the variable."""
    value = os.environ.get(name)
    if not value:
        return default
    try:
        limit = float(value)
    except ValueError:
        limit = math.nan
    if not 0 < limit <= most:
        raise CompileError(f"{name}={value!r}: expected a positive number of {unit}, at most {most:g}")
    return limit


def _address_space_kib() -> tuple[int, str]:
    """The address-space limit of a compiler run, in KiB: ``$MPS_EXT_SIM_COMPILE_MEMORY_MB`` (default 8192), or
    the process's own soft limit where that is lower (a process cannot raise its hard limit: the compiler runs
    under the lower one); with a note for a failed run when the process's limit decided it."""
    kib = int(_env_limit("MPS_EXT_SIM_COMPILE_MEMORY_MB", 8192, "megabytes", _MOST_MEGABYTES) * 1024)
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY or soft // 1024 >= kib:
        return kib, ""
    own = soft // 1024
    return own, (f"note: the compiler ran under this process's address-space limit (ulimit -v: {own} KiB), below "
                 f"the {kib // 1024} MiB it is given (MPS_EXT_SIM_COMPILE_MEMORY_MB); if it ran out of memory, "
                 f"raise that limit (ulimit -v {kib} or unlimited) in the shell that starts Python")


def _kill(proc: subprocess.Popen) -> None:
    """Ends the compiler and what it started (cc1plus, as...): they share its session."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _run(cmd: list[str], what: str) -> subprocess.CompletedProcess:
    """Runs a compiler command with a time limit (``MPS_EXT_SIM_COMPILE_TIMEOUT`` seconds, default 600)
    and, on Linux, an address-space limit (``MPS_EXT_SIM_COMPILE_MEMORY_MB``, default 8192)."""
    timeout = _env_limit("MPS_EXT_SIM_COMPILE_TIMEOUT", 600, "seconds", _MOST_SECONDS)
    note = ""
    if sys.platform == "linux":
        kib, note = _address_space_kib()
        # The soft limit only: at most the hard one, so setting it cannot fail.
        cmd = ["/bin/sh", "-c", f'ulimit -S -v {kib} && exec "$@"', "sh", *cmd]
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
    except OSError as e:
        raise CompileError(f"cannot run the C++ compiler for {what} ({cmd[0]!r}): {e}") from None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        raise CompileError(f"{what} timed out after {timeout:g} s (MPS_EXT_SIM_COMPILE_TIMEOUT)") from None
    except BaseException:
        _kill(proc)
        raise
    if proc.returncode != 0 and note:
        err = f"{err.rstrip()}\n{note}"
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@functools.lru_cache(maxsize=None)
def _keeps_address_spaces(cxx: str) -> bool:
    """Whether ``cxx`` compiles the shim's address-space header in strict mode."""
    probe = '#include "mtlsim/address_space.h"\nvoid f(MTLSIM_DEVICE float* p) { mtlsim::as_generic(*p) = 0; }\n'
    # Compiled to an object, not -fsyntax-only, which zig's clang driver does not take.
    with tempfile.TemporaryDirectory() as tmp:
        try:
            proc = subprocess.run([*shlex.split(cxx), *ADDRESS_SPACE_FLAGS, "-c", "-x", "c++", "-I", str(shim_include_dir()),
                                   "-", "-o", os.path.join(tmp, "probe.o")],
                                  input=probe, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired):
            return False
    return proc.returncode == 0


@functools.lru_cache(maxsize=None)
def _select(explicit: str | None, mode: str, cxx: str) -> Toolchain:
    if mode == "0":
        return Toolchain(explicit or cxx, False, "MPS_EXT_SIM_ADDRESS_SPACES=0")
    candidates = [explicit] if explicit else _clang_candidates()
    for cxx in candidates:
        if _keeps_address_spaces(cxx):
            return Toolchain(cxx, True, "")
    note = (f"{explicit} cannot keep address spaces (needs clang >= 18)" if explicit
            else 'no clang >= 18 found (install clang, or zig\'s: pip install "mps_ext[strict]"; '
                 "or set MPS_EXT_SIM_CXX)")
    if mode == "1":
        raise CompileError(f"MPS_EXT_SIM_ADDRESS_SPACES=1 but {note}")
    return Toolchain(explicit or cxx, False, note)


def toolchain() -> Toolchain:
    """The compiler for kernels: ``$MPS_EXT_SIM_CXX``, else the newest clang found (clang++, clang++-NN,
    Xcode's), which keeps MSL address spaces as distinct types; without one, ``$CXX`` (default ``c++``)
    with address spaces erased, so conversions between them go unchecked.

    ``MPS_EXT_SIM_ADDRESS_SPACES=1`` makes a missing clang an error, ``=0`` erases address spaces.
    """
    mode = os.environ.get("MPS_EXT_SIM_ADDRESS_SPACES", "")
    if mode not in ("", "0", "1"):
        raise CompileError(f"MPS_EXT_SIM_ADDRESS_SPACES={mode!r}: expected 0, 1 or nothing")
    return _select(os.environ.get("MPS_EXT_SIM_CXX") or None, mode, os.environ.get("CXX", "c++"))



@functools.lru_cache(maxsize=None)
def _toolchain_digest(tc: Toolchain) -> str:
    h = hashlib.sha256()
    h.update(" ".join(tc.flags).encode())
    version = _run([*shlex.split(tc.cxx), "--version"], f"asking {tc.cxx!r} for its version")
    if version.returncode != 0:
        raise CompileError(f"the C++ compiler {tc.cxx!r} does not run: {version.stderr.strip()}")
    h.update(version.stdout.encode())
    for header in sorted((shim_include_dir() / "mtlsim").glob("*.h")):
        h.update(header.name.encode())
        h.update(header.read_bytes())
    return h.hexdigest()


def _write_atomically(path: Path, data: str | bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _digest_path(lib: Path) -> Path:
    return lib.with_name(lib.name + ".sha256")


def _verified(lib: Path) -> bool:
    """Whether `lib` holds exactly the bytes this user's build recorded (not truncated, replaced or empty)."""
    try:
        return hashlib.sha256(lib.read_bytes()).hexdigest() == _digest_path(lib).read_text().strip()
    except OSError:
        return False


def source_digest(source: str) -> str:
    """The part of a cached copy's file name that identifies ``source``."""
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def compile_source(source: str, name: str = "shader", include_dirs=(), constants=None,
                   msl_version: str = "3.1") -> Path:
    """Compile MSL ``source`` text; it is stored as ``<cache>/<name>-<hash>.metal`` for diagnostics."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"name must be a plain file name (letters, digits, '_', '.', '-', not starting with '.', "
                         f"at most 64 characters), got {name!r}")
    metal = cache_dir() / f"{name}-{source_digest(source)}.metal"
    # Always the caller's text: never compile what another process left under this name.
    _write_atomically(metal, source)
    return compile_file(metal, include_dirs, constants, msl_version)


def compile_file(metal, include_dirs=(), constants=None, msl_version: str = "3.1") -> Path:
    """Translate and compile one .metal file; returns the path of the loadable module.

    ``constants`` ({name or index: value}) are the values of its function constants; ``msl_version`` the
    MSL it targets ("3.1" or "3.2").
    """
    metal = Path(metal).resolve()
    tc = toolchain()
    cpp, lib = _translated(metal, include_dirs, constants, tc, msl_version)
    if _verified(lib):
        _used(lib)
        return lib
    with _building(lib):
        if _verified(lib):  # built by another process while this one waited
            _used(lib)
        else:
            _build(cpp, lib, metal, tc)
    return lib


@contextlib.contextmanager
def _building(lib: Path):
    """Holds ``lib``'s lock file: of the processes that miss the same library at once (the test suite's
    workers start on the same kernels), one builds it and the others wait and load it, instead of each
    compiling it again."""
    fd = os.open(lib.with_name(lib.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # a file system without locks (some network mounts): each process builds, as before
            pass
        yield
    finally:
        os.close(fd)


def check_file(metal, include_dirs=(), constants=None, msl_version: str = "3.1") -> None:
    """Translate one .metal file and compile it without optimizing, linking or keeping anything: the
    errors :func:`compile_file` would raise, in about a third of its time, for code that is only
    checked to compile (the upstream corpus)."""
    metal = Path(metal).resolve()
    tc = toolchain()
    cpp_text, lib = _translated(metal, include_dirs, constants, tc, msl_version)
    checked = lib.with_name(lib.name + ".checked")
    if _verified(lib) or checked.exists():
        _used(lib if lib.exists() else checked)
        return
    cpp = lib.with_suffix(".cpp")
    _write_atomically(cpp, cpp_text)
    with tempfile.TemporaryDirectory(dir=cpp.parent) as tmp:
        # Only the diagnostics are wanted: -fsyntax-only, which costs a sixth less than an object at -O0
        # (everything up to code generation), except with zig's clang driver, which does not take it.
        output = ["-c", "-o", os.path.join(tmp, "check.o")] if "ziglang" in tc.cxx else ["-fsyntax-only"]
        cmd = [*shlex.split(tc.cxx), *tc.flags, "-O0", "-g0", *output, "-I", str(shim_include_dir()), str(cpp)]
        proc = _run(cmd, f"compiling {metal} for the simulator")
    if proc.returncode != 0:
        raise _failed(metal, proc.stderr)
    _write_atomically(checked, "")
    _prune(checked.parent)


# MSL rules that the C++ compiler checks for the translator (mps_ext.sim.translate sets them up): its
# diagnostic, and the rule's name as the translator's own errors give it.
_RULE_DIAGNOSTICS = ((re.compile(r"error: ([^\n]*does not have a constant initializer)"), "constant initializer"),)


def _failed(metal: Path, stderr: str) -> CompileError:
    for pattern, rule in _RULE_DIAGNOSTICS:
        stderr = pattern.sub(lambda m: f"error: MSL rule '{rule}': {m.group(1)}", stderr)
    return CompileError(f"compiling {metal} for the simulator failed:\n{stderr.strip()}")


def _translated(metal: Path, include_dirs, constants, tc: Toolchain,
                msl_version: str = "3.1") -> tuple[str, Path]:
    """The C++ translation of ``metal``, and where its library is cached."""
    try:
        tr = translate(metal, include_dirs=(metal.parent, *include_dirs), cxx=tc.cxx, constants=constants,
                       msl_version=msl_version)
    except TranslateError as e:
        raise CompileError(str(e)) from None
    except OSError as e:
        raise CompileError(f"cannot preprocess {metal} with {tc.cxx!r}: {e}") from None
    if not tr.kernels:
        raise CompileError(f"{metal}: no kernel functions found")
    key = hashlib.sha256((tr.cpp + _toolchain_digest(tc)).encode()).hexdigest()[:20]
    return tr.cpp, cache_dir() / f"{metal.stem}-{key}{_LIBRARY_SUFFIX}"


def _build(cpp_text: str, lib: Path, metal: Path, tc: Toolchain) -> None:
    cpp = lib.with_suffix(".cpp")
    _write_atomically(cpp, cpp_text)
    fd, tmp = tempfile.mkstemp(dir=lib.parent, prefix=lib.name + ".", suffix=".tmp")
    os.close(fd)
    try:
        cmd = [*shlex.split(tc.cxx), *tc.flags, "-I", str(shim_include_dir()), str(cpp), "-o", tmp]
        proc = _run(cmd, f"compiling {metal} for the simulator")
        if proc.returncode != 0:
            raise _failed(metal, proc.stderr)
        os.chmod(tmp, 0o700)  # the linker creates its output with the umask's mode
        data = Path(tmp).read_bytes()
        if not data:
            raise CompileError(f"compiling {metal} for the simulator produced an empty library")
        _write_atomically(_digest_path(lib), hashlib.sha256(data).hexdigest())
        os.replace(tmp, lib)
    finally:
        Path(tmp).unlink(missing_ok=True)
    _prune(lib.parent)
