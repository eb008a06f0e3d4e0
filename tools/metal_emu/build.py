#!/usr/bin/env python3
"""Build _metal_emu: csrc/metal/*.mm, the Metal backend as a Mac builds it,
on Linux against the emulated Metal and torch MPS runtime of this directory
(Objective-C++ with clang on the GNU Objective-C runtime and the blocks
runtime), linked with mps_ext._C, whose simulator is the emulated GPU.

    python tools/metal_emu/build.py     prints the path of the built module

Needs clang-19, libobjc-12-dev and libblocksruntime-dev (`missing()` says
which are absent) and a built mps_ext (setup.py also generates the embedded
kernel sources). Objects are rebuilt only when a file they read changed
(clang's -MD lists), so a second run links nothing new.
"""

import os
import shutil
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "tools" / "metal_emu"
OUT = ROOT / "build" / "metal_emu"
CLANG = "clang++-19"
GCC_LIB = Path("/usr/lib/gcc/x86_64-linux-gnu/12")  # Debian's libobjc: headers and library
BLOCKS = Path("/usr/include/Block.h")  # libblocksruntime-dev
MODULE = "_metal_emu"


def missing() -> list[str]:
    """What this machine lacks to build the emulation (Debian package names)."""
    out = [] if shutil.which(CLANG) else ["clang-19"]
    out += [] if (GCC_LIB / "include" / "objc" / "runtime.h").is_file() else ["libobjc-12-dev"]
    return out + ([] if BLOCKS.is_file() else ["libblocksruntime-dev"])


def sources() -> list[Path]:
    return [*sorted((ROOT / "csrc" / "metal").glob("*.mm")), *sorted(HERE.glob("*.mm")), HERE / "module.cpp",
            ROOT / "build" / "mtlsim" / "metal_sources.cpp"]


def compile_command(source: Path, obj: Path) -> list[str]:
    import torch.utils.cpp_extension as ext

    objc = ["-x", "objective-c++", "-fobjc-runtime=gcc", "-fblocks", "-fno-objc-arc"] if source.suffix == ".mm" else []
    system = [HERE / "include", ROOT / "tools" / "macos_sdk_stubs", GCC_LIB / "include", *map(Path, ext.include_paths()),
              Path(sysconfig.get_paths()["include"])]
    ours = [ROOT / "csrc", ROOT / "csrc" / "sim" / "include", ROOT / "metal" / "include", HERE]
    return [CLANG, "-std=c++20", "-fPIC", "-O1", "-g1", *objc, "-fno-strict-aliasing", "-Wno-unknown-pragmas",
            "-D_GLIBCXX_USE_CXX11_ABI=1", f"-DTORCH_EXTENSION_NAME={MODULE}", "-DTORCH_API_INCLUDE_EXTENSION_H",
            *[a for d in system for a in ("-isystem", str(d))], *[a for d in ours for a in ("-I", str(d))],
            "-MD", "-MF", str(obj.with_suffix(".d")), "-c", str(source), "-o", str(obj)]


def stale(obj: Path) -> bool:
    """Whether obj is missing or older than a file its last compile read."""
    depfile = obj.with_suffix(".d")
    if not obj.exists() or not depfile.exists():
        return True
    deps = depfile.read_text().replace("\\\n", " ").split(":", 1)[1].split()
    built = obj.stat().st_mtime
    return any(not Path(d).exists() or Path(d).stat().st_mtime > built for d in deps)


def build() -> Path:
    """The built module's path (built or brought up to date first)."""
    import torch.utils.cpp_extension as ext

    if absent := missing():
        sys.exit(f"metal_emu: needs {', '.join(absent)} (apt-get install {' '.join(absent)})")
    import mps_ext._C as core

    OUT.mkdir(parents=True, exist_ok=True)
    objects = [OUT / (s.stem + s.suffix.replace(".", "_") + ".o") for s in sources()]
    jobs = [(s, o) for s, o in zip(sources(), objects) if stale(o)]

    def run(job):
        return subprocess.run(compile_command(*job), capture_output=True, text=True)

    with ThreadPoolExecutor(os.cpu_count()) as pool:
        for (source, obj), result in zip(jobs, pool.map(run, jobs)):
            if result.returncode:
                obj.unlink(missing_ok=True)
                sys.exit(f"metal_emu: compiling {source} failed:\n{result.stderr}")
    target = OUT / f"{MODULE}{sysconfig.get_config_var('EXT_SUFFIX')}"
    if jobs or not target.exists():
        torch_lib = Path(ext.library_paths()[0])
        core_path = Path(core.__file__)
        command = [CLANG, "-shared", "-o", str(target), *map(str, objects), str(core_path),
                   f"-L{torch_lib}", "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python", f"-L{GCC_LIB}", "-lobjc",
                   "-lBlocksRuntime", f"-Wl,-rpath,{torch_lib}", f"-Wl,-rpath,{core_path.parent}"]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode:
            sys.exit(f"metal_emu: linking failed:\n{result.stderr}")
    return target


if __name__ == "__main__":
    print(build())
