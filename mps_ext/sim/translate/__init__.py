"""Translate Metal Shading Language compute kernels into C++ for the simulator.

Runs at build time for the package's own ``metal/*.metal`` files and at run
time for ``mps_ext.sim.compile_shader``. It has no dependency on the rest of the
package (the build and tools/cuda_check load this package by its path). Its
parts: ``tokens`` (preprocessing and tokens), ``rules`` (MSL's language rules,
checked before anything is rewritten), and the rewriting into C++:
``translator`` (the passes, in order) with the parts it is made of, ``stream``
(tokens and their replacements), ``kernels`` (definitions and instantiations),
``arguments`` (kernel parameters and their bindings), ``program_scope``
(function constants, constant-space and built-in variables), ``threadgroup``
(threadgroup memory), ``address_spaces``, ``expressions`` (conditionals and
literals) and ``glue`` (entry points and the emitted module).

The translation:

1. preprocesses the source with the C++ compiler against empty ``<metal_*>``
   headers, so macros (kernel instantiation macros above all) and
   ``#if __METAL_VERSION__`` expand exactly as for Apple's compiler;
2. tokenizes the result, keeping every token's ``.metal`` file and line;
3. rewrites what C++ cannot express: address spaces, ``threadgroup`` variables
   (to storage shared by the threadgroup), half and unsuffixed float literals,
   MSL attributes (recording each kernel parameter's binding), and explicit
   kernel instantiations with ``[[host_name]]``;
4. emits C++ with ``#line`` directives, so compiler errors and the simulator's
   reports name ``.metal`` lines, plus glue that registers every kernel by its
   host name.
"""


from __future__ import annotations

from pathlib import Path

# Kernel, METAL_VERSION, PREDEFINED and the private names are also what tools/cuda_check's translator builds on.
from .expressions import _cast_conditional_arms, _number  # noqa: F401
from .glue import Kernel  # noqa: F401
from .rules import _STANDARD_ATTRIBUTES, check_rules  # noqa: F401
from .stream import _c_string  # noqa: F401
from .tokens import METAL_VERSION, PREDEFINED, TranslateError, _tokenize, msl_version_number, preprocess  # noqa: F401
from .translator import Translation, _Translator  # noqa: F401

__all__ = ["TranslateError", "Translation", "translate", "preprocess"]


def translate(source_path: Path, *, include_dirs=(), module_symbol: str = "mtlsim_module_init",
              standalone: bool = True, cxx: str | None = None, defines=(), constants=None,
              msl_version: str = "3.1") -> Translation:
    """Translate one .metal file into one C++ translation unit.

    ``standalone`` modules are shared libraries loaded at run time (they get the
    runtime's API table from their init function); others are compiled into the
    extension itself, where the runtime defines it. ``constants`` gives the values
    of ``[[function_constant(i)]]`` program-scope constants, by name or index, as
    ``MTLFunctionConstantValues`` does. Every failure is a ``TranslateError`` that
    names a ``.metal`` position. ``msl_version`` ("3.1" or "3.2") is the MSL the
    source targets: ``__METAL_VERSION__`` and the rules that depend on it follow it.
    """
    text = preprocess(Path(source_path), include_dirs, cxx, defines, msl_version)
    return translate_text(text, module_symbol=module_symbol, standalone=standalone, constants=constants,
                          msl_version=msl_version)


def translate_text(text: str, *, module_symbol: str = "mtlsim_module_init", standalone: bool = True,
                   constants=None, msl_version: str = "3.1") -> Translation:
    """Translate preprocessed MSL (with line markers) into C++."""
    version = msl_version_number(msl_version)
    tokens = _tokenize(text)
    tr = _Translator(tokens, standalone, constants)
    try:
        check_rules(tokens, version)
        tr = _Translator(_cast_conditional_arms(tokens), standalone, constants)
        tr.run()
        tr.check_constants()
        cpp = tr.emit(module_symbol, standalone, version)
    except TranslateError:
        raise
    except (IndexError, KeyError, ValueError, StopIteration, TypeError, AttributeError, RecursionError) as e:
        raise TranslateError(f"{tr.where(tr.cursor)}: cannot translate this source "
                             f"(translator error {type(e).__name__}: {e})") from None
    return Translation(cpp, tr.kernels, tr.sites)
