"""ALBERT: BERT's attention, with one layer's weights shared by all layers (or by each of `num_hidden_groups`
groups of consecutive layers).

Every layer of a group runs the same module object, so a hook on that module fires once per layer:
`hooks.LayerModules` tells the calls apart by their order (the k-th call in a forward pass is the group's k-th
layer), and every layer is captured and verified on its own input. Positions are absolute embeddings, in the layer
input already; the embeddings (`embedding_size` wide) are mapped to the hidden size before the first layer.
"""

from __future__ import annotations

from ..scratch import LayerSpec
from ..family import Family, Refusal, linear_weights


def _attention(base, i: int):
    cfg = base.config
    group = int(i / (cfg.num_hidden_layers / cfg.num_hidden_groups))  # as AlbertTransformer picks it
    return base.encoder.albert_layer_groups[group].albert_layers[0].attention


def _spec(base, i: int, cfg) -> LayerSpec:
    attn = _attention(base, i)
    (wq, bq), (wk, bk), (wv, bv) = linear_weights(attn.query), linear_weights(attn.key), linear_weights(attn.value)
    wo, bo = linear_weights(attn.dense)
    hs = attn.attention_head_size
    return LayerSpec(wq, wk, wv, wo, bq, bk, bv, bo, n_heads=attn.num_attention_heads,
                     n_kv_heads=attn.num_attention_heads, head_dim=hs, scale=attn.scaling, causal=False)


def _inner_groups(cfg) -> str | None:
    if getattr(cfg, "inner_group_num", 1) != 1:
        return (f"inner_group_num={cfg.inner_group_num}: several layers inside one shared group are not "
                "reproduced (each model layer would run several attention blocks)")
    return None


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    # 3 layers that run one shared layer module: the repeats must be told apart
    return AutoConfig.for_model(model_type, vocab_size=vocab, embedding_size=16, hidden_size=32, num_hidden_layers=3,
                                num_hidden_groups=1, inner_group_num=1, num_attention_heads=4, intermediate_size=64,
                                max_position_embeddings=128)


FAMILY = Family(
    name="albert",
    model_types=("albert",),
    kind="encoder",
    features=("one layer module shared by all layers (or by groups of them): each layer captured by call order",
              "absolute positions (already in the layer input)", "bidirectional"),
    layer_spec=_spec,
    attention=_attention,
    out_proj=lambda base, i: _attention(base, i).dense,
    refuses=(Refusal("layers inside a shared group", _inner_groups),),
    tiny_config=_tiny_config,
    tokenizer="wordpiece",
    auto_class="AutoModel",
    position_embedding=lambda base: base.embeddings.position_embeddings,
)
