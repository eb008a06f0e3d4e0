"""Address spaces where C++ has none: member functions qualified with one, assignments between
objects in different ones, array parameters, and objects built in the constant address space."""

from __future__ import annotations

from .stream import _TokenStream

_SPECIFIERS = {"static", "constexpr", "const", "inline", "volatile", "extern", "constant"}
# Where a string literal stays one (not a `constant char*`): attributes and compile-time text.
_LITERAL_CALLEES = {"static_assert", "host_name", "__attribute__", "_Pragma", "asm", "deprecated", "nodiscard"}


class _AddressSpaces(_TokenStream):
    """MSL qualifies a member function with the address space of the object it is called on
    (`float get() const device`, `S() threadgroup`); C++ has no such qualifier. Each one loses
    it and gets a name of its own, and the class gets a forwarder (mtlsim/address_space.h) by
    the original name that calls it, through the thread-space view of the object, for objects
    in that space only. Every class (not local to a function) also gets assignments for its
    objects in any address space (MTLSIM_SPACE_ASSIGNMENT): `buf[i] = s;`, `buf[i] = {a, b};`."""

    def member_address_spaces(self) -> None:
        enclosing: list[bool] = []  # per open brace: whether classes in it may have member templates
        for i, tok in enumerate(self.t):
            if tok.text == "{":
                name = self.class_name(i)
                scope = all(enclosing)  # not a block: local classes have no member templates
                if name is not None and scope:
                    self.class_members(i, self.match(i, "{", "}"))
                elif name:
                    self.local_class_assignment(i, self.match(i, "{", "}"), name)
                enclosing.append(scope and (name is not None or self.opens_namespace(i)))
            elif tok.text == "}" and enclosing:
                enclosing.pop()

    def local_class_assignment(self, open_: int, close: int, name: str) -> None:
        """A class local to a function gets its assignments in any address space without member templates
        (MTLSIM_LOCAL_SPACE_ASSIGNMENT), unless it declares an assignment of its own."""
        if any(self.text(k) == "operator" and self.text(k + 1) == "=" for k in range(open_, close)):
            return
        kept = self.emitted(close)
        self.out[close] = self.code(f"MTLSIM_LOCAL_SPACE_ASSIGNMENT({name})", close) + kept

    def opens_namespace(self, brace: int) -> bool:
        j = brace - 1
        while j >= 0 and (self.t[j].kind == "id" or self.text(j) == "::") and self.text(j) != "namespace":
            j -= 1
        return self.text(j) == "namespace" or (self.t[j].kind == "str" and self.text(j - 1) == "extern")

    def class_name(self, brace: int) -> str | None:
        """The name of the class whose body opens at ``brace``, if it is one."""
        j = brace - 1
        while j >= 0 and self.text(j) not in (";", "{", "}"):
            j -= 1
        head = [k for k in range(j + 1, brace) if self.t[k].text != "typedef"]
        while head and self.text(head[0]) == "template" and self.text(head[0] + 1) == "<":
            after = self.matching_angle(head[0] + 1) + 1
            head = [k for k in head if k >= after]
        if not head or self.text(head[0]) not in ("struct", "class", "union"):
            return None
        depth = 0
        for k in head:
            depth += {"<": 1, ">": -1, ">>": -2}.get(self.text(k), 0)
            if depth <= 0 and self.text(k) == "(" and self.text(k - 1) not in ("alignas", "__attribute__", "("):
                return None  # `struct S f() {`: a function returning a struct
        names = [k for k in head[1:] if self.t[k].kind == "id" and self.text(k) not in ("final", "alignas")]
        return self.text(names[0]) if names else ""

    def class_members(self, open_: int, close: int) -> None:
        name = self.class_name(open_) or self.name_typedef_struct(open_)
        seen: set = set()
        forwards: dict[str, tuple] = {}  # forwarder key -> (spaces, macro call[, member name])
        j = open_ + 1
        while j < close:
            start, paren, end = j, None, None
            while j < close:
                s = self.text(j)
                if s == "template" and self.text(j + 1) == "<":
                    j = self.matching_angle(j + 1) + 1
                    continue
                if s in ("public", "private", "protected") and self.text(j + 1) == ":":
                    j += 2
                    start = j
                    continue
                if s == "(":
                    if paren is None and self.text(j - 1) not in ("__attribute__", "alignas", "operator"):
                        paren = j  # (the parameters of `operator()` come after its own parentheses)
                    j = self.match(j, "(", ")") + 1
                    continue
                if s == "[":
                    j = self.match(j, "[", "]") + 1
                    continue
                if s == "{":
                    k = self.match(j, "{", "}") + 1
                    if paren is not None and self.text(j - 1) in (")", "}") or self.is_body(paren, j):
                        end = k
                        j = k
                        break
                    j = k
                    continue
                if s == ";":
                    j += 1
                    end = j
                    break
                j += 1
            if end is None:
                break
            if paren is not None:
                self.member_function(start, paren, end, name, seen, forwards)
        calls = [f"MTLSIM_SPACE_ASSIGNMENT({name})"] if name else []
        for spaces, call, *member in forwards.values():
            calls.append(call.replace("MTLSIM_SPACES", ", ".join(sorted(spaces))))
            if member and member[0] not in seen:  # no member for the thread space: erased spaces call this one
                calls.append(call.replace("MTLSIM_SPACE_", "MTLSIM_ERASED_SPACE_").replace("MTLSIM_SPACES", ""))
        if calls:
            kept = self.emitted(close)
            self.out[close] = self.code(" ".join(calls), close) + kept

    def name_typedef_struct(self, brace: int) -> str | None:
        """``typedef struct { ... } T;`` (ggml's block types) gets a tag of its own, so that its assignments
        can name the class; None for other unnamed classes."""
        if self.text(brace - 1) not in ("struct", "union") or self.text(brace - 2) != "typedef":
            return None
        tag = f"mtlsim_typedef_{brace}"
        kept = self.emitted(brace - 1)
        self.out[brace - 1] = kept + self.code(tag, brace - 1)
        return tag

    def is_body(self, paren: int | None, brace: int) -> bool:
        """Whether the '{' at ``brace`` opens the body of the function whose parameters open at ``paren``."""
        if paren is None:
            return False
        close = self.match(paren, "(", ")")
        qualifiers = {"const", "volatile", "thread", "device", "constant", "threadgroup", "&", "&&", "noexcept",
                      "override", "final"}
        return all(self.text(k) in qualifiers for k in range(close + 1, brace))

    def member_function(self, start: int, paren: int, end: int, class_name, seen: set, forwards: dict) -> None:
        close = self.match(paren, "(", ")")
        k, spaces = close + 1, []
        while self.text(k) in ("const", "volatile", "thread", "device", "constant", "threadgroup", "&", "&&"):
            if self.text(k) in ("device", "constant", "threadgroup"):
                spaces.append(k)
            k += 1
        key = tuple(self.text(m) for m in range(start, k) if m not in spaces and self.text(m) != "thread")
        duplicate = key in seen
        seen.add(key)
        operator = next((m for m in range(start, paren) if self.text(m) == "operator"), None)
        name_at = paren - 1
        name = " ".join(self.text(m) for m in range(operator, paren)) if operator is not None else self.text(name_at)
        if not spaces:
            seen.add(name)  # a member for the thread space, which erased address spaces call instead
            return
        # By number (mtlsim::Space): the prelude defines `device`, `constant` and `threadgroup` as macros.
        space = {"device": "1", "constant": "2", "threadgroup": "3"}[self.text(spaces[0])]
        for m in spaces:
            self.replace(m, [])
        template = self.text(start) == "template" and self.text(start + 1) == "<"
        conversion = operator is not None and self.t[operator + 1].kind == "id" and \
            self.text(operator + 1) not in ("new", "delete")
        if self.text(name_at) == "~" or (operator is None and self.text(name_at) == class_name) or \
                (conversion and template):
            # Constructors (objects are constructed in the thread space only) and conversion templates
            # (their target is deduced, no other name can stand for them): the thread space's copy
            # serves, which MSL code writes with the same body.
            if duplicate:
                self.drop(start, end)
            if conversion:
                target = " ".join(self.text(m) for m in range(operator + 1, paren))
                params = " ".join(self.text(m) for m in range(start + 2, self.matching_angle(start + 1)))
                entry = forwards.setdefault("operator " + target, (set(), (
                    f"MTLSIM_SPACE_CONVERSION_TEMPLATE((MTLSIM_SPACES), ({params}), {target})")))
                entry[0].add(space)
            return
        # Others keep their body under a name of their own, which the forwarder for their space calls.
        n = len(forwards)
        renamed = f"mtlsim_space{space}_{self.text(name_at) if operator is None else f'operator{n}'}"
        if conversion:
            target = " ".join(self.text(m) for m in range(operator + 1, paren))
            self.replace(operator, self.code(f"{target} {renamed}", operator))
            self.drop(operator + 1, paren)
            forwards[renamed] = ({space}, f"MTLSIM_SPACE_CONVERSION_TO((MTLSIM_SPACES), {renamed}, {target})", name)
        else:
            self.replace(operator if operator is not None else name_at, self.code(renamed, name_at))
            if operator is not None:
                self.drop(operator + 1, paren)
            forwards.setdefault(renamed, ({space}, f"MTLSIM_SPACE_METHOD((MTLSIM_SPACES), {renamed}, {name})", name))

    def array_parameters(self) -> None:
        """``constant const int64_t strides[2]`` as a parameter -> ``(* strides)``: C++ adjusts an array
        parameter to a pointer as MSL does, but clang refuses the address space on the array's form."""
        for i, tok in enumerate(self.t):
            if tok.text != "[" or self.text(i + 1) == "[" or self.text(i - 1) == "[" or self.t[i - 1].kind != "id":
                continue
            close = self.match(i, "[", "]")
            if self.text(close + 1) not in (",", ")") or self.out[i - 1] is not None:
                continue
            j, depth, spaced = i - 2, 0, False
            while j >= 0:
                s = self.text(j)
                if s in (")", "]", ">", ">>"):
                    depth += 1
                elif s in ("(", "[", "<"):
                    if depth == 0:
                        break
                    depth -= 1
                elif s in (",", ";", "{", "}") and depth == 0:
                    break
                spaced |= depth == 0 and s in ("device", "constant", "threadgroup")
                j -= 1
            if spaced and self.text(j) in ("(", ","):
                self.replace(i - 1, self.code(f"( * {self.text(i - 1)} )", i - 1))
                self.drop(i, close + 1)

    def constant_objects(self) -> None:
        """Objects in the constant address space built by a constructor (MLX's logging.h:
        ``constant mlx::os_log logger("mlx", "binary_ops");``): string literals live in the constant
        address space in MSL, and ``constant T x(args);`` becomes ``constant T x = T(args);``, which
        clang allows for an object outside the generic space (the constructor runs on a temporary)."""
        for i, tok in enumerate(self.t):
            if tok.kind == "str" and self.out[i] is None and self.text(i - 1) in ("(", ","):
                end = i
                while self.t[end + 1].kind == "str":
                    end += 1
                if self.text(end + 1) in (")", ",") and self.callee(i) not in _LITERAL_CALLEES:
                    self.replace(i, self.code("( constant const char * )", i) + [tok])
            elif tok.text == "constant" and self.text(i - 1) in (";", "{", "}", "static") and self.out[i] is None:
                j = i + 1
                while self.text(j) not in ("(", ";", "=", "*", "&", "[", "{") and j < len(self.t) - 1:
                    j += 1
                if self.text(j) != "(" or self.t[j - 1].kind != "id" or self.text(self.match(j, "(", ")") + 1) != ";":
                    continue
                kind = [self.text(k) for k in range(i + 1, j - 1) if self.text(k) not in _SPECIFIERS]
                if kind:
                    self.replace(j, self.code(f"= {' '.join(kind)} (", j))

    def const_nearby(self, i: int) -> bool:
        """Whether the declaration of the address space at i says const or constexpr already."""
        j = i - 1
        while self.text(j) in _SPECIFIERS:
            if self.text(j) in ("const", "constexpr"):
                return True
            j -= 1
        j, depth = i + 1, 0
        while j < len(self.t):
            s = self.text(j)
            if s == "<":
                depth += 1
            elif s in (">", ">>"):
                depth -= len(s)
            elif depth <= 0 and s in ("*", "&", "&&", "=", ";", ",", "(", "[", "{", ")"):
                return False
            elif depth <= 0 and s in ("const", "constexpr"):
                return True
            j += 1
        return False
