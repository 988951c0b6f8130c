"""Gemma 4 and Gemma 3n (the text models): Gemma 3's layout, with what their attention modules add.

Gemma 3n's attention is Gemma 4's without k = v and with one head size: the same value norm, scale
and shared-KV layers (its AltUp and Laurel blocks change the layer input, which is captured as it is).

- a scale of 1 (the q/k norms do the scaling) and plain norm weights (w, not Gemma 3's 1 + w);
- an RMS norm of each value head, of unit weight (`LayerSpec.v_norm`);
- global (full-attention) layers with their own head size (`global_head_dim`) and KV heads
  (`num_global_key_value_heads`), rotated by "proportional" rope: part of the angle pairs turn, the
  others never do;
- `attention_k_eq_v`: on global layers the values are the keys' projection (before the k norm and
  rotary) — the spec's `wv` is the k projection itself;
- shared-KV layers (`num_kv_shared_layers`): the last layers have no k/v weights and reuse the keys
  and values of the last earlier layer of their type (sliding or full), computed from that layer's
  input (`LayerSpec.kv_layer`); verification recomputes them from the producer's captured input,
  so it compares against the K/V the model actually uses.
"""

from __future__ import annotations


import torch

from ..rotary import ROPE_INV_FREQ, rope
from ..scratch import LayerSpec
from ..family import Family, Refusal, linear_weights, norm_eps
from .llama import cached_length


def producer(cfg, i: int) -> int:
    """The layer whose keys and values layer i uses: i itself, or for a shared-KV layer the one that stores them."""
    modes = cfg.kv_sharing_modes
    if modes[i] != "reuse":
        return i
    kind = cfg.layer_types[i]
    return max(j for j in range(len(modes)) if modes[j] == "store" and cfg.layer_types[j] == kind)


def _spec(base, i: int, cfg) -> LayerSpec:
    attn = base.layers[i].self_attn
    j = producer(cfg, i)
    kv_attn = base.layers[j].self_attn  # the layer whose k/v weights make this layer's keys and values
    (wq, bq), (wo, bo) = linear_weights(attn.q_proj), linear_weights(attn.o_proj)
    (wk, bk) = linear_weights(kv_attn.k_proj)
    v_proj = getattr(kv_attn, "v_proj", None)
    (wv, bv) = (wk, bk) if v_proj is None else linear_weights(v_proj)  # k = v (Gemma 4's global layers): no v_proj
    layer_type, hs = cfg.layer_types[i], attn.head_dim
    positions = rope(cfg, hs, layer_type, whole_head=True, longest_seen=cached_length(base.rotary_emb, layer_type))
    return LayerSpec(
        wq, wk, wv, wo, bq, bk, bv, bo, n_heads=cfg.num_attention_heads, n_kv_heads=wk.shape[0] // hs,
        head_dim=hs, scale=attn.scaling, causal=True, sliding_window=attn.sliding_window, **positions.spec_fields(),
        q_norm=attn.q_norm.weight.detach(), k_norm=kv_attn.k_norm.weight.detach(), norm_eps=norm_eps(attn.q_norm),
        norm_offset=0.0, v_norm=torch.ones(hs, dtype=wq.dtype, device=wq.device),
        kv_layer=None if j == i else j,
    )


def _bidirectional(cfg) -> str | None:
    if getattr(cfg, "use_bidirectional_attention", None) == "all":
        return "use_bidirectional_attention='all' is not reproduced"
    return None


def _rope_per_layer_type(cfg) -> str | None:
    for layer_type in sorted(set(cfg.layer_types)):
        try:
            per_layer = getattr(cfg, "per_layer_config", None)  # Gemma 4: global layers have their own head size
            head_dim = per_layer[layer_type].head_dim if per_layer is not None else cfg.head_dim
            rope(cfg, head_dim, layer_type, whole_head=True)
        except Exception as exc:  # noqa: BLE001 — UnsupportedFeature, or a config transformers would refuse too
            return str(exc)
    return None


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    if model_type == "gemma3n_text":  # four layers, the last two sharing layer 0's (sliding) and 1's (full) K/V
        return AutoConfig.for_model(
            model_type, vocab_size=vocab, vocab_size_per_layer_input=vocab, hidden_size=32, intermediate_size=64,
            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=4,
            max_position_embeddings=128, hidden_size_per_layer_input=4, num_kv_shared_layers=2, laurel_rank=4,
            altup_num_inputs=2, activation_sparsity_pattern=[0.0] * 4,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"])

    # Five layers: sliding, sliding, global, then a shared-KV sliding and a shared-KV global layer that reuse
    # layers 1 and 2's keys and values. Global layers: one KV head where k = v, proportional rope turning half
    # their angle pairs; their head size is the sliding layers' here, so that every family-wide test (mean
    # ablation's one head size among them) runs — tests/test_attention_mechanisms.py gives them their own. Per-layer input embeddings of 4 dims (they feed the
    # residual stream, not attention; without them transformers' shared-KV forward fails on a None).
    return AutoConfig.for_model(
        model_type, vocab_size=vocab, vocab_size_per_layer_input=vocab, hidden_size=32, intermediate_size=64,
        num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=2, head_dim=8, global_head_dim=8,
        num_global_key_value_heads=1, attention_k_eq_v=True, num_kv_shared_layers=2, sliding_window=4,
        max_position_embeddings=128, hidden_size_per_layer_input=4,
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
                     "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5,
                                            "rope_theta": 100.0}})  # fast enough to tell turning pairs apart


FAMILY = Family(
    name="gemma4",
    model_types=("gemma4_text", "gemma3n_text"),
    kind="decoder",
    features=("shared-KV layers (num_kv_shared_layers): the producer layer's keys and values, from its input",
              "k = v on global layers (attention_k_eq_v)", "value RMS norm", "QK norm, scale 1",
              "global layers' own head size and KV heads", "sliding-window layers",
              f"rotary: {', '.join(ROPE_INV_FREQ)}, local/global bases", "grouped-query KV heads"),
    layer_spec=_spec,
    attention=lambda base, i: base.layers[i].self_attn,
    out_proj=lambda base, i: base.layers[i].self_attn.o_proj,
    refuses=(Refusal("bidirectional attention", _bidirectional), Refusal("rope type", _rope_per_layer_type)),
    tiny_config=_tiny_config,
    tokenizer="sentencepiece",
    auto_class="AutoModelForCausalLM",
)
