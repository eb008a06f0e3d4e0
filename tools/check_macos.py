#!/usr/bin/env python3
"""Compile mps_ext's macOS build on Linux, against the real macOS torch wheels,
and check that torch's dylibs export every torch symbol it uses.

The Metal backend (csrc/metal/*.mm) and the portable sources it is linked
with (csrc/**/*.cpp and what setup.py generates) are compiled as setup.py
builds them on an Apple-silicon Mac, once per supported torch version, with
the headers of that version's macOS arm64 wheel:

- clang 19 for arm64-apple-macos14, so
  __APPLE__, __aarch64__, Apple's type sizes and -Wunguarded-availability are
  those of the Mac, and Apple's assembler checks the inline assembly;
- libc++ (Debian's libc++-19-dev), the C++ library of macOS;
- the macOS SDK's usr/include (libc, libdispatch, the Objective-C runtime,
  Availability.h), which the ziglang wheel ships: Debian's glibc cannot stand
  in, torch's headers check that int64_t is long long as on macOS;
- for Foundation, Metal and MetalPerformanceShaders(Graph), whose headers are
  not to be had here, the declarations in tools/macos_sdk_stubs/.

Objective-C++ is compiled twice, as with a macOS 14 and a macOS 15 SDK, and,
once it compiles, goes through clang's static analyzer, which checks the
retain/release balance of manual reference counting (--no-analyze leaves the
analyzer out: three compiles' time, for a check of compiles and symbols only). Our files get -Wall -Wextra -Werror;
torch's and Apple's headers are system headers.

Each compile makes an arm64 Mach-O object (at -O0, so every torch function
the code calls stays a call, whatever an optimizer would inline). The torch
symbols an object leaves undefined, less those our other objects define,
must be exported by that torch version's libc10, libtorch, libtorch_cpu or
libtorch_python.dylib, the dylibs torch.utils.cpp_extension links an
extension with. A function torch's headers declare but its dylibs do not
export (one declared without TORCH_API, say) compiles, links (a Python
extension is linked with -undefined dynamic_lookup on macOS) and then makes
`import mps_ext` fail on every Mac with "symbol not found". Torch's symbols
are the mangled names in its namespaces (c10, at, torch, caffe2) and the
THP* globals of its Python bindings; its other global names are not checked,
nor are the symbols of libc++, libSystem, the Objective-C runtime,
Metal/Foundation and Python's C API, whose exports are not to be had here.
Nothing is linked or run: what only ld64 or a Mac at run time would report
is not caught.

    python tools/check_macos.py                check everything (needs no torch: the
                                               sources setup.py generates are generated
                                               here by tools/generate_sources.py)
    python tools/check_macos.py --fetch-only   install clang and llvm, fetch the wheels
    python tools/check_macos.py --torch 2.13.0 --sdk 15 FILE...   these files only
    python tools/check_macos.py --no-analyze ...   without the static analyzer

The wheels come from PyPI (sha256 checked). Kept of them are the headers and,
for each of those dylibs, the sorted list of the symbols it exports, in
$MPS_EXT_CACHE_DIR/macos-v2 (default ~/.cache/mps_ext), and so is what each
compile found (results/: see ResultCache). clang-19,
libc++-19-dev and llvm-19 (llvm-nm, llvm-cxxfilt) are installed with apt-get
when missing.
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import urllib.request
import zipfile
from concurrent.futures import ThreadPoolExecutor
from functools import cache, partial
from threading import Lock
from pathlib import Path
from urllib.parse import urljoin

ROOT = Path(__file__).resolve().parent.parent
STUBS = ROOT / "tools" / "macos_sdk_stubs"
GENERATED = ROOT / "build" / "check_macos"

TORCH_VERSIONS = ("2.13.0", "2.14.1", "2.15.0")
TORCH_WHEEL = "-cp311-cp311-macosx_14_0_arm64.whl"
# What torch.utils.cpp_extension links an extension with: what may resolve its torch symbols.
TORCH_DYLIBS = ("libc10", "libtorch", "libtorch_cpu", "libtorch_python")
DEPLOYMENT = (14, 0)  # the oldest macOS mps_ext supports
SDKS = {"14": 140000, "15": 150000}  # __MAC_OS_X_VERSION_MAX_ALLOWED of each SDK
# ziglang 0.14.1 carries the usr/include of the macOS 15.1 SDK; it is built on
# LLVM 19, like the clang used here.
SDK_WHEEL = ("ziglang", "0.14.1", "manylinux_2_12_x86_64")
SDK_INCLUDE = "ziglang/lib/libc/include/any-macos-any/"

CLANG = "clang++-19"
LIBCXX = Path("/usr/lib/llvm-19/include/c++/v1")
# From llvm-19, whose libLLVM clang-19 brings already; llvm-nm reads Mach-O.
NM, CXXFILT = "llvm-nm-19", "llvm-cxxfilt-19"
APT_PACKAGES = ("clang-19", "libc++-19-dev", "llvm-19")

# The torch header the most expensive of our C++ sources include (the Python
# bindings; the others read ATen/ATen.h, which it includes): compiled once per
# torch version into a precompiled header, which every C++ source that reads
# torch's headers is compiled with (see PrefixHeaders).
PREFIX_HEADER = "torch/extension.h"
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.MULTILINE)

# A cache of another layout than this one's is fetched anew (v2 added the export lists).
CACHE_LAYOUT = "macos-v2"

# Torch's symbols, as Mach-O spells them (with a leading _): the mangled names
# whose outermost scope is one of its namespaces (functions, data, vtables,
# typeinfo), and the THP* globals of its Python bindings (THPVariableClass,
# THPVariable_Wrap).
TORCH_SYMBOL = re.compile(r"__Z(T[VIST])?N[rVKRO]*(3c10|2at|5torch|6caffe2)|__Z\d+THP|_THP")


def cache_dir() -> Path:
    base = os.environ.get("MPS_EXT_CACHE_DIR") or Path.home() / ".cache" / "mps_ext"
    return Path(base) / CACHE_LAYOUT


def torch_cache(version: str) -> Path:
    """The headers (include/) and export lists (exports/) of a torch version's macOS wheel."""
    return cache_dir() / f"torch-{version}"


def sdk_headers() -> Path:
    return cache_dir() / "sdk-15.1"


def tools_missing() -> bool:
    return not (shutil.which(CLANG) and LIBCXX.is_dir() and shutil.which(NM) and shutil.which(CXXFILT))


def missing(versions=TORCH_VERSIONS) -> list[str]:
    """What the check needs and this machine does not have yet."""
    out = [f"{CLANG}, libc++ and {NM}"] if tools_missing() else []
    out += [f"the headers and exports of torch {v} for macOS" for v in versions if not torch_cache(v).is_dir()]
    return out + (["the macOS SDK's C headers"] if not sdk_headers().is_dir() else [])


def install_tools() -> None:
    if not tools_missing():
        return
    if os.geteuid() != 0:
        sys.exit(f"check_macos: needs {CLANG}, libc++ and {NM}: apt-get install {' '.join(APT_PACKAGES)}")
    print(f"check_macos: installing {' '.join(APT_PACKAGES)}", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", *APT_PACKAGES]):
        result = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if result.returncode:
            sys.exit(f"check_macos: {' '.join(cmd)} failed:\n{result.stdout}{result.stderr}")


def nm(path: Path, *options: str) -> list[str]:
    return subprocess.run([NM, *options, str(path)], capture_output=True, text=True, check=True).stdout.splitlines()


def extract(wheel: zipfile.ZipFile, out: Path, prefix: str) -> None:
    """The files under prefix, into out."""
    for member in wheel.infolist():
        if member.filename.startswith(prefix) and not member.is_dir():
            target = out / member.filename[len(prefix):]
            target.parent.mkdir(parents=True, exist_ok=True)
            with wheel.open(member) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)


def unpack_torch(wheel: zipfile.ZipFile, out: Path) -> None:
    """Torch's headers, and what each of TORCH_DYLIBS exports (its symbol
    table's external definitions), sorted, one a line: the dylibs themselves
    are not kept (libtorch_cpu alone is 400 MB)."""
    extract(wheel, out / "include", "torch/include/")
    (out / "exports").mkdir()
    for name in TORCH_DYLIBS:
        dylib = out / f"{name}.dylib"
        with wheel.open(f"torch/lib/{name}.dylib") as src, open(dylib, "wb") as dst:
            shutil.copyfileobj(src, dst)
        exports = sorted(nm(dylib, "--extern-only", "--defined-only", "--format=just-symbols"))
        (out / "exports" / f"{name}.txt").write_text("".join(f"{symbol}\n" for symbol in exports))
        dylib.unlink()


def fetch(package: str, version: str, wheel_tag: str, dest: Path, unpack, sha256: str | None = None) -> None:
    """Downloads a wheel (or an sdist: wheel_tag ".tar.gz") from PyPI and makes dest of what
    unpack(archive, out) keeps of it (a ZipFile, or a TarFile for an sdist). ``sha256`` pins the
    file's digest; PyPI's own is always checked."""
    if dest.is_dir():
        return
    index = f"https://pypi.org/pypi/{package}/json"
    with urllib.request.urlopen(index, timeout=60) as r:
        files = json.load(r)["releases"].get(version, [])
    wheel = next((f for f in files if wheel_tag in f["filename"]), None)
    if wheel is None:
        sys.exit(f"check_macos: PyPI has no {package} {version} wheel for {wheel_tag}")
    print(f"check_macos: fetching {wheel['filename']} ({wheel['size'] >> 20} MiB)", flush=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        path, digest = Path(tmp) / wheel["filename"], hashlib.sha256()
        with urllib.request.urlopen(urljoin(index, wheel["url"]), timeout=60) as r, open(path, "wb") as f:
            while chunk := r.read(1 << 20):
                digest.update(chunk)
                f.write(chunk)
        if digest.hexdigest() != wheel["digests"]["sha256"]:
            sys.exit(f"check_macos: {wheel['filename']}: sha256 differs from PyPI's")
        if sha256 and digest.hexdigest() != sha256:
            sys.exit(f"check_macos: {wheel['filename']}: sha256 {digest.hexdigest()} is not the pinned {sha256}")
        out = Path(tmp) / "kept"
        with (tarfile.open(path) if path.name.endswith(".tar.gz") else zipfile.ZipFile(path)) as archive:
            unpack(archive, out)
        try:
            out.rename(dest)  # whole or not at all: an interrupted fetch leaves no cache
        except OSError:
            if not dest.is_dir():  # else another run fetched it meanwhile
                raise


def fetch_all(versions) -> None:
    install_tools()
    jobs = [("torch", v, TORCH_WHEEL, torch_cache(v), unpack_torch) for v in versions]
    jobs.append((*SDK_WHEEL, sdk_headers(), partial(extract, prefix=SDK_INCLUDE)))
    with ThreadPoolExecutor(len(jobs)) as pool:
        for job in [pool.submit(fetch, *j) for j in jobs]:
            job.result()


def build_sources() -> list[Path]:
    """What setup.py builds on a Mac: the Objective-C++, the portable C++ (the
    groups it compiles as one source each, as one source here too) and what it
    generates (the translated kernels, their registry, the embedded .metal
    sources), generated as it does but into a folder of this check's own, so
    that a build running at the same time never reads a file this writes."""
    sys.path.insert(0, str(ROOT / "tools"))
    import generate_sources

    sim, metal = generate_sources.generated_sources(GENERATED)
    generated = [*sim, metal, *generate_sources.unity_sources(GENERATED)]
    return [*sorted((ROOT / "csrc").rglob("*.mm")), *generate_sources.portable_sources(),
            *sorted(Path(p) for p in generated)]


@cache
def clang_include() -> Path:
    """clang's own headers (stddef.h, arm_neon.h...)."""
    resource = subprocess.run([CLANG, "-print-resource-dir"], capture_output=True, text=True, check=True).stdout
    return Path(resource.strip()) / "include"


def compile_command(source: Path, torch_include: Path, sdk: str, obj: Path | None, *,
                    header: bool = False) -> list[str]:
    """Compiles source into the object obj, or, without obj, through clang's
    static analyzer (retain/release balance under manual reference counting);
    with header, source is a C++ header compiled into the precompiled header obj."""
    system = [
        LIBCXX, clang_include(), sdk_headers(), STUBS,
        torch_include, torch_include / "torch" / "csrc" / "api" / "include", sysconfig.get_paths()["include"],
    ]
    ours = [ROOT / "csrc", ROOT / "csrc" / "sim" / "include", ROOT / "metal" / "include"]
    major, minor = DEPLOYMENT
    if obj is None:
        output = ["--analyze", "-Xclang", "-analyzer-werror", "-o", os.devnull]
    elif header:  # the templates it instantiates, instantiated once in it rather than in every source
        output = ["-x", "c++-header", "-fpch-instantiate-templates", "-o", str(obj)]
    else:  # -O0: every torch function the code calls stays a call, to be looked up in torch's exports
        output = ["-c", "-O0", "-o", str(obj)]
    return [
        CLANG, "-target", f"arm64-apple-macos{major}.{minor}", "-std=c++20", "-nostdinc", "-nostdinc++",
        *[a for d in system for a in ("-isystem", str(d))], *[a for d in ours for a in ("-I", str(d))],
        # Availability.h would set these from the target and its own SDK version.
        f"-D__MAC_OS_X_VERSION_MIN_REQUIRED={major * 10000 + minor * 100}",
        f"-D__MAC_OS_X_VERSION_MAX_ALLOWED={SDKS[sdk]}",
        # setup.py's flags on a Mac with an MPS-enabled torch, and torch.utils.cpp_extension's
        "-DMPS_EXT_METAL=1", "-fno-objc-arc", "-fno-strict-aliasing", "-Wno-unknown-pragmas",
        "-DTORCH_API_INCLUDE_EXTENSION_H", "-DTORCH_EXTENSION_NAME=_C",
        "-Wall", "-Wextra", "-Werror", *output, str(source),
    ]


def reads_torch(source: Path, seen: set | None = None) -> bool:
    """Whether source includes a torch header, itself or through our headers
    (by its #include lines: what preprocessor conditions exclude counts too)."""
    seen = set() if seen is None else seen
    if source in seen or not source.is_file():
        return False
    seen.add(source)
    ours = [source.parent, ROOT / "csrc", ROOT / "csrc" / "sim" / "include", ROOT / "metal" / "include"]
    for name in INCLUDE.findall(source.read_text(errors="replace")):
        if name.split("/")[0] in ("ATen", "c10", "torch"):
            return True
        if any(reads_torch(d / name, seen) for d in ours):
            return True
    return False


class PrefixHeaders:
    """PREFIX_HEADER precompiled once per torch version, on first use.

    Parsing torch's headers is most of a compile's time, so a C++ source that
    reads them is compiled with the precompiled header instead, as if it began
    with #include <torch/extension.h>. That changes nothing for a source that
    includes torch's headers anyway except that all of torch (and Python's C
    API) is visible from its first line: a source that forgot an include would
    pass here, but not the Linux build, which compiles every C++ source as it
    is. Objective-C++ is compiled without: it is compiled nowhere else. One
    header for all, rather than ATen/ATen.h (which it includes) for the
    sources without Python bindings, spares building a second one per torch
    version, and loading it costs those sources nothing measurable."""

    def __init__(self, directory: Path):
        self.directory, self.lock, self.built = directory, Lock(), {}
        # A fixed path: it is in what every compile with the header read, so in the keys of ResultCache.
        self.source = cache_dir() / "prefix" / "prefix.h"
        self.source.parent.mkdir(parents=True, exist_ok=True)
        if not self.source.is_file() or self.source.read_text() != f"#include <{PREFIX_HEADER}>\n":
            self.source.write_text(f"#include <{PREFIX_HEADER}>\n")

    def get(self, version: str, sdk: str) -> Path | None:
        """The precompiled header, or None where it does not compile (each source then shows why)."""
        with self.lock:
            if (version, sdk) not in self.built:
                pch = self.directory / f"{version}-{sdk}.pch"
                command = compile_command(self.source, torch_cache(version) / "include", sdk, pch, header=True)
                self.built[version, sdk] = pch if subprocess.run(command, capture_output=True).returncode == 0 else None
            return self.built[version, sdk]


def symbols(obj: Path) -> tuple[set[str], set[str]]:
    """The external symbols an object defines, and those it leaves undefined."""
    defined, undefined = set(), set()
    for line in nm(obj, "--extern-only", "--format=posix"):  # name, type, value, size
        name, kind = line.split()[:2]
        (undefined if kind == "U" else defined).add(name)
    return defined, undefined


def torch_exports(version: str) -> set[str]:
    return {s for name in TORCH_DYLIBS for s in (torch_cache(version) / "exports" / f"{name}.txt").read_text().split()}


def demangle(names: list[str]) -> list[str]:
    """C++ names as the code spells them (Mach-O puts a _ before the mangled name)."""
    result = subprocess.run([CXXFILT, "--strip-underscore"], input="\n".join(names), capture_output=True, text=True,
                            check=True)
    return result.stdout.splitlines()


def unexported(undefined: set[str], ours: set[str], exports: set[str]) -> list[str]:
    """The torch symbols an object uses that neither the extension defines nor torch exports."""
    return sorted(s for s in undefined if TORCH_SYMBOL.match(s) and s not in ours and s not in exports)


def digest(path: Path, memo: dict) -> str:
    """The sha256 of a file's content (memoised by path, size and modification time)."""
    stat = path.stat()
    key = (path, stat.st_size, stat.st_mtime_ns)
    if key not in memo:
        memo[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return memo[key]


def dependencies(depfile: Path) -> list[Path]:
    """The files a compile read, from the make rule clang writes with -MD."""
    text = depfile.read_text().replace("\\\n", " ")
    return [Path(p.replace("\\ ", " ")) for p in re.split(r"(?<!\\)\s+", text.split(":", 1)[1]) if p]


class ResultCache:
    """What a compile found (its output, the symbols of its object), kept by
    content: an entry is used while the command and every file the compile
    read (from clang's -MD) are unchanged, so a rerun without a change
    compiles nothing."""

    def __init__(self, directory: Path):
        self.directory, self.digests = directory, {}

    def _entry(self, command: list[str]) -> Path:
        return self.directory / (hashlib.sha256("\0".join(command).encode()).hexdigest() + ".json")

    def get(self, command: list[str]):
        try:
            entry = json.loads(self._entry(command).read_text())
            if all(digest(Path(p), self.digests) == d for p, d in entry["inputs"].items()):
                return entry
        except (OSError, ValueError, KeyError):
            pass
        return None

    def put(self, command: list[str], inputs: list[Path], result: dict) -> None:
        entry = {**result, "inputs": {str(p): digest(p, self.digests) for p in inputs}}
        self.directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=self.directory, delete=False) as f:
            json.dump(entry, f)
        os.replace(f.name, self._entry(command))  # whole or not at all, even with concurrent runs


def compile_job(source: Path, version: str, sdk: str, analyze: bool, cache: ResultCache,
                prefix: PrefixHeaders) -> dict:
    """One compile (or analysis): {"returncode", "output", "defined", "undefined", "inputs"}."""
    with tempfile.TemporaryDirectory() as tmp:
        obj, depfile = None if analyze else Path(tmp) / "out.o", Path(tmp) / "out.d"
        command = compile_command(source, torch_cache(version) / "include", sdk, obj)
        with_prefix = source.suffix == ".cpp" and reads_torch(source)
        if with_prefix:
            command[-1:-1] = ["-include", str(prefix.source)]
        key = [a if obj is None or a != str(obj) else "OBJECT" for a in command]  # not the temporary object's name
        if (hit := cache.get(key)) is not None:
            return hit
        if with_prefix and (pch := prefix.get(version, sdk)):
            command[-3:-1] = ["-include-pch", str(pch)]  # its depfile lists the headers the pch holds
        result = subprocess.run([*command, "-MD", "-MF", str(depfile)], capture_output=True, text=True)
        defined, undefined = symbols(obj) if obj and not result.returncode else (set(), set())
        out = {"returncode": result.returncode, "output": result.stdout + result.stderr,
               "defined": sorted(defined), "undefined": sorted(undefined)}
        inputs = dependencies(depfile) if depfile.exists() else []
        if not result.returncode:  # a failure is shown again on the next run
            cache.put(key, inputs, out)
        return {**out, "inputs": {str(p): "" for p in inputs}}


def check(sources: list[Path], versions, sdks, analyze: bool = True) -> tuple[int, int]:
    """Every source with every torch version; Objective-C++ with every SDK
    (only it has SDK-dependent code), the rest with the newest; and, with
    analyze, Objective-C++ through the static analyzer once. A compile fails too when
    its object uses a torch symbol that neither our objects (of that torch
    version) define nor torch's dylibs export.

    The newest torch goes first: a source that read none of its headers
    compiles alike with the others, and is not compiled again for them. The
    analyzer, which costs three compiles, takes only sources that compiled:
    it would report their compile errors again."""
    newest, older = versions[-1], versions[:-1]
    jobs = [(s, newest, sdk, False) for s in sources for sdk in (sdks if s.suffix == ".mm" else sdks[-1:])]
    cache = ResultCache(cache_dir() / "results")
    with ThreadPoolExecutor(os.cpu_count()) as pool, tempfile.TemporaryDirectory() as tmp:
        prefix = PrefixHeaders(Path(tmp))
        results = list(pool.map(lambda job: compile_job(*job, cache, prefix), jobs))
        first = {(s, sdk): r for (s, _, sdk, _), r in zip(jobs, results)}
        more = [(s, newest, sdk, True) for (s, sdk), r in first.items()
                if analyze and s.suffix == ".mm" and sdk == sdks[-1] and not r["returncode"]]
        more += [(s, v, sdk, False) for v in older for s, sdk in first]

        def run_more(job):
            done = first[job[0], job[2]]
            read_torch = any(Path(p).is_relative_to(torch_cache(newest)) for p in done["inputs"])
            if job[3] or done["returncode"] or read_torch:
                return compile_job(*job, cache, prefix)
            return done

        results += list(pool.map(run_more, more))
        jobs += more

    ours = {v: set() for v in versions}  # our namespaces, and what of torch's headers is inline
    for (_, version, _, _), result in zip(jobs, results):
        ours[version] |= set(result["defined"])
    exports = {v: torch_exports(v) for v in versions}

    failed = 0
    for (source, version, sdk, analyze), result in zip(jobs, results):
        name = source.relative_to(ROOT) if source.is_relative_to(ROOT) else source
        where = f"{name} (torch {version}, macOS {sdk} SDK)"
        if result["returncode"]:
            failed += 1
            what = "static analysis" if analyze else "compile"
            print(f"FAILED {what} of {where}:\n{result['output']}", flush=True)
        elif missing_symbols := unexported(set(result["undefined"]), ours[version], exports[version]):
            failed += 1
            listed = "".join(f"  {d}  [{s}]\n" for s, d in zip(missing_symbols, demangle(missing_symbols)))
            print(f"FAILED link of {where}: `import mps_ext` would fail on a Mac (\"symbol not found\"): "
                  f"torch {version}'s {', '.join(TORCH_DYLIBS)} do not export\n{listed}", end="", flush=True)
    return len(jobs) - failed, failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fetch-only", action="store_true",
                        help="install clang and llvm, fetch the headers and export lists, check nothing")
    parser.add_argument("--torch", action="append", choices=TORCH_VERSIONS, help="torch version (default: all)")
    parser.add_argument("--sdk", action="append", choices=list(SDKS), help="macOS SDK of .mm files (default: all)")
    parser.add_argument("--no-analyze", dest="analyze", action="store_false",
                        help="compile and check symbols only, without the static analyzer (three compiles' time)")
    parser.add_argument("files", nargs="*", type=Path, help="sources to check (default: the whole macOS build)")
    args = parser.parse_args()
    versions, sdks = args.torch or TORCH_VERSIONS, sorted(args.sdk or SDKS)
    fetch_all(versions)
    if args.fetch_only:
        return 0
    start = time.monotonic()
    sources = [f.resolve() for f in args.files] or build_sources()
    passed, failed = check(sources, versions, sdks, args.analyze)
    print(f"check_macos: {len(sources)} sources, torch {', '.join(versions)}: {time.monotonic() - start:.0f} s")
    print(f"check_macos: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
