"""torch.compile with the overrides on: inductor keeps the overridden aten ops for the dispatcher.

Inductor decomposes ``aten::_softmax`` and ``_log_softmax`` into its own reductions, and lowers
``mm`` / ``addmm`` to its own templates or to ``out=`` variants the overrides do not replace: left
alone, a compiled graph never reaches mps_ext's kernels. While a device's overrides are on, every op
they replace (``_C._overridden_ops``) on that device's tensors is kept out of inductor's
decompositions and lowered as a fallback, a call through the dispatcher with the strides the op had
in eager mode, so the override makes the same choice (kernel or torch, and why) as in eager.
Inductor is patched once it is imported (torch imports it on the first compile); its decompositions
and lowerings of other devices, and of every device while the overrides are off, are its own.

A compiled artifact holds the decisions of the override state it was compiled under (compiled while
they are off, inductor's own code, which never reaches the kernels). So a change of that state drops
dynamo's compiled frames, and the state is part of ``torch.compiler.config.cache_key_tag``, which every
compile cache key (FX graph, AOT autograd, in memory and on disk) includes.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import re
import sys

import torch
from torch.utils import _pytree as pytree

from . import _C

_DEVICES = ("cpu", "mps")
_INDUCTOR = "torch._inductor.compile_fx"  # imported before inductor compiles anything
_TAG = re.compile(r"\[mps_ext [^\]]*\]")
_wrapped: set[torch._ops.OpOverload] = set()
_state: list[str] = []  # the devices whose overrides were on at the last change
_seen: set[torch._ops.OpOverload] = set()  # every op the overrides have replaced on some device


def _overridden(device_type: str) -> set[torch._ops.OpOverload]:
    if device_type not in _DEVICES:
        return set()
    return {getattr(torch.ops.aten, name).default for name in _C._overridden_ops(device_type)}


def _keeps(op: torch._ops.OpOverload, args, kwargs, device_of) -> bool:
    """Whether the overrides of the device of the call's first tensor replace ``op``."""
    for leaf in pytree.tree_leaves((args, kwargs)):
        device = device_of(leaf)
        if device is not None:
            return op in _overridden(device.type)
    return False


def _fake_device(x):
    return x.device if isinstance(x, torch.Tensor) else None


def _ir_device(x):
    from torch._inductor import ir

    return x.get_device() if isinstance(x, ir.IRNode) else None


def _keeping_decomposition(op, decompose):
    def decomposition(*args, **kwargs):
        # NotImplemented leaves the op in the graph (proxy_tensor's maybe_handle_decomp).
        return NotImplemented if _keeps(op, args, kwargs, _fake_device) else decompose(*args, **kwargs)

    decomposition.mps_ext_keeps = op
    return decomposition


def _wrap(op: torch._ops.OpOverload) -> None:
    """Keep ``op`` out of inductor's decompositions and lower it as a fallback where it is overridden."""
    from torch._inductor import decomposition
    from torch._inductor import lowering as lowerings
    from torch._inductor.virtualized import V

    tables = [decomposition.decompositions, decomposition.select_decomp_table()]
    if hasattr(decomposition, "fast_random_decomps"):  # a cached copy of the table
        tables.append(decomposition.fast_random_decomps())
    for table in tables:
        if op in table and not hasattr(table[op], "mps_ext_keeps"):
            table[op] = _keeping_decomposition(op, table[op])

    inductors = lowerings.lowerings.get(op)
    fallback = lowerings.fallback_handler(op, add_to_fallback_set=False)

    def lower(*args, **kwargs):
        if inductors is not None and not _keeps(op, args, kwargs, _ir_device):
            return inductors(*args, **kwargs)
        # The strides eager mode gives the op (a transposed weight stays one): the same decision. Inductor
        # adds defaults to kwargs (use_fast_accum=False) that the graph's node does not hold.
        node = V.graph.current_node
        args, traced = lowerings.constrain_to_fx_strides(node, *args, **{k: kwargs[k] for k in node.kwargs})
        return fallback(*args, **{**kwargs, **traced})

    lowerings.add_needs_realized_inputs(op)
    lowerings.register_lowering(op, type_promotion_kind=None)(lower)
    _wrapped.add(op)


def _wrap_overridden() -> None:
    for device in _DEVICES:
        for op in _overridden(device) - _wrapped:
            _wrap(op)


class _AfterInductorImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Wraps the overridden ops as soon as inductor's entry point has been imported."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _INDUCTOR:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None:
            self.loader = spec.loader
            spec.loader = self
        return spec

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        sys.meta_path.remove(self)
        _wrap_overridden()


def _build() -> str:
    """This build of the extension (its library's size and time): artifacts traced through another build's
    kernels and fallbacks (an op it decomposed, one it kept) are not this one's."""
    st = os.stat(_C.__file__)
    return f"{st.st_size:x}-{st.st_mtime_ns:x}"


def _tag(on: list[str]) -> None:
    config = torch.compiler.config
    config.cache_key_tag = _TAG.sub("", config.cache_key_tag) + (
        f"[mps_ext {_build()}" + (f" overrides: {','.join(on)}]" if on else "]"))


def install() -> None:
    """Prepare inductor for the overrides (now if it is imported, else when it is)."""
    _tag(_state)
    if _INDUCTOR in sys.modules:
        _wrap_overridden()
    elif not any(isinstance(f, _AfterInductorImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterInductorImport())


def state_changed() -> None:
    """After the overrides of a device were enabled or disabled: no compiled artifact of the old state is used."""
    on = [d for d in _DEVICES if _C._overrides_is_enabled(d)]
    if on == _state:
        return
    _state[:] = on
    # The Python dispatcher, which tracing runs, caches each op's kernel per dispatch key (linear's
    # autograd kernel at AutogradCPU exists only while the cpu overrides are on).
    for device in on:
        _seen.update(_overridden(device))
    for op in _seen:
        op._dispatch_cache.clear()
    _tag(on)
    if _INDUCTOR in sys.modules:
        _wrap_overridden()
    if "torch._dynamo" in sys.modules:
        torch._dynamo.reset_code_caches()
