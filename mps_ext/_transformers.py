"""mps_ext's attention in Hugging Face transformers, under the name ``"mps_ext"``:
``from_pretrained(..., attn_implementation="mps_ext")`` or ``model.set_attn_implementation("mps_ext")``.

Registered with transformers' AttentionInterface (and its sdpa mask builder under the same name) as soon as
``transformers.modeling_utils`` is imported, whether that happens before or after ``import mps_ext``.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

import torch

NAME = "mps_ext"
_MODULE = "transformers.modeling_utils"


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      is_causal: bool | None = None, sliding_window: int | None = None,
                      s_aux: torch.Tensor | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """An attention layer's call: query (batch, heads, q_len, dim), key and value (batch, KV heads, keys, dim)
    as transformers passes them; returns (batch, q_len, heads, v_dim) and no weights. GQA reads each KV head
    once for its query heads; gpt-oss's sinks (``s_aux``) and Gemma-2's logit softcapping (``softcap``) go to
    the kernels. A mask, when transformers built
    one, holds causality, padding and the sliding window; without one, the call is causal over the keys
    (transformers drops the mask only where the query's rows end at the last key) and a sliding window is the
    kernels' own, which skip the keys outside it."""
    from ._ops import scaled_dot_product_attention

    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    masked = attention_mask is not None
    out = scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout if module.training else 0.0,
        is_causal=bool(causal and not masked and query.shape[2] > 1), scale=scaling,
        enable_gqa=query.shape[1] != key.shape[1], sinks=s_aux,
        window=sliding_window if causal and not masked else None, softcap=kwargs.get("softcap"))
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Registers ``"mps_ext"`` with the transformers already imported."""
    from transformers import masking_utils, modeling_utils

    modeling_utils.AttentionInterface.register(NAME, attention_forward)
    masking_utils.AttentionMaskInterface.register(NAME, masking_utils.sdpa_mask)


class _RegisterOnImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds transformers.modeling_utils with the other finders and registers once it has run."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _MODULE:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        self._loader, spec.loader = spec.loader, self
        return spec

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        sys.meta_path.remove(self)
        register()


def install() -> None:
    """Registers now if transformers' modeling code is loaded, else when it loads."""
    if _MODULE in sys.modules:
        register()
    elif not any(isinstance(f, _RegisterOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterOnImport())
