"""Batching rules (``torch.vmap``, and the transforms built on it: ``jacfwd``, ``jacrev``, per-sample
gradients) for the mps_ext:: operators whose leading dimensions already are batches: the vmapped batch
becomes one more leading dimension and the operator runs once, one launch for the whole batch. Without a
rule torch calls the operator once per batch element, and warns.

The grouped matmuls' rows are split by ``offs``: with only the rows batched, the batch goes inside the rows
and the groups' ends scale with it. Operators whose batches mean something else (scaled_mm's 2-D operands,
quantization's per-tensor scales) keep torch's per-element fallback. The rules run the operator once per
element too where the vmapped dimension cannot join the others: a linear's batched weight, scale or bias, the
grouped matmuls' batched weights, scales or offsets, linear algebra inputs with different numbers of batch
dimensions (a batch of systems against one vector each).
"""

from __future__ import annotations

import torch


def _batched(bdim) -> bool:
    # in_dims follows the arguments' pytree: a list argument (block_size) has a list of Nones.
    return isinstance(bdim, int)


def _front(x, bdim, size: int):
    """``x`` with the vmapped dimension first: moved there, or added (expanded, no copy) when unbatched."""
    if bdim is not None:
        return x.movedim(bdim, 0)
    return x.unsqueeze(0).expand(size, *x.shape)


def _each(op, info, in_dims, args, kwargs):
    """torch's fallback, for the cases a rule cannot batch: the operator once per batch element."""
    def element(i):
        return op(*[a.select(d, i) if _batched(d) else a for a, d in zip(args, in_dims)], **kwargs)

    results = [element(i) for i in range(info.batch_size)]
    if isinstance(results[0], tuple):
        return tuple(torch.stack(parts) for parts in zip(*results)), (0,) * len(results[0])
    return torch.stack(results), 0


def _rowwise(name: str):
    op = getattr(torch.ops.mps_ext, name).default

    def rule(info, in_dims, x, dim, dtype=None):
        x = x.movedim(in_dims[0], 0)
        logical = max(x.dim() - 1, 1)  # a 0-d element's dim may be 0 or -1, as torch's
        if not -logical <= dim < logical:
            raise IndexError(f"{name}: dim {dim} is out of range for an input of {x.dim() - 1} dimensions "
                             f"(expected [{-logical}, {logical - 1}])")
        if x.dim() == 1:  # 0-d elements: each its own row of one
            return op(x.unsqueeze(-1), -1, dtype).squeeze(-1), 0
        return op(x, dim % logical + 1, dtype), 0

    torch.library.register_vmap(f"mps_ext::{name}", rule)


def _linear(name: str):
    # Only the input batched: its rows gain the vmapped dimension, one GEMV (or tiled) call for all.
    op = getattr(torch.ops.mps_ext, name).default

    def rule(info, in_dims, input, *rest, **kwargs):
        if any(_batched(d) for d in in_dims[1:]):
            return _each(op, info, in_dims, (input, *rest), kwargs)
        return op(input.movedim(in_dims[0], 0), *rest, **kwargs), 0

    torch.library.register_vmap(f"mps_ext::{name}", rule)


def _grouped(name: str, offs_at: int):
    # Mixture-of-Experts form (2-D rows sorted by group, 3-D weights, offs at position offs_at), only the rows
    # batched: row r of every batch element belongs to the same group, so with the batch placed inside the
    # rows ((rows, B, K) as rows * B rows) each group's rows stay contiguous and its ends scale by B. One
    # launch for the whole batch.
    op = getattr(torch.ops.mps_ext, name).default

    def rule(info, in_dims, *args, **kwargs):
        x, weight = args[:2]
        if (len(args) <= offs_at or args[offs_at] is None or in_dims[0] is None
                or any(_batched(d) for d in in_dims[1:]) or x.dim() != 3 or weight.dim() != 3):
            return _each(op, info, in_dims, args, kwargs)
        size = info.batch_size
        rows = x.movedim(in_dims[0], 1)
        args = [rows.reshape(rows.shape[0] * size, rows.shape[2]), *args[1:]]
        args[offs_at] = args[offs_at] * size
        out = op(*args, **kwargs)
        return out.view(rows.shape[0], size, out.shape[-1]), 1

    torch.library.register_vmap(f"mps_ext::{name}", rule)


def _solve_ranks(A_shape, B_shape) -> tuple:
    # torch.linalg.solve's rule: B is a (batch of) vector(s) when it has one dimension, or A's batch and n.
    vector = len(B_shape) == 1 or (len(B_shape) == len(A_shape) - 1 and B_shape == A_shape[:-1])
    return 2, 1 if vector else 2


def _qr_out_dims(args, kwargs):
    # In mode "r" Q is one empty tensor whatever the batch, as torch's vmapped qr returns it.
    mode = args[1] if len(args) > 1 else kwargs.get("mode", "reduced")
    return (None if mode == "r" else 0), 0


def _batched_matrices(name: str, core, out_dims=None):
    # core: how many trailing dimensions of each tensor input make one system's matrix (or vector), the ones
    # before them being batches the operator broadcasts; a tuple, or a function of the inputs' shapes. When
    # every input has as many batch dimensions, each gets the vmapped dimension first (unbatched ones
    # expanded, no copy) and the operator runs once; otherwise the vmapped dimension would not line up with
    # the others' batches, and it runs once per element. out_dims(args, kwargs): for an operator with an
    # unbatched output.
    op = getattr(torch.ops.mps_ext, name).default

    def rule(info, in_dims, *args, **kwargs):
        shapes = [list(a.shape) if d is None else list(a.movedim(d, 0).shape[1:])
                  for a, d in zip(args, in_dims) if isinstance(a, torch.Tensor)]
        ranks = core(*shapes) if callable(core) else core
        if len({len(shape) - rank for shape, rank in zip(shapes, ranks)}) > 1:
            return _each(op, info, in_dims, args, kwargs)
        args = [_front(a, d, info.batch_size) if isinstance(a, torch.Tensor) else a for a, d in zip(args, in_dims)]
        out = op(*args, **kwargs)
        if out_dims is not None:
            return out, out_dims(args, kwargs)
        return out, (0,) * len(out) if isinstance(out, tuple) else 0

    torch.library.register_vmap(f"mps_ext::{name}", rule)


for _name in ("softmax", "log_softmax"):
    _rowwise(_name)
for _name in ("linear", "fp8_linear"):
    _linear(_name)
_grouped("grouped_mm", 2)
_grouped("fp8_grouped_mm", 3)
for _name, _core, _out_dims in (("lu_factor_ex", (2,), None), ("inv_ex", (2,), None), ("qr", (2,), _qr_out_dims),
                                ("lu_solve", (2, 1, 2), None), ("solve_ex", _solve_ranks, None),
                                ("householder_product", (2, 1), None), ("solve_triangular", (2, 2), None)):
    _batched_matrices(_name, _core, _out_dims)
