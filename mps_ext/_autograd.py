"""Autograd of the mps_ext:: operators in both modes, registered at their Autograd key.

``torch.library.register_autograd`` gives an operator a backward only: under
forward-mode AD (``torch.autograd.forward_ad``, ``torch.func.jvp``, ``jacfwd``)
its tangents were silently dropped. Here each operator gets one
``torch.autograd.Function`` with a backward and a forward derivative (``jvp``),
which torch.func's transforms reach too; a mode an operator has no formula
for raises, naming the operator.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch.autograd import forward_ad

from torch._functorch.autograd_function import enable_single_level_autograd_function
from torch._library.utils import fill_defaults

_lib = torch.library.Library("mps_ext", "IMPL")  # holds the Autograd kernels
_SAVED = object()  # stands for a tensor input in ctx.fw_inputs: the tensor is in ctx.saved_tensors


def _forward_ad_active() -> bool:
    # Forward-mode AD (torch.func.jvp included) runs inside a dual level.
    return forward_ad._current_level >= 0


def _apply(function: type, *args):
    # As torch.func runs an autograd.Function at one of its levels (custom_function_call).
    with enable_single_level_autograd_function():
        return super(torch.autograd.Function, function).apply(*args)


@contextlib.contextmanager
def _differentiable_below():
    # Function.apply runs forward and jvp with grad and forward-grad modes off. torch.func's outer levels
    # (a derivative of a derivative: hessian, jacrev of jacrev, jacfwd of jacfwd) differentiate what they
    # compute only with both on, as torch's own derivative kernels leave them.
    with torch.enable_grad(), forward_ad._set_fwd_grad_enabled(True):
        yield


def _flat(values) -> list:
    out = []
    for v in values:
        out.extend(v if isinstance(v, (tuple, list)) else [v])
    return out


def _own(outputs):
    """``outputs`` with each view made a tensor of its own, the same memory and strides.

    The kernels return some results as views of the buffer they wrote (reshaped to the input's batch shape,
    a column-major matrix as the transpose of a row-major one). autograd holds such a view as one made inside
    the custom Function, or in no-grad mode, and raises when an in-place op (``nn.ReLU(inplace=True)``,
    ``y += r``) modifies it, where torch's own results take one. ``detach`` keeps the strides exactly (torch's,
    size-1 dimensions included, which ``_unsafe_view`` would recompute) and drops no history: these are the
    kernels' results, computed below autograd on tensors no transform wraps any more.
    """
    if isinstance(outputs, tuple):
        return tuple(_own(o) for o in outputs)
    return outputs.detach() if outputs._is_view() else outputs


def tangent_sum(terms, out: torch.Tensor) -> torch.Tensor:
    """The tangent of ``out`` made of the terms of its inputs' tangents (None where an input has none)."""
    terms = [t for t in terms if t is not None]
    total = sum(terms[1:], terms[0]) if terms else torch.zeros((), dtype=out.dtype, device=out.device)
    return total.to(out.dtype).expand(out.shape)


def register(name: str, setup_context: Callable, backward: Callable | None = None,
             jvp: Callable | None = None) -> None:
    """Differentiate ``torch.ops.mps_ext.<name>``.

    ``setup_context(ctx, inputs, kwargs, output)`` saves what ``backward(ctx,
    *grads)`` needs (one gradient per positional input; keyword-only inputs get
    none). ``jvp(inputs, kwargs, output, tangents)`` returns the output's
    tangent(s) from the inputs' (``None`` for an input without one). A missing
    formula raises when that mode differentiates through the operator.
    """
    op = getattr(torch.ops.mps_ext, name).default
    schema = op._schema

    class Function(torch.autograd.Function):
        @staticmethod
        def forward(*args):
            *args, kwargs = args
            with _differentiable_below(), torch._C._AutoDispatchBelowAutograd():
                return _own(op(*args, **kwargs))

        @staticmethod
        def setup_context(ctx, inputs, output):
            *args, kwargs = inputs
            integer = [o for o in _flat([output]) if not (o.is_floating_point() or o.is_complex())]
            if integer:
                ctx.mark_non_differentiable(*integer)
            setup_context(ctx, tuple(args), kwargs, output)
            if _forward_ad_active():
                ctx.fw_inputs = [_SAVED if isinstance(a, torch.Tensor) else a for a in args]
                ctx.fw_kwargs = kwargs
                ctx.save_for_forward(*[a for a in args if isinstance(a, torch.Tensor)], *_flat([output]))

        @staticmethod
        def backward(ctx, *grads):
            if backward is None:
                raise RuntimeError(f"mps_ext.{name} has no backward (reverse-mode) derivative")
            needs = ctx.needs_input_grad
            ctx.needs_input_grad = needs[:-1]
            try:
                result = backward(ctx, *grads)
            finally:
                ctx.needs_input_grad = needs
            return (*(result if isinstance(result, tuple) else (result,)), None)

        @staticmethod
        def jvp(ctx, *tangents):
            if jvp is None:
                raise NotImplementedError(f"mps_ext.{name} has no forward-mode derivative")
            saved = iter(ctx.saved_tensors)
            args = [next(saved) if a is _SAVED else a for a in ctx.fw_inputs]
            output = tuple(saved)
            # Not differentiated at this level (its own tangents have none), only at the outer ones.
            with _differentiable_below(), torch._C._AutoDispatchBelowAutograd():
                return jvp(args, ctx.fw_kwargs, output if len(output) > 1 else output[0], tangents[:-1])

    Function.__name__ = f"MpsExt_{name}"

    def autograd_kernel(keyset, *args, **kwargs):
        if _forward_ad_active() or (torch.is_grad_enabled() and torch._C._any_requires_grad(*args)):
            # The dispatcher drops trailing arguments equal to their defaults; formulas get them all.
            args, kwargs = fill_defaults(schema, args, kwargs)
            # The Autograd key runs below torch.func's transforms, which have already unwrapped their
            # tensors: autograd.Function.apply would hand the call back to them.
            return _apply(Function, *args, kwargs)
        with torch._C._AutoDispatchBelowAutograd():
            return _own(op.redispatch(keyset & torch._C._after_autograd_keyset, *args, **kwargs))

    _lib.impl(name, autograd_kernel, "Autograd", with_keyset=True)

