"""The C++ that setup.py compiles besides csrc/: every metal/*.metal translated
for the simulator, the registry of those modules, the sources embedded as
text for the Metal backend, and the sources that compile groups of csrc/ as
one source each. Needs no torch, so tools/check_macos.py generates them too
(into its own folder) while the environment is still being set up."""

import importlib.util
import os
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_translator():
    package = ROOT / "mps_ext" / "sim" / "translate"
    spec = importlib.util.spec_from_file_location("mtlsim_translate", package / "__init__.py",
                                                  submodule_search_locations=[str(package)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # for its own modules' relative imports, and dataclasses
    spec.loader.exec_module(module)
    return module


def write_if_changed(path: Path, text: str) -> None:
    """Keeps the file (and its time, so nothing recompiles it) when the text is the same; else replaces it whole."""
    if path.exists() and path.read_text() == text:
        return
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False) as f:
        f.write(text)
    os.replace(f.name, path)


def embedded_source(path: Path, include_dirs, seen: set) -> str:
    """A .metal file with the package's own #include "..." files inlined (once each)."""
    out = []
    for line in path.read_text().splitlines():
        m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
        if not m:
            if not re.match(r"\s*#\s*pragma\s+once", line):
                out.append(line)
            continue
        header = next((d / m.group(1) for d in [path.parent, *include_dirs] if (d / m.group(1)).is_file()), None)
        if header is None:
            raise FileNotFoundError(f"{path}: cannot find {m.group(1)}")
        if header.resolve() not in seen:
            seen.add(header.resolve())
            out.append(embedded_source(header, include_dirs, seen))
    return "\n".join(out)


# Sources compiled together, as one source each: each of them reads torch's headers, whose parsing (and, for
# the Python bindings, pybind11's templates) is most of its compile, so one compile of a group costs little
# more than one of its members (the bindings: a third of the CPU time of compiling them one by one; the
# overrides: 20 CPU seconds instead of 87). An error still names the member's file and line; the helpers
# the host plans share live in csrc/ops/plan_helpers.h, so no two members define a helper of one name.
UNITY = {
    "python_bindings": ("extension.cpp", "recording_bindings.cpp", "stream_bindings.cpp", "sim/bindings.cpp"),
    **{group: tuple(f"{group}/{p.name}" for p in sorted((ROOT / "csrc" / group).glob("*.cpp")))
       for group in ("overrides", "ops")},
}


def portable_sources() -> list[Path]:
    """csrc/'s C++ that is compiled on its own: not the Metal backend's, not a member of a UNITY group."""
    members = {ROOT / "csrc" / member for group in UNITY.values() for member in group}
    return [p for p in sorted((ROOT / "csrc").rglob("*.cpp"))
            if "metal" not in p.relative_to(ROOT).parts and p not in members]


def unity_sources(out: Path) -> list[str]:
    """Writes into out, for each UNITY group, the source that includes every member; returns them."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, members in UNITY.items():
        text = f"// Generated: {', '.join(members)} as one source.\n"
        text += "".join(f'#include "{ROOT / "csrc" / member}"\n' for member in members)
        path = out / f"{name}.cpp"
        write_if_changed(path, text)
        paths.append(str(path))
    return paths


def generated_sources(out: Path) -> tuple[list[str], str]:
    """Writes into out every metal/*.metal translated to C++ for the simulator,
    the registry of those modules, and (for the Metal backend) the sources
    embedded as text; returns the simulator's sources and the embedded ones."""
    translate = load_translator()
    out.mkdir(parents=True, exist_ok=True)
    include_dirs = [ROOT / "metal" / "include"]
    sources, entries, embedded = [], [], []
    for metal in sorted((ROOT / "metal").glob("*.metal")):
        symbol = f"mtlsim_module_init_{metal.stem}"
        tr = translate.translate(metal, include_dirs=include_dirs, module_symbol=symbol, standalone=False)
        cpp = out / f"{metal.stem}.cpp"
        write_if_changed(cpp, tr.cpp)
        sources.append(str(cpp))
        entries.append((metal.stem, symbol))
        text = embedded_source(metal, include_dirs, set())
        assert ')MPSEXT"' not in text
        kernels = ", ".join(f'"{k.host_name}"' for k in tr.kernels)
        embedded.append(f'    {{"{metal.name}", R"MPSEXT({text})MPSEXT", {{{kernels}}}}},\n')
    decls = "".join(f'extern "C" const mtlsim::ModuleInfo* {s}(const mtlsim::RuntimeAPI*);\n' for _, s in entries)
    table = "".join(f'    {{"{stem}", &{s}}},\n' for stem, s in entries)
    registry = (
        "// Generated by setup.py: the kernel modules compiled into this extension.\n"
        '#include "sim/builtin_modules.h"\n\n' + decls +
        "\nnamespace mtlsim {\nconst std::vector<BuiltinModule>& builtin_modules() {\n"
        "  static const std::vector<BuiltinModule> modules = {\n" + table + "  };\n  return modules;\n}\n}\n"
    )
    write_if_changed(out / "builtin_modules.cpp", registry)
    metal_sources = (
        "// Generated by setup.py: metal/*.metal for the Metal backend.\n"
        '#include "metal/sources.h"\n\nnamespace mps_ext::metal {\nconst std::vector<Source>& sources() {\n'
        "  static const std::vector<Source> all = {\n" + "".join(embedded) + "  };\n  return all;\n}\n}\n"
    )
    write_if_changed(out / "metal_sources.cpp", metal_sources)
    return sources + [str(out / "builtin_modules.cpp")], str(out / "metal_sources.cpp")
