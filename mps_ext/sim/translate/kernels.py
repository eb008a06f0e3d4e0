"""Kernel functions: their definitions (return type, thread limit, overloads) and the explicit
instantiations that give kernel templates their ``[[host_name]]``."""

from __future__ import annotations

import re

from .stream import _TokenStream
from .tokens import _CLOSE, _OPEN


class _Kernels(_TokenStream):
    """Finds every kernel and the host names it goes by; ``parameters`` (arguments.py) binds its parameters
    and ``add_entry`` (glue.py) gives each host name its entry point."""

    def is_kernel_keyword(self, i: int) -> bool:
        if self.t[i].text == "kernel" and self.text(i - 1) not in (".", "->", "::"):
            return True
        return self.is_attr_start(i) and any(n == "kernel" for n, _ in self.attributes(i))

    def kernel_definition(self, start: int, k: int, scopes) -> int:
        """A kernel function (template or not) from its statement start; returns where the main pass goes on."""
        templated = self.text(start) == "template" and self.text(start + 1) == "<"
        attrs = {}
        j = self.matching_angle(start + 1) + 1 if templated else start
        while j < len(self.t) and self.text(j) not in ("(", ";", "{", "}"):
            if self.is_attr_start(j):
                attrs.update((n, a) for n, a in self.attributes(j))
                j = self.attr_end(j)
                continue
            j += 1
        if self.text(j) != "(":
            self.err(k, "expected the kernel's parameter list")
        paren = j
        name_at = paren - 1
        if self.text(name_at) in (">", ">>"):
            self.err(paren, "explicit specializations of kernels are not supported; use an explicit instantiation")
        if self.t[name_at].kind != "id":
            self.err(paren, "expected the kernel's name before '('")
        name = self.text(name_at)
        self.check_kernel_return(start, name_at)
        close = self.match(paren, "(", ")")
        body = close + 1
        while self.text(body) not in ("{", ";"):
            if body >= len(self.t):
                self.err(close, f"unexpected end of input: kernel '{name}' has no body")
            if self.is_attr_start(body):
                attrs.update((n, a) for n, a in self.attributes(body))
                body = self.attr_end(body)
            else:
                body += 1
        binders = self.parameters(paren, close, check=self.text(body) == "{")
        limit = attrs.get("max_total_threads_per_threadgroup")
        definition = {
            # Qualified, so no function that `using namespace metal` brings in can make it ambiguous.
            "name": "::" + "::".join([*_namespaces(scopes), name]), "binders": binders, "at": name_at,
            "max_threads": "".join(t.text for t in limit) if limit else "0",
            "header": (start, self.matching_angle(start + 1) + 1) if templated else (start, start),
            "threadgroup": [],  # type-ids of its threadgroup variables
        }
        if self.text(body) == ";":
            return body + 1  # a declaration; the definition comes later
        if templated and limit:
            self.template_limit(start, definition, self.match(body, "{", "}"), scopes)
        definition["body"] = (body, self.match(body, "{", "}"))
        definition["sizer"] = "::".join([*_namespaces(scopes), f"mtlsim_threadgroup_bytes_{len(self.kernel_bodies)}"])
        self.kernel_bodies.append(definition)
        key = (*_namespaces(scopes), name)
        if key in self.plain_kernels or (key in self.defs and not templated):
            first = self.plain_kernels.get(key) or self.defs[key][0]
            self.err(name_at, f"MSL rule 'kernel overload': kernel functions cannot be overloaded; '{name}' is "
                              f"already defined at {self.where(first['at'])}")
        if not templated:
            self.plain_kernels[key] = definition
        self.defs.setdefault(key, []).append(definition)
        end = self.match(body, "{", "}")
        if not templated:
            host = _host_name(attrs.get("host_name")) or name
            self.add_entry(host, definition["name"], definition, at=name_at, insert_after=end, scopes=scopes)
        return body  # the main pass walks the body like any other block

    def template_limit(self, start: int, definition: dict, end: int, scopes) -> None:
        """``[[max_total_threads_per_threadgroup(N)]]`` of a kernel template: N may use the template's
        parameters, so it becomes a variable template beside the kernel, which each instantiation's glue
        names with its template arguments."""
        close = self.matching_angle(start + 1)
        header = " ".join(self.text(k) for k in range(start, close + 1))
        var = f"mtlsim_max_threads_{definition['at']}"
        kept = self.emitted(end)
        self.out[end] = kept + self.code(f"{header} constexpr unsigned {var} = {definition['max_threads']};", end)
        qualified = "::" + "::".join([*_namespaces(scopes), var])
        definition["limit"] = (qualified, self.template_parameters(start + 1, close))

    def template_parameters(self, open_: int, close: int) -> set[str]:
        """The names declared by the template parameter list between ``open_`` and ``close``."""
        names, depth, default = set(), 0, False
        for k in range(open_ + 1, close + 1):
            s = self.text(k)
            if k == close or (depth == 0 and s in (",", "=")):
                if not default and self.t[k - 1].kind == "id":
                    names.add(self.text(k - 1))
                default = s == "="
            depth += (s in _OPEN or s == "<") - (s in _CLOSE or s == ">")
        return names

    def check_kernel_return(self, start: int, name_at: int) -> None:
        """MSL: kernel functions return void."""
        j, kept = start, []
        while j < name_at:
            s = self.text(j)
            if self.is_attr_start(j):
                j = self.attr_end(j)
                continue
            if s == "template" and self.text(j + 1) == "<":
                j = self.matching_angle(j + 1) + 1
                continue
            if s == "__attribute__" and self.text(j + 1) == "(":
                j = self.match(j + 1, "(", ")") + 1
                continue
            if s not in ("kernel", "static", "inline", "extern", "metal", "::"):
                kept.append(s)
            j += 1
        if kept != ["void"]:
            self.err(name_at, f"MSL rule 'kernel return type': kernel functions must return void, "
                              f"'{self.text(name_at)}' returns '{' '.join(kept)}'")

    def instantiation(self, i: int, scopes) -> int:
        """An explicit instantiation: ``template [[host_name("x")]] kernel void f<T>(...);``, the same with
        deduced template arguments, the ``decltype`` form and the typedef form ``template ... kernel f_t f<T>;``."""
        end = self.find(i, (";",), "';' after the explicit instantiation")
        attrs, is_kernel, j = {}, False, i + 1
        while j < end:
            if self.is_attr_start(j):
                for n, a in self.attributes(j):
                    attrs[n] = a
                    is_kernel |= n in ("kernel", "host_name")
                j = self.attr_end(j)
                continue
            is_kernel |= self.t[j].text == "kernel"
            j += 1
        if not is_kernel:
            return end + 1  # an instantiation of an ordinary template
        host = _host_name(attrs.get("host_name"))
        if not host:
            self.err(i, "kernel instantiations need [[host_name(\"...\")]]")
        decl = [k for k in range(i, end) if self.t[k].text == "decltype"]
        paren = next((k for k in range(i + 1, end) if self.t[k].text == "(" and not self.inside_attribute(i, k)), None)
        if decl:
            start = self.match(decl[0] + 1, "(", ")") + 1
            stop = end
        elif paren is None:  # typedef form: the declarator ends the statement
            stop = end
            start = self.declarator_start(stop, i)
        else:
            stop = paren
            start = self.declarator_start(stop, i)
        if start >= stop:
            self.err(i, "expected the instantiated kernel's name")
        declarator = " ".join(self.t[k].text for k in range(start, stop))
        name = declarator.split("<")[0].split("::")[-1].strip()
        candidates = self.lookup(scopes, name)
        if not candidates:
            self.err(i, f"instantiation of unknown kernel template '{name}'")
        # Kernel templates may be overloaded: the one whose parameters the instantiation lists.
        count = self.count_parameters(paren) if paren is not None and not decl else None
        definition = next((d for d in candidates if len(d["binders"]) == count), candidates[-1])
        declarator = definition["name"] + (" " + declarator[declarator.index("<"):] if "<" in declarator else "")
        if paren is not None and not decl and self.text(stop - 1) not in (">", ">>"):
            # Deduced template arguments: the statement becomes the function type that selects the specialization.
            alias = f"mtlsim_signature_{self.entries}"
            self.drop(i, start)
            self.replace(i, self.code(f"using {alias} = void", i))
            self.drop(start, stop)
            self.add_entry(host, f"static_cast<{alias}*>(&{declarator})", definition, at=i, insert_after=end,
                           scopes=scopes, max_threads=self.instance_limit(definition, None, i))
            return end + 1
        self.drop(i, end + 1)
        args = declarator[declarator.index("<"):] if "<" in declarator else None
        self.add_entry(host, declarator, definition, at=i, insert_after=end, scopes=scopes,
                       max_threads=self.instance_limit(definition, args, i))
        return end + 1

    def instance_limit(self, definition: dict, args: str | None, at: int) -> str:
        """The thread limit of one instantiation of a kernel template (see template_limit)."""
        if "limit" not in definition:
            return definition["max_threads"]
        var, params = definition["limit"]
        if args is not None:
            return f"{var} {args}"
        used = params & set(re.findall(r"[A-Za-z_]\w*", definition["max_threads"]))
        if used:
            self.err(at, f"[[max_total_threads_per_threadgroup({definition['max_threads']})]] uses the template "
                         f"parameters {', '.join(sorted(used))}: instantiate the kernel with explicit template "
                         f"arguments")
        return definition["max_threads"]

    def count_parameters(self, paren: int) -> int:
        close, depth, count = self.match(paren, "(", ")"), 0, 0
        for j in range(paren + 1, close):
            s = self.t[j].text
            depth += {"(": 1, "[": 1, "<": 1, ")": -1, "]": -1, ">": -1, ">>": -2}.get(s, 0)
            count += s == "," and depth == 0
        return count + (close > paren + 1 and [t.text for t in self.t[paren + 1:close]] != ["void"])

    def declarator_start(self, stop: int, floor: int) -> int:
        """Start of the (possibly qualified, possibly templated) name that ends just before ``stop``."""
        start = stop - 1
        if self.text(start) in (">", ">>"):
            start = self.matching_angle_back(start) - 1
        while start - 2 > floor and self.text(start - 1) == "::":
            start -= 2
        return max(start, floor + 1)

    def lookup(self, scopes, name):
        ns = _namespaces(scopes)
        for n in range(len(ns), -1, -1):
            found = self.defs.get((*ns[:n], name))
            if found:
                return found
        return None


def _namespaces(scopes) -> list[str]:
    return [s for s in scopes if s]


def _host_name(args) -> str | None:
    if not args:
        return None
    parts = [t.text for t in args if t.kind == "str"]
    return "".join(p[1:-1] for p in parts) or None
