"""One small adapter per architecture family: where the attention lives and what differs.

Each adapter addresses modules by transformers' own names and turns one layer into a
`LayerSpec` for the from-scratch attention. It also refuses, from the config, any feature it does
not reproduce (ALiBi, logit softcapping, an unknown rope type, ...) — never approximates it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .scratch import LayerSpec, default_inv_freq, llama3_inv_freq

__all__ = ["Adapter", "UnsupportedArchitecture", "UnsupportedFeature", "adapter_for", "ADAPTERS", "SUPPORTED_TYPES"]


class UnsupportedArchitecture(ValueError):
    """No adapter for this model type."""


class UnsupportedFeature(ValueError):
    """The model uses an attention feature the adapter does not reproduce."""


@dataclass(frozen=True)
class Adapter:
    family: str
    model_types: tuple[str, ...]
    attention: Callable  # (base_model, i) -> module whose first input is the attention's x
    out_proj: Callable  # (base_model, i) -> W_O module (its output is the block's output)
    layer_spec: Callable  # (base_model, i, config) -> LayerSpec
    check: Callable  # (config) -> None, raises UnsupportedFeature
    position_embedding: Callable | None = None  # (base_model) -> absolute position embedding module, if any

    def n_layers(self, config) -> int:
        return config.num_hidden_layers


def _lin(m: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    return m.weight.detach(), None if m.bias is None else m.bias.detach()


# --- BERT family: BERT, RoBERTa, MiniLM, ELECTRA (absolute positions, bidirectional) ---------


def _bert_check(cfg) -> None:
    kind = getattr(cfg, "position_embedding_type", "absolute")
    if kind != "absolute":
        raise UnsupportedFeature(f"position_embedding_type={kind!r}: relative position scores are not reproduced")
    if getattr(cfg, "is_decoder", False):
        raise UnsupportedFeature("BERT used as a decoder (is_decoder=True) is not supported")


def _bert_spec(base, i: int, cfg) -> LayerSpec:
    sa = base.encoder.layer[i].attention.self
    (wq, bq), (wk, bk), (wv, bv) = _lin(sa.query), _lin(sa.key), _lin(sa.value)
    wo, bo = _lin(base.encoder.layer[i].attention.output.dense)
    hs = sa.attention_head_size
    return LayerSpec(wq, wk, wv, wo, bq, bk, bv, bo, n_heads=sa.num_attention_heads,
                     n_kv_heads=sa.num_attention_heads, head_dim=hs, scale=hs**-0.5, causal=False)


BERT = Adapter(
    family="bert",
    model_types=("bert", "roberta", "electra", "xlm-roberta", "camembert"),
    attention=lambda base, i: base.encoder.layer[i].attention.self,
    out_proj=lambda base, i: base.encoder.layer[i].attention.output.dense,
    layer_spec=_bert_spec,
    check=_bert_check,
    position_embedding=lambda base: base.embeddings.position_embeddings,
)


# --- GPT-2: fused c_attn, Conv1D weights stored (in, out) -----------------------------------


def _gpt2_check(cfg) -> None:
    if getattr(cfg, "add_cross_attention", False):
        raise UnsupportedFeature("GPT-2 with cross-attention is not supported")


def _gpt2_spec(base, i: int, cfg) -> LayerSpec:
    attn = base.h[i].attn
    D, nh = attn.embed_dim, attn.num_heads
    hs = D // nh
    w, b = attn.c_attn.weight.detach().T, attn.c_attn.bias.detach()  # Conv1D (in, 3D) -> Linear (3D, in)
    scale = hs**-0.5 if attn.scale_attn_weights else 1.0
    if attn.scale_attn_by_inverse_layer_idx:
        scale /= float(i + 1)
    return LayerSpec(
        wq=w[:D], wk=w[D : 2 * D], wv=w[2 * D :], wo=attn.c_proj.weight.detach().T,
        bq=b[:D], bk=b[D : 2 * D], bv=b[2 * D :], bo=attn.c_proj.bias.detach(),
        n_heads=nh, n_kv_heads=nh, head_dim=hs, scale=scale, causal=True,
    )


GPT2 = Adapter(
    family="gpt2",
    model_types=("gpt2",),
    attention=lambda base, i: base.h[i].attn,
    out_proj=lambda base, i: base.h[i].attn.c_proj,
    layer_spec=_gpt2_spec,
    check=_gpt2_check,
    position_embedding=lambda base: base.wpe,
)


# --- rotary helpers shared by Llama and Gemma 3 ------------------------------------------


def _rope_params(cfg, layer_type: str | None = None) -> dict:
    params = getattr(cfg, "rope_parameters", None) or {}
    if layer_type is not None and layer_type in params:
        params = params[layer_type]
    if not params and getattr(cfg, "rope_theta", None) is not None:
        params = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    return dict(params)


def _inv_freq(cfg, head_dim: int, layer_type: str | None = None) -> torch.Tensor:
    p = _rope_params(cfg, layer_type)
    kind = p.get("rope_type", p.get("type", "default"))
    if p.get("partial_rotary_factor", 1.0) != 1.0:
        raise UnsupportedFeature("partial rotary embeddings (partial_rotary_factor != 1) are not reproduced")
    base = default_inv_freq(float(p["rope_theta"]), head_dim)
    if kind == "default":
        return base
    if kind == "linear":
        return base / float(p["factor"])
    if kind == "llama3":
        return llama3_inv_freq(base, float(p["factor"]), float(p["low_freq_factor"]), float(p["high_freq_factor"]),
                               int(p["original_max_position_embeddings"]))
    raise UnsupportedFeature(f"rope_type={kind!r} is not reproduced (supported: default, linear, llama3)")


def _rope_check(cfg, layer_types=(None,)) -> None:
    for lt in layer_types:
        _inv_freq(cfg, 2, lt)  # raises on an unsupported rope type


# --- Llama family: Llama, Mistral, Qwen2, SmolLM2 (rotary, grouped-query attention) ---------


def _llama_check(cfg) -> None:
    _rope_check(cfg)
    if getattr(cfg, "pretraining_tp", 1) not in (None, 1):
        raise UnsupportedFeature("pretraining_tp > 1 splits projections; not reproduced")


def _llama_spec(base, i: int, cfg) -> LayerSpec:
    attn = base.layers[i].self_attn
    (wq, bq), (wk, bk), (wv, bv), (wo, bo) = _lin(attn.q_proj), _lin(attn.k_proj), _lin(attn.v_proj), _lin(attn.o_proj)
    hs = attn.head_dim
    window = _llama_window(cfg, i)
    return LayerSpec(wq, wk, wv, wo, bq, bk, bv, bo, n_heads=cfg.num_attention_heads,
                     n_kv_heads=cfg.num_key_value_heads, head_dim=hs, scale=attn.scaling, causal=True,
                     sliding_window=window, inv_freq=_inv_freq(cfg, hs))


def _llama_window(cfg, i: int) -> int | None:
    types = getattr(cfg, "layer_types", None)
    window = getattr(cfg, "sliding_window", None)
    if types is not None:
        return window if types[i] == "sliding_attention" else None
    if cfg.model_type == "mistral":
        return window
    return None


LLAMA = Adapter(
    family="llama",
    model_types=("llama", "mistral", "qwen2"),
    attention=lambda base, i: base.layers[i].self_attn,
    out_proj=lambda base, i: base.layers[i].self_attn.o_proj,
    layer_spec=_llama_spec,
    check=_llama_check,
)


# --- Gemma 3: QK-norm, query_pre_attn_scalar, sliding layers, local/global rotary bases -----


def _gemma3_check(cfg) -> None:
    if getattr(cfg, "attn_logit_softcapping", None) is not None:
        raise UnsupportedFeature(f"attn_logit_softcapping={cfg.attn_logit_softcapping}: softcapping is not reproduced")
    if getattr(cfg, "use_bidirectional_attention", False):
        raise UnsupportedFeature("use_bidirectional_attention=True is not reproduced")
    _rope_check(cfg, set(cfg.layer_types))


def _gemma3_spec(base, i: int, cfg) -> LayerSpec:
    attn = base.layers[i].self_attn
    (wq, bq), (wk, bk), (wv, bv), (wo, bo) = _lin(attn.q_proj), _lin(attn.k_proj), _lin(attn.v_proj), _lin(attn.o_proj)
    layer_type = cfg.layer_types[i]
    hs = attn.head_dim
    return LayerSpec(
        wq, wk, wv, wo, bq, bk, bv, bo, n_heads=cfg.num_attention_heads, n_kv_heads=cfg.num_key_value_heads,
        head_dim=hs, scale=cfg.query_pre_attn_scalar**-0.5, causal=True,
        sliding_window=cfg.sliding_window if layer_type == "sliding_attention" else None,
        inv_freq=_inv_freq(cfg, hs, layer_type),
        q_norm=attn.q_norm.weight.detach(), k_norm=attn.k_norm.weight.detach(), norm_eps=attn.q_norm.eps,
    )


GEMMA3 = Adapter(
    family="gemma3",
    model_types=("gemma3_text",),
    attention=lambda base, i: base.layers[i].self_attn,
    out_proj=lambda base, i: base.layers[i].self_attn.o_proj,
    layer_spec=_gemma3_spec,
    check=_gemma3_check,
)

ADAPTERS: tuple[Adapter, ...] = (BERT, GPT2, LLAMA, GEMMA3)
SUPPORTED_TYPES = {t: a for a in ADAPTERS for t in a.model_types}


def adapter_for(config) -> Adapter:
    """The adapter for `config.model_type`, after checking its attention features are all reproduced."""
    model_type = getattr(config, "model_type", None)
    adapter = SUPPORTED_TYPES.get(model_type)
    if adapter is None:
        supported = ", ".join(f"{a.family} ({'/'.join(a.model_types)})" for a in ADAPTERS)
        raise UnsupportedArchitecture(
            f"no from-scratch attention adapter for model type {model_type!r}; supported families: {supported}"
        )
    adapter.check(config)
    return adapter
