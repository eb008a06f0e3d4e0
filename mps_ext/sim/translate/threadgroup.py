"""Threadgroup memory: the variables a kernel declares in it become storage shared by the threadgroup, and
each kernel gets the bytes they take, as Metal's pipelines report them."""

from __future__ import annotations

import re

from .stream import _TokenStream


class _ThreadgroupMemory(_TokenStream):
    """Reads the kernel bodies that kernels.py records; writes their sizers after every other rewrite."""

    def threadgroup_declaration(self, i: int) -> int:
        """``threadgroup T a[N], b;`` -> references to threadgroup-shared storage."""
        end, depth = i, 0
        while not (self.text(end) == ";" and depth == 0):
            if end >= len(self.t) or (depth == 0 and self.text(end) == "}"):
                self.err(i, "expected ';' after the threadgroup declaration")
            depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(self.text(end), 0)
            end += 1
        body = list(range(i + 1, end))
        first_name = None
        angle = 0
        for k in body:
            s = self.t[k].text
            if s == "<":
                angle += 1
            elif s in (">", ">>"):
                angle -= len(s)
            elif angle == 0 and s in ("*", "&", "&&"):
                return i + 1  # a pointer or reference into threadgroup memory: thread-private
            elif angle == 0 and s in ("[", ",", "=", ";") and first_name is None:
                first_name = k - 1
                break
        if first_name is None:
            first_name = end - 1
        type_src = " ".join(self.t[k].text for k in range(i + 1, first_name))
        declarators, cur = [], []
        depth = 0
        for k in range(first_name, end):
            s = self.t[k].text
            depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(s, 0)
            if s == "," and depth == 0:
                declarators.append(cur)
                cur = []
            else:
                cur.append(k)
        declarators.append(cur)
        src = []
        kernel = next((d for d in self.kernel_bodies if d["body"][0] < i < d["body"][1]), None)
        for d in declarators:
            name = self.t[d[0]].text
            if any(self.t[k].text == "=" for k in d):
                self.err(d[0], "MSL rule 'threadgroup initializer': a threadgroup variable cannot have an initializer "
                               "(assign it after its declaration, then a barrier)")
            dims = " ".join(self.t[k].text for k in d[1:])
            if kernel:
                kernel["threadgroup"].append((i, f"{type_src} {dims}"))
            # Declared with its own type (not auto), so compiler messages spell it as written.
            src.append(f"threadgroup {type_src} ( & {name} ) {dims} = "
                       f"::mtlsim::threadgroup_var < threadgroup {type_src} {dims} > "
                       f"( {self.sites} , {self.site(i)} ) ;")
            self.sites += 1
        self.drop(i, end + 1)
        self.replace(i, self.code(" ".join(src), i))
        return end + 1

    def threadgroup_sizer(self, kernel: dict) -> None:
        """After a kernel's body: a constexpr function of its template parameters that gives the bytes of
        threadgroup memory its variables take, as Metal's staticThreadgroupMemoryLength does. The
        ``constexpr`` locals declared before them come along, since array sizes may use them; a size that
        uses another local (``const uint n = 64;``) is not computed (0). Emitted after every rewrite, from
        the header and locals as translated."""
        body, end = kernel["body"]
        last = max((at for at, _ in kernel["threadgroup"]), default=body)
        locals_, others, depth, start = [], set(), 0, body + 1
        for k in range(body + 1, last):
            s = self.text(k)
            depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(s, 0)
            if depth == 0 and s in (";", "}"):  # the end of a statement of the body itself
                words = [self.text(j) for j in range(start, min(start + 2, k))]
                if s == ";" and "constexpr" in words:
                    locals_.append(self.translated(start, k + 1))
                elif s == ";":  # the name it declares (or assigns), if any: before its first '=', '[' or '('
                    stop = next((j for j in range(start, k) if self.text(j) in ("=", "[", "(")), k)
                    others.add(self.text(stop - 1))
                start = k + 1
        used = {w for _, t in kernel["threadgroup"] for w in re.findall(r"[A-Za-z_]\w*", t)}
        sizes = ", ".join(f"{{sizeof(threadgroup {t}), alignof(threadgroup {t})}}" for _, t in kernel["threadgroup"])
        bytes_ = "0" if used & others else f"::mtlsim::threadgroup_bytes({{{sizes}}})"
        name = kernel["sizer"].split("::")[-1]
        src = (f"{self.translated(*kernel['header'])} constexpr uint32_t {name}() {{ "
               f"{'' if bytes_ == '0' else ' '.join(locals_)} return {bytes_}; }}")
        # Right after the '}', before the entry a kernel that is not a template has there, which uses it.
        kept = self.emitted(end)
        self.out[end] = kept[:1] + self.code(src, end) + kept[1:]
