#!/usr/bin/env python3
"""Build _metal_emu: csrc/metal/*.mm, the Metal backend as a Mac builds it,
on Linux against the emulated Metal and torch MPS runtime of this directory
(Objective-C++ with clang on the GNU Objective-C runtime and the blocks
runtime), linked with mps_ext._C, whose simulator is the emulated GPU.

The Metal layer and the emulated runtime are built as for one torch version
of RUNTIMES: the installed torch's, or another's, whose MPS runtime headers
(ATen/mps/MPSDevice.h, MPSEvent.h, MPSStream.h) and version numbers then
come from its macOS wheel (fetched and cached by tools/check_macos.py) ahead
of the installed torch's headers. Only those headers differ: the rest of the
build is the installed torch's, whose libraries it links with, and the
sources that include none of them are compiled once for every runtime.

    python tools/metal_emu/build.py [VERSION]     prints the path of the built module

Needs clang-19, libobjc-12-dev and libblocksruntime-dev (`missing()` says
which are absent) and a built mps_ext (setup.py also generates the embedded
kernel sources). Objects are rebuilt only when a file they read changed
(clang's -MD lists), so a second run links nothing new.
"""

import os
import re
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
RUNTIMES = ("2.13", "2.14", "2.15")  # torch's MPS runtimes the emulation models
MPS_HEADERS = ("MPSDevice.h", "MPSEvent.h", "MPSStream.h")  # all the Metal layer and the emulation read


def missing() -> list[str]:
    """What this machine lacks to build the emulation (Debian package names)."""
    out = [] if shutil.which(CLANG) else ["clang-19"]
    out += [] if (GCC_LIB / "include" / "objc" / "runtime.h").is_file() else ["libobjc-12-dev"]
    return out + ([] if BLOCKS.is_file() else ["libblocksruntime-dev"])


def sources() -> list[Path]:
    return [*sorted((ROOT / "csrc" / "metal").glob("*.mm")), *sorted(HERE.glob("*.mm")), HERE / "module.cpp",
            ROOT / "build" / "mtlsim" / "metal_sources.cpp"]


def installed() -> str:
    """The installed torch's version, as RUNTIMES spells them."""
    import torch

    return ".".join(torch.__version__.split(".")[:2])


def runtime_headers(version: str) -> list[Path]:
    """Include folders ahead of the installed torch's that make a build torch `version`'s (none for the
    installed one): its MPS runtime headers from its macOS wheel, and its version numbers."""
    if version == installed():
        return []
    sys.path.insert(0, str(ROOT / "tools"))
    import check_macos

    wheel = next(v for v in check_macos.TORCH_VERSIONS if v.startswith(version + "."))
    check_macos.fetch_all([wheel])
    out = OUT / f"torch-{version}" / "include"
    files = {f"ATen/mps/{name}": (check_macos.torch_cache(wheel) / "include" / "ATen" / "mps" / name).read_text()
             for name in MPS_HEADERS}
    numbers = zip(("MAJOR", "MINOR", "PATCH"), wheel.split("."))
    files["torch/headeronly/version.h"] = "#pragma once\n" + "".join(f"#define TORCH_VERSION_{k} {v}\n" for k, v in numbers)
    for name, text in files.items():
        if not (out / name).exists() or (out / name).read_text() != text:  # unchanged: objects stay up to date
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            (out / name).write_text(text)
    return [out]


def per_runtime(source: Path) -> bool:
    """Whether source includes torch's MPS runtime headers or its version, which differ between runtimes."""
    return re.search(r'#\s*(include|import)\s*[<"](ATen/mps/|metal/torch_version\.h)', source.read_text()) is not None


def compile_command(source: Path, obj: Path, runtime: list[Path]) -> list[str]:
    import torch.utils.cpp_extension as ext

    objc = ["-x", "objective-c++", "-fobjc-runtime=gcc", "-fblocks", "-fno-objc-arc"] if source.suffix == ".mm" else []
    system = [*runtime, HERE / "include", ROOT / "tools" / "macos_sdk_stubs", GCC_LIB / "include",
              *map(Path, ext.include_paths()), Path(sysconfig.get_paths()["include"])]
    ours = [ROOT / "csrc", ROOT / "csrc" / "sim" / "include", ROOT / "metal" / "include", HERE]
    return [CLANG, "-std=c++20", "-fPIC", "-O1", "-g1", *objc, "-fno-strict-aliasing", "-Wno-unknown-pragmas",
            "-D_GLIBCXX_USE_CXX11_ABI=1", f"-DTORCH_EXTENSION_NAME={MODULE}", "-DTORCH_API_INCLUDE_EXTENSION_H",
            *[a for d in system for a in ("-isystem", str(d))], *[a for d in ours for a in ("-I", str(d))],
            "-MD", "-MF", str(obj.with_suffix(".d")), "-c", str(source), "-o", str(obj)]


def compile_object(source: Path, obj: Path, runtime: list[Path]) -> subprocess.CompletedProcess:
    """Compiles into a file of this process's own, then renames: builds for two runtimes at once (test workers)
    may compile a shared object together."""
    part = obj.with_name(f"{obj.stem}.{os.getpid()}.o")
    result = subprocess.run(compile_command(source, part, runtime), capture_output=True, text=True)
    if result.returncode:
        part.unlink(missing_ok=True)
    else:
        os.replace(part.with_suffix(".d"), obj.with_suffix(".d"))
        os.replace(part, obj)
    return result


def stale(obj: Path) -> bool:
    """Whether obj is missing or older than a file its last compile read."""
    depfile = obj.with_suffix(".d")
    if not obj.exists() or not depfile.exists():
        return True
    deps = depfile.read_text().replace("\\\n", " ").split(":", 1)[1].split()
    built = obj.stat().st_mtime
    return any(not Path(d).exists() or Path(d).stat().st_mtime > built for d in deps)


def build(version: str | None = None) -> Path:
    """The path of the module built as for torch `version` (default: the installed torch's), built or
    brought up to date first."""
    import torch.utils.cpp_extension as ext

    if absent := missing():
        sys.exit(f"metal_emu: needs {', '.join(absent)} (apt-get install {' '.join(absent)})")
    import mps_ext._C as core

    version = version or installed()
    if version not in RUNTIMES:
        sys.exit(f"metal_emu: no emulated torch {version} runtime (one of {', '.join(RUNTIMES)})")
    runtime = runtime_headers(version)
    out, common = OUT / f"torch-{version}", OUT / "common"
    out.mkdir(parents=True, exist_ok=True)
    common.mkdir(exist_ok=True)
    objects = [(out if per_runtime(s) else common) / (s.stem + s.suffix.replace(".", "_") + ".o") for s in sources()]
    jobs = [(s, o) for s, o in zip(sources(), objects) if stale(o)]

    with ThreadPoolExecutor(os.cpu_count()) as pool:
        for (source, obj), result in zip(jobs, pool.map(lambda job: compile_object(*job, runtime), jobs)):
            if result.returncode:
                sys.exit(f"metal_emu: compiling {source} failed:\n{result.stderr}")
    target = out / f"{MODULE}{sysconfig.get_config_var('EXT_SUFFIX')}"
    if not target.exists() or any(o.stat().st_mtime > target.stat().st_mtime for o in objects):
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
    print(build(*sys.argv[1:2]))
