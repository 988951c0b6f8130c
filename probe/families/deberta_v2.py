"""DeBERTa v2 and v3: disentangled attention, content and relative position scored separately.

On top of content→content q·k, each head adds content→position (c2p) and position→content (p2c)
scores against learned relative-position embeddings, all divided by √(d × scale_factor), where
scale_factor counts the terms (3 with both c2p and p2c):

    score(i, j) = [ q_i·k_j + q_i·pk_δ + k_j·pq_δ ] / √(d · scale_factor),  δ = bucket(i − j) + span

pk and pq are the relative embeddings (layer-normed where `norm_rel_ebd` says so) projected by the
layer's own key and query projections (`share_att_key`, DeBERTa v3) or by separate position
projections. Relative distances are exact up to half the buckets, logarithmic up to
`max_relative_positions` beyond (`position_buckets`), and clipped to the embedding table.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..scratch import LayerSpec
from ..family import Family, Refusal, linear_weights


def log_bucket(relative: torch.Tensor, n_buckets: int, max_position: int) -> torch.Tensor:
    """DeBERTa's bucket of each relative position `query − key`: itself within ±n_buckets/2, beyond that
    mid + ⌈log(|δ|/mid) / log((max_position − 1)/mid) · (mid − 1)⌉ with δ's sign (mid = n_buckets/2).

    >>> log_bucket(torch.tensor([-40, -5, -1, 0, 3, 4, 5, 40]), n_buckets=8, max_position=64)
    tensor([-7, -5, -1,  0,  3,  4,  5,  7])
    """
    mid = n_buckets // 2
    inside = (relative < mid) & (relative > -mid)
    distance = torch.where(inside, torch.tensor(mid - 1).type_as(relative), relative.abs())
    log_ratio = torch.log(distance / mid) / torch.log(torch.tensor((max_position - 1) / mid))
    log_pos = torch.ceil(log_ratio * (mid - 1)) + mid
    return torch.where(distance <= mid, relative.type_as(log_pos), log_pos * torch.sign(relative)).long()


def _relative_index(n_queries: int, n_keys: int, attn) -> torch.Tensor:
    """(T, S) row of the relative-embedding table that query i and key j use: bucket(i − j) + span, clipped."""
    relative = torch.arange(n_queries)[:, None] - torch.arange(n_keys)[None, :]
    if attn.position_buckets > 0 and attn.max_relative_positions > 0:
        relative = log_bucket(relative, attn.position_buckets, attn.max_relative_positions)
    span = attn.pos_ebd_size
    return (relative + span).clamp(0, 2 * span - 1)


def _project(linear, rel: torch.Tensor, n_heads: int) -> torch.Tensor:
    w, b = linear_weights(linear)
    out = rel @ w.T + (0 if b is None else b)  # (2·span, nh·hs)
    return out.view(out.shape[0], n_heads, -1).transpose(0, 1)  # (nh, 2·span, hs)


def _disentangled(attn, rel: torch.Tensor, scale: float) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    nh = attn.num_attention_heads
    rel = rel[: 2 * attn.pos_ebd_size]
    kinds, shared = attn.pos_att_type, attn.share_att_key
    pos_key = _project(attn.key_proj if shared else attn.pos_key_proj, rel, nh) if "c2p" in kinds else None
    pos_query = _project(attn.query_proj if shared else attn.pos_query_proj, rel, nh) if "p2c" in kinds else None

    def scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        B, _, T, _ = q.shape
        S = k.shape[2]
        idx = _relative_index(T, S, attn)  # (T, S)
        total = torch.zeros(B, nh, T, S, dtype=q.dtype)
        if pos_key is not None:  # c2p: query i against the embedding of its distance to key j
            c2p = q @ pos_key.transpose(-1, -2).to(q.dtype)  # (B, nh, T, 2·span)
            total = total + torch.gather(c2p, -1, idx.expand(B, nh, T, S)) * scale
        if pos_query is not None:  # p2c: key j against the embedding of the same distance
            p2c = k @ pos_query.transpose(-1, -2).to(k.dtype)  # (B, nh, S, 2·span)
            total = total + torch.gather(p2c, -1, idx.T.expand(B, nh, S, T)).transpose(-1, -2) * scale
        return total  # (B, nh, T, S)

    return scores


def _spec(base, i: int, cfg) -> LayerSpec:
    attn = base.encoder.layer[i].attention.self
    (wq, bq), (wk, bk), (wv, bv) = (linear_weights(attn.query_proj), linear_weights(attn.key_proj),
                                    linear_weights(attn.value_proj))
    wo, bo = linear_weights(base.encoder.layer[i].attention.output.dense)
    nh, hs = attn.num_attention_heads, attn.attention_head_size
    scale_factor = 1 + ("c2p" in attn.pos_att_type) + ("p2c" in attn.pos_att_type)
    scale = (hs * scale_factor) ** -0.5
    position_scores = None
    if attn.relative_attention:
        position_scores = _disentangled(attn, base.encoder.get_rel_embedding().detach(), scale)
    return LayerSpec(wq, wk, wv, wo, bq, bk, bv, bo, n_heads=nh, n_kv_heads=nh, head_dim=hs, scale=scale,
                     causal=False, position_scores=position_scores)


def _unknown_position_terms(cfg) -> str | None:
    unknown = [t for t in (cfg.pos_att_type or []) if t not in ("c2p", "p2c")]
    if getattr(cfg, "relative_attention", False) and unknown:
        return f"pos_att_type {unknown}: only the c2p and p2c terms are reproduced (DeBERTa v2 computes no other)"
    return None


def _tiny_config(vocab: int, model_type: str):
    from transformers import DebertaV2Config

    # DeBERTa v3's choices: shared key projections, layer-normed relative embeddings, no absolute positions
    # in the input; 8 buckets so that the sample texts reach the logarithmic ones.
    return DebertaV2Config(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=64, max_position_embeddings=128, relative_attention=True,
                           pos_att_type=["p2c", "c2p"], position_buckets=8, max_relative_positions=-1,
                           share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False)


FAMILY = Family(
    name="deberta_v2",
    model_types=("deberta-v2",),
    kind="encoder",
    features=("disentangled attention: content→position and position→content scores",
              "log-bucketed relative positions", "scale 1/√(d · scale_factor)", "bidirectional"),
    layer_spec=_spec,
    attention=lambda base, i: base.encoder.layer[i].attention.self,
    out_proj=lambda base, i: base.encoder.layer[i].attention.output.dense,
    refuses=(Refusal("position terms other than c2p and p2c", _unknown_position_terms),),
    tiny_config=_tiny_config,
    tokenizer="wordpiece",
    auto_class="AutoModel",
)
