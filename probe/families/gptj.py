"""GPT-J: rotary on the first `rotary_dim` dims of each head, "rotate every two" (interleaved pairs),
base 10000; separate Q/K/V projections without bias."""

from __future__ import annotations

from ..rotary import default_inv_freq
from ..scratch import LayerSpec
from ..family import Family, Refusal, linear_weights

THETA = 10000.0  # GPT-J's rotary base is fixed, not in its config


def _rotary_dim(cfg) -> int:
    return cfg.rotary_dim or cfg.hidden_size  # no rotary_dim: transformers rotates hidden_size dims


def _spec(base, i: int, cfg) -> LayerSpec:
    attn = base.h[i].attn
    (wq, bq), (wk, bk) = linear_weights(attn.q_proj), linear_weights(attn.k_proj)
    (wv, bv), (wo, bo) = linear_weights(attn.v_proj), linear_weights(attn.out_proj)
    hs, d = attn.head_dim, _rotary_dim(cfg)
    return LayerSpec(wq, wk, wv, wo, bq, bk, bv, bo, n_heads=cfg.num_attention_heads,
                     n_kv_heads=cfg.num_attention_heads, head_dim=hs, scale=attn.scaling, causal=True,
                     inv_freq=default_inv_freq(THETA, d), rotary_dim=None if d == hs else d, rotary_interleaved=True)


def _rotary_wider_than_head(cfg) -> str | None:
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    if _rotary_dim(cfg) > head_dim:
        return (f"rotary_dim={cfg.rotary_dim} rotates {_rotary_dim(cfg)} dims, more than a head's {head_dim} "
                f"(transformers fails on it too)")
    return None


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    # rotary_dim 4 of a head of 8 dims: pairs (0, 1), (2, 3) turn, dims 4-7 do not.
    return AutoConfig.for_model(model_type, vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=128,
                                rotary_dim=4, bos_token_id=None, eos_token_id=None)


FAMILY = Family(
    name="gptj",
    model_types=("gptj",),
    kind="decoder",
    features=("interleaved rotary (rotate every two)", "partial rotary (rotary_dim)"),
    layer_spec=_spec,
    attention=lambda base, i: base.h[i].attn,
    out_proj=lambda base, i: base.h[i].attn.out_proj,
    refuses=(Refusal("rotary_dim", _rotary_wider_than_head),),
    tiny_config=_tiny_config,
    tokenizer="bytebpe",
    auto_class="AutoModelForCausalLM",
)
