"""GPT-2: one fused `c_attn` projection, Conv1D weights stored (in, out), absolute positions."""

from __future__ import annotations

from ..scratch import LayerSpec
from ..family import Family, Refusal


def _spec(base, i: int, cfg) -> LayerSpec:
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


def _cross_attention(cfg) -> str | None:
    if getattr(cfg, "add_cross_attention", False):
        return "GPT-2 with cross-attention is not supported"
    return None


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=128,
                                bos_token_id=0, eos_token_id=0)


FAMILY = Family(
    name="gpt2",
    model_types=("gpt2",),
    kind="decoder",
    features=("absolute positions (already in the layer input)", "fused c_attn Conv1D split into Q/K/V",
              "scale_attn_by_inverse_layer_idx"),
    layer_spec=_spec,
    attention=lambda base, i: base.h[i].attn,
    out_proj=lambda base, i: base.h[i].attn.c_proj,
    refuses=(Refusal("cross-attention", _cross_attention),),
    tiny_config=_tiny_config,
    tokenizer="bytebpe",
    auto_class="AutoModelForCausalLM",
    position_embedding=lambda base: base.wpe,
)
