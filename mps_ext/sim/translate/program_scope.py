"""Program-scope declarations that C++ cannot take as written: function constants (values given when the
source is compiled, MSL 5.8.1), variables in the constant address space (MSL 4.2) and built-in variables
(MSL 5.9)."""

from __future__ import annotations

import re

from .rules import _BUILTIN_ATTRIBUTES, _FUNCTION_CONSTANT_TYPE
from .stream import _TokenStream
from .tokens import _CLOSE, _OPEN, TranslateError


class _ProgramScope(_TokenStream):
    """Records the function constants and built-in variables that the token rewrites (translator.py) and
    the attribute indices (arguments.py) read."""

    def function_constant(self, start: int, at: int) -> int:
        """``constant T name [[function_constant(i)]];`` -> a compile-time value given at compile time."""
        end = self.find(at, (";",), "';' after the function constant")
        index_tokens = dict(self.attributes(at))["function_constant"]
        decl = [k for k in range(start, at) if self.text(k) not in ("constant", "const", "static", "constexpr")]
        if not decl or self.text(decl[-1]) in ("]",) or self.t[decl[-1]].kind != "id":
            self.err(at, "expected 'constant T name [[function_constant(index)]];'")
        name = self.text(decl[-1])
        type_src = " ".join(self.text(k) for k in decl[:-1])
        index = "".join(t.text for t in index_tokens)
        if re.fullmatch(r"[\d+*()-]+", index):  # e.g. `FC_NORM + 0` after preprocessing
            try:
                index = str(eval(index, {"__builtins__": {}}))  # digits and + - * ( ) only
            except (SyntaxError, ArithmeticError):
                self.err(at, f"[[function_constant({index})]]: cannot evaluate the index")
        if re.fullmatch(r"-?\d+", index) and not 0 <= int(index) <= 65535:
            self.err(at, f"MSL rule 'function constant': [[function_constant({index})]]: the index is in 0..65535")
        if not _FUNCTION_CONSTANT_TYPE.fullmatch(" ".join(w for w in type_src.split() if w not in ("metal", "::"))):
            self.err(at, f"MSL rule 'function constant': '{name}' is a '{type_src}'; function constants are scalars "
                         f"or vectors")
        key = next((k for k in (name, index) if k in self.constants), None)
        if key is None and index.isdigit() and int(index) in self.constants:
            key = int(index)
        if key is not None and not isinstance(self.constants[key], (bool, int, float)):
            self.err(at, f"function constant '{name}': values are bool, int or float, "
                         f"got {type(self.constants[key]).__name__}")
        self.function_constants[name] = key is not None
        if key is not None:
            self.function_values[name] = self.constants[key]
        self.constants_used.add(key)
        value = _cpp_value(self.constants[key]) if key is not None else ""
        self.drop(start, end + 1)
        self.replace(start, self.code(f"constexpr {type_src} {name} = {type_src}({value});", start))
        return end + 1

    def check_constants(self) -> None:
        unknown = [k for k in self.constants if k not in self.constants_used]
        if unknown:
            declared = ", ".join(sorted(self.function_constants)) or "none"
            raise TranslateError(f"{self.where(0)}: constants {unknown} match no [[function_constant]] of this "
                                 f"source (declared: {declared})")

    def program_constant(self, start: int) -> None:
        """MSL 4.2: a program-scope variable in the constant address space is initialized by a constant
        expression. Unless it is constexpr (which says as much), C++ checks it through MTLSIM_CONSTANT_INIT
        (constinit), and mps_ext.sim.compiler names the rule in the compiler's error."""
        depth, k, words, text = 0, start, [], False
        while k < len(self.t) and not (depth == 0 and (self.text(k) == ";" or
                                                       self.text(k) == "{" and "=" not in words)):
            if depth == 0:
                words.append(self.text(k))
            depth += (self.text(k) in _OPEN) - (self.text(k) in _CLOSE)
            text |= self.t[k].kind == "str"
            k += 1
        assigned = "=" in words and ("(" not in words or words.index("=") < words.index("("))
        # Left unchecked: string literals, constant-space text that the simulator reaches through an
        # address-space cast, which no C++ constant expression may contain (MLX's `constant os_log x("a", "b")`).
        if "constant" in words[:2] and "constexpr" not in words and assigned and not text:
            self.constant_inits.add(words.index("constant") + start)
        if "constant" in words[:2] and assigned:
            j = start + words.index("constant") + 1
            while self.text(j) in ("const", "static", "metal", "::"):
                j += 1
            if self.text(j) in ("half", "bfloat") and self.t[j + 1].kind == "id":
                eq = next(e for e in range(j, k) if self.text(e) == "=")
                self.small_float_elements(self.text(j), eq, k)

    def small_float_elements(self, kind: str, before: int, after: int) -> None:
        """``constant half t[] = {1.0f, NAN};``: each initializer between tokens ``before`` and ``after`` is
        converted to half explicitly, since C++ constructs no object in the constant address space through a
        converting constructor (the cast goes around the tokens, which keep their own rewrites)."""
        if self.text(before + 1) == "{" and before + 1 < after:
            close = self.match(before + 1, "{", "}")
            depth, element = 0, before + 1
            for j in range(before + 2, close + 1):
                depth += (self.text(j) in _OPEN) - (self.text(j) in _CLOSE)
                if (depth == 0 and self.text(j) == ",") or j == close:
                    if j > element + 1:
                        self.small_float_elements(kind, element, j)
                    element = j
            return
        for at, text in ((before, f"{kind} ("), (after, ")")):
            kept = self.emitted(at)
            self.out[at] = kept + self.code(text, at) if at == before else self.code(text, at) + kept

    def program_builtin(self, start: int, at: int) -> int:
        """``uint2 gid [[thread_position_in_grid]];`` at program scope (MSL 3.1, 5.9): every use of the name
        becomes the calling thread's value (mtlsim::builtin, glue.h)."""
        end = self.find(at, (";",), "';' after the program-scope built-in")
        decl, k = [], start
        while k < end:
            if self.is_attr_start(k):
                k = self.attr_end(k)
                continue
            if self.text(k) not in ("const", "constant", "thread"):
                decl.append(k)
            k += 1
        attribute = next(n for n, _ in self.attributes(at) if n in _BUILTIN_ATTRIBUTES)
        if len(decl) < 2 or self.t[decl[-1]].kind != "id":
            self.err(at, f"expected 'T name [[{attribute}]];'")
        self.check_attribute_type(attribute, decl)
        type_src = " ".join(self.text(k) for k in decl[:-1])
        self.builtins[self.text(decl[-1])] = f"::mtlsim::builtin<{type_src}, ::mtlsim::Attr::{attribute}>()"
        self.drop(start, end + 1)
        return end + 1


def _cpp_value(value) -> str:
    """A Python bool, int or float as a C++ literal, exactly."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value) if -2**31 <= value < 2**31 else f"{value}ll" if -2**63 <= value < 2**63 else f"{value}ull"
    if isinstance(value, float):
        if value != value:
            return "__builtin_nanf(\"\")"
        if value in (float("inf"), float("-inf")):
            return ("-" if value < 0 else "") + "__builtin_inff()"
        return value.hex() + "f"  # MSL has no double: the float nearest the value
    raise TranslateError(f"function constant values are bool, int or float, got {type(value).__name__}")
