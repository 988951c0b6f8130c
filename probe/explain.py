"""How attention works, shown on a real model with the from-scratch attention: three experiments.

- `explain`: for one query token of one head, each key's raw score q·k, the scaled score, the
  softmax weight, and the head's output as the weighted sum of values.
- `scale_effect`: what dividing by √d does — each head's entropy and max weight with and without it.
- `permutation_check`: with position information removed, permuting the input permutes the attention.

All three start from the real layer input captured by `verify.capture`, so they show the model's
own numbers, not a re-implementation's guess.
"""

from __future__ import annotations

import dataclasses
import warnings

import pandas as pd
import torch

from .encoding import Encoded, encode, token_labels
from .families import Family, UnsupportedFeature, family_for
from .forward import base_model, no_attention_reason, refuse_cross_reader
from .hooks import replace
from .images import check_images, encode_images, for_input, require_modality
from .model import LoadedModel
from .scratch import attention_from_scratch, project_qk, sink_share
from .verify import capture, tolerances
from .names import DEFAULT_ATTENTION, Attention
from .recompute import layer_inputs
from .results import Explanation, PermutationCheck
from .sources import source_for
from .vision_language import DEFAULT_PROMPT, encode_with_images

__all__ = ["explain", "find_token", "scale_effect", "permutation_check"]


def _capture_one(lm: LoadedModel, text: str):
    family = family_for(lm.config)
    enc = encode(lm, text)
    return family, enc, capture(lm, [enc], family)


def _find_unit(labels: list[str], token: str | int) -> int:
    """An image's query unit: its label ("[CLS]", "[REG0]", "r1c2") or its index."""
    if isinstance(token, int) and not isinstance(token, bool):
        if not 0 <= token < len(labels):
            raise ValueError(f"unit {token} out of range: the image has units 0..{len(labels) - 1}")
        return token
    if token not in labels:
        raise ValueError(f"no unit {token!r} in the image; its units are {', '.join(labels[:6])}, … (patches r{{row}}c{{col}})")
    return labels.index(token)


def find_token(labels: list[str], enc: Encoded, token: str | int, occurrence: int) -> int:
    """The index of `token` in a text's units: an index as it is (checked), else the `occurrence`-th unit
    whose label is the word (or where a word split into pieces starts)."""
    if isinstance(token, int) and not isinstance(token, bool):
        if not 0 <= token < len(labels):
            raise ValueError(f"token index {token} out of range 0..{len(labels) - 1}")
        return token
    if not isinstance(token, str):  # True would be token 1, 1.0 an AttributeError
        raise TypeError(f"a token is a str of the text or its index (an int), got {token!r}")
    want = token.strip().lower()
    if not want:  # "" starts every piece: the first token was taken without a word
        raise ValueError(f"the token {token!r} is empty; give a token of the text, one of {labels}, or its index")
    hits = [i for i, lab in enumerate(labels) if lab.lower() == want]
    if not hits:  # a word split into pieces: take the piece where the word starts
        hits = [i for i, (a, _) in enumerate(enc.spans)
                if not enc.special[i] and enc.text[a:a + len(want)].lower() == want
                and (a == 0 or not enc.text[a - 1].isalnum())]
    if occurrence >= len(hits):
        raise ValueError(f"token {token!r} occurs {len(hits)} time(s) in {labels}; pick one of those tokens")
    return hits[occurrence]


def _images_argument(images: object, image: object) -> object:
    """`images=`, or the deprecated `image=` (with a DeprecationWarning); one error for both."""
    if image is None:
        return images
    if images is not None:
        raise TypeError("give images= only (image= is its deprecated old name)")
    warnings.warn("explain(image=...) is deprecated and goes in the next release; use images=...", DeprecationWarning,
                  stacklevel=3)
    return image


@torch.inference_mode()
def explain(lm: LoadedModel, text: str | None = None, *, token: str | int, layer: int, head: int, occurrence: int = 0,
            attention: Attention = DEFAULT_ATTENTION, budget: int | None = None, images: object = None,
            image: object = None) -> Explanation:
    """Walk through softmax(q·kᵀ/√d)·v for `token` as the query in head `layer`.`head`.

    Each key's score is taken apart into the terms the model adds: `raw_score` q·k (content only),
    `position_bias` where the model adds a bias per query-key distance (T5's relative buckets,
    ALiBi), `position_scores` where it scores content against relative positions (DeBERTa), so that
    `scaled_score` = raw_score × scale + position_bias + position_scores, the logit the softmax takes
    (Gemma 2 then caps it: c·tanh(logit / c)).

    `attention="recompute"` (or `"auto"` beyond `budget` bytes of eager weights; `probe.sources`) runs
    the model with fast attention and recomputes only this layer; the model's own weights of the layer
    are then compared on the text's prefix (`probe.recompute.check_prefix`), recorded in `check`.

    `images`: a vision transformer's one image (no text; `token` a unit such as "[CLS]" or "r1c2"), or a
    vision–language decoder's images for `text` (`probe.vision_language` places them; no text: the default
    prompt; `token` a word or an image token "img0:r1c2"); the decoder's layer is recomputed with the model's
    own mask, from its eager weights. `image=` is the old name of `images=` (deprecated; it goes in the next
    release).

    >>> from headscope.probe.tiny import tiny_model
    >>> e = explain(tiny_model("bert"), "The cat sat.", token="cat", layer=1, head=2)
    >>> e.query, round(float(e.table["weight"].sum()), 6)
    ('cat', 1.0)

    >>> from headscope.probe import load_model                                          # doctest: +SKIP
    >>> e = explain(load_model("minilm"), "The animal didn't cross the street because it was too tired.",
    ...             token="it", layer=2, head=3)                              # doctest: +SKIP
    >>> e.table.columns.tolist()                                              # doctest: +SKIP
    ['key', 'raw_score', 'scaled_score', 'weight', 'value_norm', 'contribution_norm']
    """
    if isinstance(occurrence, bool) or not isinstance(occurrence, int) or occurrence < 0:
        raise ValueError(f"occurrence must be 0 (the first), 1 (the second), ...; got {occurrence!r}")
    image = _images_argument(images, image)
    if image is None:
        refuse_cross_reader(lm)  # Mllama's layers are not one map over the text each: its images say which is which
    if image is not None:
        image = check_images(image)  # once: an iterator is read here, not emptied by a second look
        require_modality(lm, images=True)  # an image on a text model: that, not "give exactly one of them"
    reads = getattr(lm, "reads_images", False) and image is not None  # a text with its images (LLaVA, Gemma 3)
    if (text is None) == (image is None) and not reads:
        raise ValueError("explain one text or one image (images=...): give exactly one of them")
    lm = for_input(lm, images=image is not None)  # a two-tower model: the tower that reads this input
    source = source_for(lm, attention, budget=budget)
    if reads:  # the decoder's head over the text and its image tokens: the query a word or an image token "img0:r1c2"
        enc = encode_with_images(lm, [DEFAULT_PROMPT if text is None else text], check_images(image))[0]
        text, source = enc.text, source_for(lm, "eager")  # a text with images runs with the model's own weights
    elif image is not None:  # a vision transformer: the query is a unit label, "[CLS]" or a patch "r1c2"
        images = check_images(image)
        if len(images) != 1:
            raise ValueError(f"explain takes one image, got {len(images)}")
        enc = encode_images(lm, images)[0]
        text = enc.text
        source = source_for(lm, "eager")  # images are short: their eager weights are always kept
    family, enc = family_for(lm.config), enc if image is not None else encode(lm, text)
    image = None if reads else image  # from here on, `image` means a vision transformer's one image
    n_layers, n_heads = family.n_layers(lm.config), lm.config.num_attention_heads
    if not (0 <= layer < n_layers and 0 <= head < n_heads):
        raise ValueError(f"layer {layer}, head {head} out of range: {lm.name} has {n_layers} layers x {n_heads} heads")
    if reads and layer in _cross_layers(family, lm.config):
        raise ValueError(_cross_reason(lm, family, enc, layer))
    if layer not in family.attention_layers(lm.config):
        raise ValueError(no_attention_reason(lm, layer))
    labels = list(enc.labels) if image is not None else list(token_labels(lm, enc))
    q_idx = _find_unit(labels, token) if image is not None else find_token(labels, enc, token, occurrence)
    spec = family.layer_spec(base_model(lm), layer, lm.config)
    if reads:  # the model's own mask: Gemma 3's images and PaliGemma's prefix see each other both ways
        types = enc.inputs.get("token_type_ids") if enc.inputs else None
        reading, ids = family.vision_language, torch.tensor([enc.ids])
        spec = reading.decoder_mask(spec, lm.config, types, ids, layer)
        spec = reading.at_input(base_model(lm), lm.config, ids, enc.inputs)(spec)  # Qwen-VL: its own 3-D positions
    if source.mode(len(enc.ids)) == "recompute":
        # only this layer's input, caught under fast attention: no layer's T × T weights are kept by the model
        inputs = layer_inputs(lm, family, [enc], sorted({layer, spec.kv_layer} - {None}))  # shared KV: the producer's
        x, kv = inputs[layer], spec.kv_input(inputs)
        cap, valid = None, torch.ones(1, len(enc.ids), dtype=torch.long, device=x.device)
    else:
        cap = capture(lm, [enc], family)
        x, kv, valid = cap.inputs[layer], spec.kv_input(cap.inputs), cap.key_valid
    res = attention_from_scratch(x, spec, valid, kv=kv)
    scaled = res.scores[0, head, q_idx]  # (T,) the logits: scores after × scale and every position term
    terms = _score_terms(x, spec, head, q_idx, kv=kv)
    weights = res.probs[0, head, q_idx]  # (T,)
    values = res.values[0, head]  # (T, hs)
    contrib = weights[:, None] * values  # (T, hs): each key's share of the output
    if res.gate is not None:  # gated attention: the query's gate scales every key's share, dim by dim
        contrib = contrib * res.gate[0, head, q_idx]
    table = pd.DataFrame({
        "key": labels,
        **{name: t.tolist() for name, t in terms.items()},
        "scaled_score": scaled.tolist(),
        "weight": weights.tolist(),
        "value_norm": values.norm(dim=-1).tolist(),
        "contribution_norm": contrib.norm(dim=-1).tolist(),
    })
    if spec.causal:  # keys after the query are masked: their scores never enter the softmax
        table.loc[q_idx + 1:, [*terms, "scaled_score"]] = float("nan")
    if cap is not None:
        check, err = None, float((cap.probs[layer][0, head, q_idx] - weights).abs().max())
    else:  # the model's own weights of this layer on the text's prefix: eager weights of the whole text are what is avoided
        found = source.checked(enc, layers=[layer])  # every head of the layer (DeBERTa recomputes no fewer)
        check, err = found.to_dict(), found.max_abs_err
    return Explanation(
        text=text, query=labels[q_idx], query_index=q_idx, layer=layer, head=head, scale=spec.scale, table=table,
        output_norm=float(contrib.sum(0).norm()), model_weight_max_abs_err=err, check=check,
        sink_share=0.0 if spec.sinks is None else float(sink_share(weights)),
    )


def _score_terms(x: torch.Tensor, spec, head: int, q_idx: int, kv: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The parts of one query row's logits, each (T,): q·k, and the position terms this model adds.

    Computed from the projected queries and keys, apart from the logits `attention_from_scratch`
    gives, so that their sum checks the logits instead of restating them.
    """
    q, k = project_qk(x, spec, kv=kv)  # (1, nh, T, hs), (1, nkv, T, hs)
    k = k.repeat_interleave(spec.n_heads // spec.n_kv_heads, dim=1)  # (1, nh, T, hs): grouped-query heads
    terms = {"raw_score": k[0, head] @ q[0, head, q_idx]}  # (T,)
    n = x.shape[1]
    if spec.score_bias is not None:
        # the query's own row of the bias only (nh, 1, T), not the whole T × T
        terms["position_bias"] = spec.score_bias(q_idx + 1, n, query_start=q_idx, key_start=0)[head, 0].to(q)
    if spec.position_scores is not None:
        terms["position_scores"] = spec.position_scores(q, k)[0, head, q_idx]
    return terms


def _row_stats(probs: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean entropy (nats) and mean max weight per head over the real query rows: each (nh,)."""
    p = probs[0, :, :n, :n]  # [head, query, key]
    ent = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)
    return ent.mean(-1), p.amax(-1).mean(-1)


@torch.inference_mode()
def scale_effect(lm: LoadedModel, text: str, *, layers: list[int] | None = None) -> pd.DataFrame:
    """Per (layer, head): entropy and max weight with the 1/√d scale and without it.

    Without the scale the scores grow with √d and the softmax saturates: entropy falls, the max
    weight rises toward 1 — the reason attention divides by √d.
    """
    family, enc, cap = _capture_one(lm, text)
    n = len(enc.ids)
    rows = []
    for layer in layers if layers is not None else family.attention_layers(lm.config):
        spec = family.layer_spec(base_model(lm), layer, lm.config)
        x, kv = cap.inputs[layer], spec.kv_input(cap.inputs)
        with_scale = _row_stats(attention_from_scratch(x, spec, cap.key_valid, kv=kv).probs, n)
        without = _row_stats(attention_from_scratch(x, spec, cap.key_valid, use_scale=False, kv=kv).probs, n)
        for h in range(spec.n_heads):
            rows.append({
                "layer": layer, "head": h, "scale": spec.scale,
                "entropy_scaled": float(with_scale[0][h]), "entropy_unscaled": float(without[0][h]),
                "max_weight_scaled": float(with_scale[1][h]), "max_weight_unscaled": float(without[1][h]),
            })
    return pd.DataFrame(rows)


@torch.inference_mode()
def permutation_check(lm: LoadedModel, text: str, *, layer: int | None = None, seed: int = 0) -> PermutationCheck:
    """Shuffle the tokens of `text` and compare layer `layer`'s attention with the shuffled original.

    "Without positions" removes every source of order: absolute position embeddings (the family's
    `position_embedding`; an encoder–decoder's is its encoder's) are zeroed
    for the forward pass (a hook on the embedding's output, the weights untouched), rotary is
    skipped, and the causal, sliding and local-band masks are dropped (a mask encodes order too). Layer 0 is the
    default because for a decoder the real forward pass still applies its causal mask before
    deeper layers. The default is the first layer with softmax attention; in a hybrid stack whose layers before it
    have none (a recurrent or convolution layer carries the order into its input) the check is refused.
    """
    family = family_for(lm.config)
    have = family.attention_layers(lm.config)
    layer = have[0] if layer is None else layer
    if layer not in have:
        raise ValueError(no_attention_reason(lm, layer))
    if have[:layer + 1] != tuple(range(layer + 1)):
        raise UnsupportedFeature(f"layer {layer} of {lm.name} reads the output of layers without softmax attention "
                                 f"({', '.join(str(i) for i in range(layer) if i not in have)}), which carry the "
                                 "tokens' order: no permutation of its input is free of positions")
    enc = encode(lm, text)
    n = len(enc.ids)
    if n < 3:
        raise ValueError("permutation_check needs a text of at least 3 tokens")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    shuffled = Encoded(text=enc.text, ids=tuple(enc.ids[i] for i in perm), spans=tuple(enc.spans[i] for i in perm),
                       special=tuple(enc.special[i] for i in perm))
    spec = family.layer_spec(base_model(lm), layer, lm.config)
    no_order = dataclasses.replace(spec, causal=False, sliding_window=None, local_window=None, chunk_size=None)

    def probs(e: Encoded, positions: bool) -> torch.Tensor:
        cap = _capture_without_positions(lm, family, e) if not positions else capture(lm, [e], family)
        s = spec if positions else no_order
        return attention_from_scratch(cap.inputs[layer], s, cap.key_valid, use_positions=positions,
                                      kv=spec.kv_input(cap.inputs)).probs[0]

    def deviation(positions: bool) -> float:
        p, p_shuffled = probs(enc, positions), probs(shuffled, positions)  # [head, query, key]
        return float((p_shuffled - p[:, perm][:, :, perm]).abs().max())

    return PermutationCheck(layer=layer, n_tokens=n, permutation=tuple(perm.tolist()),
                            max_dev_without_positions=deviation(False), max_dev_with_positions=deviation(True),
                            tolerance=tolerances(lm.dtype)[0])


def _capture_without_positions(lm: LoadedModel, family: Family, enc: Encoded):
    if family.position_embedding is None:  # rotary: no position enters the layer input
        return capture(lm, [enc], family)
    with replace({"positions": family.position_embedding(base_model(lm))}, lambda key, out: torch.zeros_like(out)):
        return capture(lm, [enc], family)


def _cross_layers(family: Family, config) -> tuple[int, ...]:
    """The cross-attention layers of a decoder that reads its images through them (Mllama); () for any other."""
    cross = family.vision_language.cross if family.vision_language is not None else None
    return tuple(cross.layer_numbers(config)) if cross is not None else ()


def _cross_reason(lm: LoadedModel, family: Family, enc: Encoded, layer: int) -> str:
    """One line: what a cross-attention layer reads, and where its heads' rows are."""
    keys = family.vision_language.key_patches(lm.config, enc.inputs)
    cells = sum(p is not None for p in keys)
    self_layers = ", ".join(map(str, family.attention_layers(lm.config)))
    return (f"layer {layer} of {lm.name} is a cross-attention layer: its text queries read the image's {len(keys)} "
            f"tile tokens ({cells} picture cells on their image, tile, row and column; the rest the tiles' CLS and "
            f"padding), not the text; explain covers its self-attention layers ({self_layers}), and a cross head's "
            f"rows over the image are in hs.extract(lm, text, images=[...])[0].cross")
