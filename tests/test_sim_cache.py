"""The simulator's disk cache: what it loads is what this process compiled from the caller's text, in
directories only this user can write, and the compiler subprocess is bounded."""

import math
import os
import shutil
import signal
import stat
import sys
import threading
from pathlib import Path

import pytest
import torch

from conftest import run_python

import mps_ext.sim
from mps_ext.sim import CompileError, compiler

FILL = """
kernel void fill(device float* x [[buffer(0)]], uint i [[thread_position_in_grid]]) { x[i] = %s; }
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("MPS_EXT_CACHE_DIR", str(root))
    return root


def run_fill(lib) -> float:
    x = torch.zeros(4)
    lib.fill(x)
    return x[0].item()


def library_path(source: str, name: str = "shader") -> Path:
    return compiler.compile_source(source, name)


def test_cache_directories_are_private_whatever_the_umask(cache):
    old = os.umask(0)
    try:
        library_path(FILL % "1.0f")
    finally:
        os.umask(old)
    for d in (cache, cache / "sim"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, oct(d.stat().st_mode)
    for f in (cache / "sim").iterdir():
        assert stat.S_IMODE(f.stat().st_mode) & 0o022 == 0, f


@pytest.mark.parametrize("which", ["root", "sim"])
def test_cache_directory_others_can_write_is_refused(cache, which):
    (cache / "sim").mkdir(parents=True)
    os.chmod(cache / "sim", 0o700)
    os.chmod(cache, 0o700)
    os.chmod(cache if which == "root" else cache / "sim", 0o777)
    with pytest.raises(CompileError, match="writable by other users"):
        mps_ext.sim.compile_shader(FILL % "1.0f")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_cache_directory_of_another_user_is_refused(cache):
    (cache / "sim").mkdir(parents=True, mode=0o700)
    os.chmod(cache, 0o700)
    os.chown(cache / "sim", 12345, 12345)
    with pytest.raises(CompileError, match="owned by"):
        mps_ext.sim.compile_shader(FILL % "1.0f")


def test_planted_source_is_not_compiled(cache):
    source = FILL % "1.0f"
    metal = library_path(FILL % "9.0f").parent / f"shader-{compiler.source_digest(source)}.metal"
    metal.write_text(FILL % "666.0f")  # what someone else left under the expected name
    assert run_fill(mps_ext.sim.compile_shader(source)) == 1.0


def test_planted_library_is_not_loaded(cache):
    source = FILL % "2.0f"
    mine, other = library_path(source, "planted"), library_path(FILL % "666.0f", "other")
    shutil.copyfile(other, mine)
    assert run_fill(mps_ext.sim.compile_shader(source, name="planted")) == 2.0


@pytest.mark.parametrize("damage", ["truncate", "empty", "garbage"])
def test_damaged_library_is_rebuilt(cache, damage):
    source = FILL % f"{len(damage)}.0f"
    lib = library_path(source, damage)
    data = lib.read_bytes()
    lib.write_bytes({"truncate": data[: len(data) // 10], "empty": b"", "garbage": os.urandom(len(data))}[damage])
    assert run_fill(mps_ext.sim.compile_shader(source, name=damage)) == float(len(damage))
    assert lib.read_bytes() != b""


def entry_files(lib: Path) -> list[Path]:
    """The files of one cache entry: the library, its digest, its C++ and its build's lock."""
    return sorted(lib.parent.glob(lib.name.split(".", 1)[0] + ".*"))


def test_cache_keeps_to_its_size_by_removing_what_was_used_longest_ago(cache, monkeypatch):
    libs = [library_path(FILL % f"{v}.0f", f"k{v}") for v in range(3)]
    sizes = [sum(f.stat().st_size for f in entry_files(lib)) for lib in libs]
    assert all(len(entry_files(lib)) == 4 for lib in libs)  # .so, .so.sha256, .cpp, .so.lock
    hour = 3600
    aged = [(4 * hour, f) for f in (cache / "sim").glob("*.metal")]  # the kept sources: their own entries
    aged += [(age, f) for age, lib in zip((3 * hour, 2 * hour, 1 * hour), libs) for f in entry_files(lib)]
    for age, f in aged:  # k0 used longest ago
        os.utime(f, (f.stat().st_atime, f.stat().st_mtime - age))
    library_path(FILL % "0.0f", "k0")  # loading k0 again makes it the most recently used
    # Room for about two entries: building a fourth removes the oldest ones until the cache is under 3/4 of it.
    monkeypatch.setenv("MPS_EXT_SIM_CACHE_MB", str(2.2 * max(sizes) / 2 ** 20))
    monkeypatch.setattr(compiler, "_last_prune", -math.inf)  # a process measures the cache every 30 s at most
    newest = library_path(FILL % "3.0f", "k3")
    assert libs[0].exists() and newest.exists()  # used now, built now
    assert not any(f.exists() for lib in libs[1:] for f in entry_files(lib))  # k1, k2 went whole
    assert not list((cache / "sim").glob("*.tmp"))
    assert run_fill(mps_ext.sim.Library(libs[0])) == 0.0 and run_fill(mps_ext.sim.Library(newest)) == 3.0


def test_cache_never_removes_what_was_used_lately(cache, monkeypatch):
    # Another process may be about to load an entry: one used in the last ten minutes stays, over the limit.
    first = library_path(FILL % "1.0f", "a")
    monkeypatch.setenv("MPS_EXT_SIM_CACHE_MB", "0.001")
    monkeypatch.setattr(compiler, "_last_prune", -math.inf)
    second = library_path(FILL % "2.0f", "b")
    assert first.exists() and second.exists()


def test_who_misses_a_library_another_is_building_waits_and_loads_it(cache, monkeypatch):
    # The test suite's workers start on the same kernels: one compiles each, the others load it.
    compiles = []
    run = compiler._run

    def counted(cmd, what):
        if what.startswith("compiling"):
            compiles.append(what)
        return run(cmd, what)

    monkeypatch.setattr(compiler, "_run", counted)
    together = threading.Barrier(3)
    libs = []

    def build():
        together.wait()
        libs.append(library_path(FILL % "7.0f", "same"))

    threads = [threading.Thread(target=build) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(libs) == 3 and len(set(libs)) == 1
    assert len(compiles) == 1, compiles
    assert run_fill(mps_ext.sim.Library(libs[0])) == 7.0


def test_a_cache_on_a_file_system_without_locks_still_builds(cache, monkeypatch):
    def no_locks(fd, operation):
        raise OSError(37, "No locks available")

    monkeypatch.setattr(compiler.fcntl, "flock", no_locks)
    assert run_fill(mps_ext.sim.Library(library_path(FILL % "8.0f", "unlocked"))) == 8.0


@pytest.mark.parametrize("name", ["MPS_EXT_SIM_CACHE_MB", "MPS_EXT_SIM_COMPILE_MEMORY_MB", "MPS_EXT_SIM_COMPILE_TIMEOUT"])
@pytest.mark.parametrize("value", ["0", "-1", "lots", "inf", "1e400", "nan", "1e30"])
def test_limits_from_the_environment_must_be_positive_numbers(cache, monkeypatch, name, value):
    # Infinite or huge values would overflow what they are converted to (a byte count, a wait): the error
    # names the variable instead.
    monkeypatch.setenv(name, value)
    with pytest.raises(CompileError, match=f"{name}='{value}': expected a positive number of "):
        library_path(FILL % "5.0f", "c")


def test_address_spaces_mode_must_be_0_or_1(cache, monkeypatch):
    monkeypatch.setenv("MPS_EXT_SIM_ADDRESS_SPACES", "yes")
    with pytest.raises(CompileError, match="MPS_EXT_SIM_ADDRESS_SPACES='yes': expected 0, 1 or nothing"):
        library_path(FILL % "5.0f", "c")


@pytest.mark.parametrize("name", ["../../x", "a/b", "..", ".hidden", "", "x\0y", "/abs"])
def test_name_stays_inside_the_cache(cache, name):
    with pytest.raises(ValueError, match="name"):
        mps_ext.sim.compile_shader(FILL % "1.0f", name=name)


def fake_compiler(tmp_path: Path, body: str) -> str:
    script = tmp_path / "fake-cxx"
    # Preprocesses with the real compiler (the translator's step), then does `body` instead of compiling.
    script.write_text(f'''#!/bin/sh
case " $* " in *" -E "*) exec c++ "$@";; esac
if [ "$1" = --version ]; then echo fake 1.0; exit 0; fi
{body}
''')
    script.chmod(0o755)
    return str(script)


@pytest.fixture
def cxx(monkeypatch):
    """Sets $CXX, the compiler of the mode without address spaces, and selects that mode."""
    monkeypatch.setenv("MPS_EXT_SIM_ADDRESS_SPACES", "0")
    return lambda value: monkeypatch.setenv("CXX", value)


def test_interrupted_compile_leaves_no_temporary_files(cache, tmp_path, cxx):
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("Ctrl-C reaches the main thread only")
    cxx(fake_compiler(tmp_path, "sleep 60"))
    timer = threading.Timer(3.0, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            mps_ext.sim.compile_shader(FILL % "3.0f", name="interrupted")
    finally:
        timer.cancel()
    left = sorted(p.name for p in (cache / "sim").iterdir())
    assert all(n.endswith((".metal", ".cpp", ".lock")) for n in left), left  # the lock is the entry's, not temporary


def test_cxx_with_arguments(cache, cxx):
    cxx(f"{shutil.which('c++') or 'c++'} -DMPS_EXT_UNUSED_DEFINE=1")
    assert run_fill(mps_ext.sim.compile_shader(FILL % "4.0f")) == 4.0


def test_missing_compiler_is_a_compile_error(cache, cxx):
    cxx("/nonexistent/c++")
    with pytest.raises(CompileError, match="/nonexistent/c\\+\\+"):
        mps_ext.sim.compile_shader(FILL % "5.0f")


def test_compiler_time_limit(cache, tmp_path, monkeypatch, cxx):
    cxx(fake_compiler(tmp_path, "sleep 60"))
    monkeypatch.setenv("MPS_EXT_SIM_COMPILE_TIMEOUT", "1")
    with pytest.raises(CompileError, match="timed out after 1 s.*MPS_EXT_SIM_COMPILE_TIMEOUT"):
        mps_ext.sim.compile_shader(FILL % "6.0f")


LOWER_LIMIT = """
import resource
resource.setrlimit(resource.RLIMIT_AS, ({kib} * 1024, {kib} * 1024))  # as `ulimit -v {kib}` in a shell
import torch, mps_ext.sim
lib = mps_ext.sim.compile_shader({source!r}, name="limited")
x = torch.zeros(4)
lib.fill(x)
print(x[0].item())
"""


@pytest.mark.skipif(sys.platform != "linux", reason="the memory limit is an address-space rlimit")
def test_compiling_under_a_lower_address_space_limit_of_ones_own(cache):
    # A process whose own `ulimit -v` is below the compiler's 8 GiB cannot raise it: the compiler runs under the
    # process's limit (6 GiB here) and the kernel builds and runs.
    p = run_python(LOWER_LIMIT.format(kib=6 << 20, source=FILL % "9.0f"), env={"MPS_EXT_CACHE_DIR": str(cache)},
                   timeout=600)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split()[-1] == "9.0"


@pytest.mark.skipif(sys.platform != "linux", reason="the memory limit is an address-space rlimit")
def test_a_compile_failing_under_ones_own_lower_limit_says_which_to_raise(cache, tmp_path, monkeypatch, cxx):
    cxx(fake_compiler(tmp_path, 'echo "limit $(ulimit -v)" >&2; exit 1'))
    soft, hard = compiler.resource.getrlimit(compiler.resource.RLIMIT_AS)
    monkeypatch.setattr(compiler.resource, "getrlimit", lambda which: (3 << 30, hard))
    with pytest.raises(CompileError, match=r"(?s)limit 3145728\n.*this process's address-space limit "
                                           r"\(ulimit -v: 3145728 KiB\), below the 8192 MiB.*ulimit -v 8388608"):
        mps_ext.sim.compile_shader(FILL % "7.5f")


@pytest.mark.skipif(sys.platform != "linux", reason="the memory limit is an address-space rlimit")
def test_compiler_memory_limit(cache, tmp_path, monkeypatch, cxx):
    cxx(fake_compiler(tmp_path, 'echo "limit $(ulimit -v)" >&2; exit 1'))
    monkeypatch.setenv("MPS_EXT_SIM_COMPILE_MEMORY_MB", "700")
    with pytest.raises(CompileError, match=f"limit {700 * 1024}"):
        mps_ext.sim.compile_shader(FILL % "7.0f")
