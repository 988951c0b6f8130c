"""BERT and its descendants: RoBERTa, ELECTRA, XLM-R, CamemBERT, MiniLM (bidirectional encoders).

Positions are absolute embeddings, added before the first layer, so they are already in every
layer's input and the attention itself has nothing positional to reproduce.
"""

from __future__ import annotations

from ..scratch import LayerSpec
from ..family import Family, Refusal, linear_weights


def _spec(base, i: int, cfg) -> LayerSpec:
    sa = base.encoder.layer[i].attention.self
    (wq, bq), (wk, bk), (wv, bv) = linear_weights(sa.query), linear_weights(sa.key), linear_weights(sa.value)
    wo, bo = linear_weights(base.encoder.layer[i].attention.output.dense)
    hs = sa.attention_head_size
    return LayerSpec(wq, wk, wv, wo, bq, bk, bv, bo, n_heads=sa.num_attention_heads,
                     n_kv_heads=sa.num_attention_heads, head_dim=hs, scale=hs**-0.5, causal=False)


def _relative_positions(cfg) -> str | None:
    kind = getattr(cfg, "position_embedding_type", "absolute")
    if kind != "absolute":
        return f"position_embedding_type={kind!r}: relative position scores are not reproduced"
    return None


def _used_as_decoder(cfg) -> str | None:
    if getattr(cfg, "is_decoder", False):
        return "BERT used as a decoder (is_decoder=True) is not supported"
    return None


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, vocab_size=vocab, hidden_size=32, num_hidden_layers=2,
                                num_attention_heads=4, intermediate_size=64, max_position_embeddings=128)


FAMILY = Family(
    name="bert",
    model_types=("bert", "roberta", "electra", "xlm-roberta", "camembert"),
    kind="encoder",
    features=("absolute positions (already in the layer input)", "bidirectional"),
    layer_spec=_spec,
    attention=lambda base, i: base.encoder.layer[i].attention.self,
    out_proj=lambda base, i: base.encoder.layer[i].attention.output.dense,
    refuses=(Refusal("relative position scores", _relative_positions), Refusal("BERT as a decoder", _used_as_decoder)),
    tiny_config=_tiny_config,
    tokenizer="wordpiece",
    auto_class="AutoModel",
    position_embedding=lambda base: base.embeddings.position_embeddings,
)
