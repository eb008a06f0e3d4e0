"""Kernel parameters: the slot each is bound to (buffer, threadgroup or built-in attribute, as Metal
assigns them), and MSL's rules for kernel arguments and their attributes (MSL 4, 5.2)."""

from __future__ import annotations

import re

from .rules import (_CONCRETE_TYPE, _INDEX_ATTRIBUTES, _INDEX_TYPES, _MATCHING_ATTRIBUTES, _POSITION_ATTRIBUTES,
                    _POSITION_TYPES, _STANDARD_ATTRIBUTES, _UNSUPPORTED_ATTRIBUTES)
from .stream import _TokenStream
from .tokens import split_parameters

# Buffer and threadgroup argument slots of a Metal kernel.
_SLOTS = 31


class _Arguments(_TokenStream):
    """Turns a kernel's parameter list into the C++ binder types of its entry point (mtlsim/glue.h)."""

    def parameters(self, paren: int, close: int, check: bool) -> list[str]:
        """C++ binder types for the kernel parameters between the parentheses."""
        params = split_parameters(range(paren + 1, close), self.text)
        if not params[-1]:
            params.pop()
        if len(params) == 1 and [self.t[j].text for j in params[0]] == ["void"]:
            params = []

        explicit, parsed, positions, types = {"buffer": set(), "threadgroup": set()}, [], {}, {}
        for p in params:
            binding = None
            for j in p:
                if self.is_attr_start(j):
                    for name, args in self.attributes(j):
                        if name in _UNSUPPORTED_ATTRIBUTES:
                            self.err(j, f"[[{name}]] is not supported by the simulator")
                        if name in ("buffer", "threadgroup"):
                            index = self.slot_index(j, name, args)
                            if index in explicit[name]:
                                self.err(j, f"MSL rule 'argument index': [[{name}({index})]] is bound twice")
                            explicit[name].add(index)
                            binding = (name, index)
                        elif name not in _STANDARD_ATTRIBUTES and name != "function_constant" and binding is None:
                            binding = ("attr", name)
            if check:  # (a declaration's parameters may leave out the attributes of the definition)
                self.check_argument(p, binding)
            if binding is None:
                kind = "threadgroup" if any(self.t[j].text == "threadgroup" for j in p) else "buffer"
                binding = (kind, None)
            elif binding[1] in _POSITION_ATTRIBUTES or binding[1] in _INDEX_ATTRIBUTES:
                types[binding[1]] = (self.check_attribute_type(binding[1], p), p[0])
                if binding[1] in _POSITION_ATTRIBUTES:
                    positions[binding[1]] = (_components(self.t[j].text for j in p), p[0])
            parsed.append(binding)
        if len({n for n, _ in positions.values()}) > 1:
            declared = ", ".join(f"[[{a}]] with {n}" for a, (n, _) in positions.items())
            self.err(next(iter(positions.values()))[1],
                     f"MSL rule 'attribute type': the grid and threadgroup position attributes of a kernel have the "
                     f"same number of components; this kernel declares {declared}")
        self.check_matching_attributes(types)

        binders = []
        for kind, value in parsed:
            if kind == "attr":
                binders.append(f"::mtlsim::AttrArg<::mtlsim::Attr::{value}>")
                continue
            if value is None:  # Metal gives unattributed parameters the next free index
                value = next((n for n in range(_SLOTS) if n not in explicit[kind]), None)
                if value is None:
                    self.err(paren, f"kernel has more than {_SLOTS} {kind} parameters (Metal's limit)")
                explicit[kind].add(value)
            binders.append(f"::mtlsim::{'BufferArg' if kind == 'buffer' else 'ThreadgroupArg'}<{value}>")
        return binders

    def check_argument(self, param: list[int], binding) -> None:
        """MSL's rules for a kernel argument's address space and binding (MSL 4, 5.2.1)."""
        words, depth = [], 0
        for j in param:
            depth += {"[": 1, "]": -1}.get(self.text(j), 0)
            if depth == 0 and self.text(j) != "]":
                words.append(self.text(j))
        indirect = any(w in ("*", "&", "&&") for w in self.strip_angles(words)) or any(
            self.text(j) == "[" and "[" not in (self.text(j - 1), self.text(j + 1)) for j in param)  # an array
        space = "threadgroup" if "threadgroup" in words else "thread" if "thread" in words else None
        at = param[0]
        if binding is None and not indirect:
            self.err(at, "MSL rule 'kernel argument attribute': a kernel argument passed by value needs an attribute "
                         "([[buffer(n)]], or a built-in such as [[thread_position_in_grid]])")
        if indirect and space == "thread":
            self.err(at, "MSL rule 'kernel argument address space': a pointer or reference kernel argument is in the "
                         "device, constant or threadgroup address space, not thread")
        kind = binding[0] if binding else None
        if kind == "buffer" and space == "threadgroup":
            self.err(at, "MSL rule 'argument binding': a threadgroup pointer is bound with [[threadgroup(n)]], "
                         "not [[buffer(n)]]")
        if kind == "threadgroup" and space != "threadgroup":
            self.err(at, "MSL rule 'argument binding': [[threadgroup(n)]] binds a pointer or reference in the "
                         "threadgroup address space")

    @staticmethod
    def strip_angles(words: list[str]) -> list[str]:
        """The words outside template argument lists."""
        out, depth = [], 0
        for w in words:
            depth += {"<": 1, ">": -1, ">>": -2}.get(w, 0)
            if depth <= 0 and w not in (">", ">>"):
                out.append(w)
        return out

    def check_matching_attributes(self, types: dict) -> None:
        """MSL 5.2.3.6: attributes that describe one another are declared with the same type."""
        for group in _MATCHING_ATTRIBUTES:
            declared = [(a, *types[a]) for a in group if a in types and types[a][0]]
            if len({t for _, t, _ in declared}) > 1:
                listed = ", ".join(f"[[{a}]] as {t}" for a, t, _ in declared)
                self.err(declared[-1][2], f"MSL rule 'attribute type': these attributes are declared with the "
                                          f"same type; this kernel declares {listed}")
        position, index = types.get("thread_position_in_threadgroup"), types.get("thread_index_in_threadgroup")
        if position and index and position[0] and index[0] and position[0].startswith("uint") and index[0] != "uint":
            self.err(index[1], f"MSL rule 'attribute type': with [[thread_position_in_threadgroup]] a {position[0]}, "
                               f"[[thread_index_in_threadgroup]] is a uint, not {index[0]}")

    def slot_index(self, at: int, name: str, args) -> int:
        text = "".join(t.text for t in args)
        if text in self.function_values:  # MSL 5.8.1.4: a function constant as the index
            text = str(self.function_values[text])
        try:
            index = int(text.rstrip("uU"), 0)
        except ValueError:
            if text in self.function_constants:
                self.err(at, f"[[{name}({text})]]: the function constant '{text}' has no value")
            self.err(at, f"[[{name}({text})]]: the index must be an integer literal or a function constant")
        if not 0 <= index < _SLOTS:
            self.err(at, f"MSL rule 'argument index': [[{name}({index})]]: Metal has {_SLOTS} {name} slots, "
                         f"0 to {_SLOTS - 1}")
        return index

    def check_attribute_type(self, attribute: str, param: list[int]) -> str | None:
        """MSL: thread position attributes are uint/ushort scalars or 2-/3-vectors; index attributes scalars.
        Returns the type as uint/ushort[N], None for a type the translator cannot see through."""
        words, depth = [], 0
        for j in param:
            s = self.t[j].text
            depth += {"[": 1, "]": -1}.get(s, 0)
            if depth == 0 and s != "]" and (self.t[j].kind in ("id", "num") or s in ("<", ">", ",")):
                words.append(s)
        words = [w for w in words[:-1] if w not in ("const", "metal", "thread")]  # drop the parameter's name
        text = " ".join(words).replace("< ", "<").replace(" >", ">").replace(" , ", ",")
        allowed = _POSITION_TYPES if attribute in _POSITION_ATTRIBUTES else _INDEX_TYPES
        if text in allowed:
            return _normal_type(text)
        if not _CONCRETE_TYPE.fullmatch(text.replace("unsigned ", "u").split("<")[0]):
            return None  # a template parameter or typedef the translator cannot see through
        kinds = "uint or ushort, or a 2- or 3-vector of them" if allowed is _POSITION_TYPES else "uint or ushort"
        self.err(param[0], f"MSL rule 'attribute type': [[{attribute}]] must be {kinds}, not '{text}'")


def _normal_type(text: str) -> str:
    """uint32_t -> uint, vec<uint16_t,2> -> ushort2: one spelling per attribute type."""
    m = re.fullmatch(r"vec<(\w+),(\d)>", text)
    base, n = (m.group(1), m.group(2)) if m else (text, "")
    base = {"uint32_t": "uint", "unsigned int": "uint", "uint16_t": "ushort",
            "unsigned short": "ushort"}.get(base, base)
    return base + n


def _components(tokens) -> int:
    """Components of a kernel parameter's type (uint3 -> 3, vec<uint, 2> -> 2, uint -> 1)."""
    text = " ".join(t for t in tokens if not t.startswith("["))
    m = re.search(r"\bvec\s*<[^,>]+,\s*(\d)\s*>", text) or re.search(r"\b(?:u?int|u?short|u?long)([234])\b", text)
    return int(m.group(1)) if m else 1
