"""GPTBigCode (StarCoder, SantaCoder): GPT-2's layout with multi-query attention — one fused `c_attn`
projects all query heads, then a single key head and a single value head shared by every query head.

Without `multi_query` the fused rows are [q_h, k_h, v_h] per head, as in BLOOM. Positions are learned
absolute embeddings added before the first layer; `scale_attn_weights=False` drops the 1/√d.
"""

from __future__ import annotations

from ..scratch import LayerSpec
from ..family import Family, Refusal, linear_weights
from .bloom import split_per_head_qkv


def _spec(base, i: int, cfg) -> LayerSpec:
    attn = base.h[i].attn
    nh, hs, nkv = attn.num_heads, attn.head_dim, attn.kv_heads
    w, b = linear_weights(attn.c_attn)
    if attn.multi_query:  # rows: all query heads (nh·hs), then the one K (hs), then the one V (hs)
        (wq, wk, wv) = w.split([nh * hs, hs, hs])
        (bq, bk, bv) = b.split([nh * hs, hs, hs]) if b is not None else (None, None, None)
    else:
        (wq, wk, wv), (bq, bk, bv) = split_per_head_qkv(w, b, nh, hs)
    wo, bo = linear_weights(attn.c_proj)
    return LayerSpec(wq, wk, wv, wo, bq, bk, bv, bo, n_heads=nh, n_kv_heads=nkv, head_dim=hs, scale=attn.scaling,
                     causal=True)


def _cross_attention(cfg) -> str | None:
    if getattr(cfg, "add_cross_attention", False):
        return "GPTBigCode with cross-attention is not reproduced"
    return None


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=128,
                                n_inner=64, multi_query=True, bos_token_id=None, eos_token_id=None)


FAMILY = Family(
    name="gpt_bigcode",
    model_types=("gpt_bigcode",),
    kind="decoder",
    features=("multi-query attention (one fused c_attn, one K and V head for all)", "per-head fused QKV otherwise",
              "learned absolute positions (already in the layer input)"),
    layer_spec=_spec,
    attention=lambda base, i: base.h[i].attn,
    out_proj=lambda base, i: base.h[i].attn.c_proj,
    refuses=(Refusal("cross-attention", _cross_attention),),
    tiny_config=_tiny_config,
    tokenizer="bytebpe",
    auto_class="AutoModelForCausalLM",
    position_embedding=lambda base: base.wpe,
)
