"""Run the model, get its attention: one forward pass of the model's base over one padded batch.

The base model runs without its task head (no LM head: the logits over a 262k vocabulary would cost
more than the attention) and with eager attention. Hooks on the wanted layers' attention modules catch
their weights and the pass stops once the last of them is caught; when only some layers are wanted (or
the layers are handed over one at a time, `forward_each_layer`) the model is asked for none, so the other
layers' O(T²) tensors are never kept. An encoder–decoder runs its encoder alone over single texts, or the
whole model over (source, target) pairs, giving encoder self, decoder self and cross attention.
"""

from __future__ import annotations

import inspect
import threading
from typing import Callable, Sequence

import torch

from .encoding import Encoded, ModelBatch, model_batch, pad_batch
from .images import patchify
from .families import (NO_SOFTMAX_LAYER_TYPES, SUPPORTED_TYPES, UnsupportedArchitecture, UnsupportedFeature,
                       family_for, softmax_layers)
from .hooks import LayerModules, watch
from .model import LoadedModel

__all__ = ["refuse_cross_reader", "is_cross_reader", "base_model", "is_seq2seq", "learned_sinks", "attention_layers", "hybrid_note", "no_attention_layers",
           "no_attention_reason",
           "NO_SOFTMAX_LAYER_TYPES", "forward_one_stream", "extra_inputs", "pixel_inputs", "forward_batch", "forward_each_layer", "forward_seq2seq", "seq2seq_inputs"]


def is_seq2seq(lm: LoadedModel) -> bool:
    """True for a model of an encoder–decoder family (extract takes a target text)."""
    family = SUPPORTED_TYPES.get(lm.model_type)
    return family is not None and family.kind == "encoder-decoder"


def attention_layers(lm: LoadedModel) -> tuple[int, ...]:
    """The model's own numbers of its layers with softmax attention: all of them, but in a hybrid stack only
    those whose `layer_types` entry is not one of `NO_SOFTMAX_LAYER_TYPES` (L3 stays L3, never renumbered), and
    in a decoder with cross-attention layers (Mllama) its self-attention layers (`Family.attention_layers`)."""
    family = SUPPORTED_TYPES.get(lm.model_type)
    return family.attention_layers(lm.config) if family is not None else softmax_layers(lm.config)


def _layer_kind(lm: LoadedModel, layer: int) -> str:
    """What a layer without self-attention heads is: its `layer_types` entry in a hybrid stack, else a
    cross-attention layer (Mllama's, whose queries read the image, not the text)."""
    kinds = getattr(lm.config, "layer_types", None)
    return f"a {kinds[layer]!r} layer of a hybrid stack" if kinds and len(kinds) > layer else "a cross-attention layer"


def no_attention_layers(lm: LoadedModel) -> tuple[int, ...]:
    """The model's own numbers of its layers without softmax attention (a hybrid stack's Mamba, recurrent or
    convolution layers); empty when every layer has attention."""
    have = attention_layers(lm)
    return tuple(i for i in range(lm.config.num_hidden_layers) if i not in have)


def no_attention_reason(lm: LoadedModel, layer: int) -> str:
    """One line: why layer `layer` of a hybrid model (or one with cross-attention layers) has no self-attention
    map, and which layers have one."""
    found = ", ".join(map(str, attention_layers(lm))) or "none"
    return (f"layer {layer} of {lm.name} has no softmax self-attention ({_layer_kind(lm, layer)}); "
            f"its attention layers are {found}")


def hybrid_note(lm: LoadedModel) -> str | None:
    """One line for results and reports of a hybrid stack: which layers have softmax attention and which have
    none (with their kinds); None when every layer has attention."""
    have = attention_layers(lm)
    n = lm.config.num_hidden_layers
    if len(have) == n:
        return None
    kinds: dict[str, list[int]] = {}
    names = getattr(lm.config, "layer_types", None)
    for i in range(n):
        if i not in have:
            kinds.setdefault(names[i] if names and len(names) > i else "cross-attention", []).append(i)
    without = "; ".join(f"{', '.join(map(str, layers))} ({kind})" for kind, layers in kinds.items())
    return (f"hybrid stack: layers {', '.join(map(str, have)) or 'none'} of {n} have softmax attention; layers "
            f"{without} have none: no rows in maps or tables, a labelled 'no softmax attention' row in figures "
            f"(layer numbers are the model's own)")


def learned_sinks(lm: LoadedModel) -> bool:
    """True when the model's attention has learned sinks (gpt-oss: a `sinks` logit per head), so that its
    attention rows sum to less than 1. Read off the parameters, so it holds for unverified models too."""
    return any(name.rsplit(".", 1)[-1] == "sinks" for name, _ in lm.model.named_parameters())


def base_model(lm: LoadedModel) -> torch.nn.Module:
    """The transformer without its task head (LlamaForCausalLM -> LlamaModel)."""
    m = lm.model
    if isinstance(getattr(m, "embeddings", None), torch.nn.Module):
        return m  # already the base (DINOv3ViTModel: its prefix "model" names its encoder, not a base inside)
    base = getattr(m, getattr(m, "base_model_prefix", ""), None)
    if base is None and isinstance(getattr(m, "model", None), torch.nn.Module):
        return m.model  # Llama 4's text model: its prefix names the multimodal model's part, its base is `.model`
    return m if base is None else base


def extra_inputs(lm: LoadedModel, items: Sequence[Encoded]) -> dict:
    """A vision–language text's other inputs (pixel values, token type ids, ...) on the model's device, pixels in
    its dtype; {} for plain texts. A text with images runs in a batch of its own (its image tokens, grids and
    masks are its own)."""
    if not items or items[0].inputs is None:
        return {}
    if len(items) > 1:
        raise ValueError("a text with images runs in a batch of its own; give batches of one")
    return {k: v.to(lm.device, lm.dtype) if v.is_floating_point() else v.to(lm.device)
            for k, v in items[0].inputs.items()}


def forward_one_stream(lm: LoadedModel, batch: ModelBatch, *, output_attentions: bool, extra: dict | None = None):
    """One forward pass over a batch of single texts (`encoding.model_batch`): the base model, or an
    encoder–decoder's encoder alone (its self-attention over the text is the model's one-text view: extract
    without a target). An image model takes the batch's pixel values (B, 3, H, W) and no mask (every patch is
    real). A vision–language decoder takes its images' inputs in `extra` (`extra_inputs`)."""
    base = base_model(lm)
    if batch.pixels is not None:
        return base(**pixel_inputs(base, lm, batch.pixels.to(lm.dtype)), output_attentions=output_attentions)
    ids, mask = batch.ids, batch.mask
    if is_seq2seq(lm):  # the encoder stack takes no use_cache (T5's refuses it)
        return base.get_encoder()(input_ids=ids, attention_mask=mask, output_attentions=output_attentions)
    return base(input_ids=ids, attention_mask=mask, output_attentions=output_attentions, use_cache=False,
                **(extra or {}))


def pixel_inputs(base: torch.nn.Module, lm: LoadedModel, pixels: torch.Tensor) -> dict:
    """The image model's inputs for images (B, 3, H, W): the pixels, or for SigLIP 2 (naflex) their patch rows
    (B, rows·cols, p·p·3) with each image's grid in `spatial_shapes` and every patch real (no padding)."""
    if "spatial_shapes" not in inspect.signature(base.forward).parameters:
        return {"pixel_values": pixels}
    B, _, H, W = pixels.shape
    p = lm.config.patch_size
    shapes = torch.tensor([[H // p, W // p]] * B, device=pixels.device)  # (B, 2) rows, columns
    mask = torch.ones(B, (H // p) * (W // p), dtype=torch.long, device=pixels.device)
    return {"pixel_values": patchify(pixels, p), "pixel_attention_mask": mask, "spatial_shapes": shapes}


@torch.inference_mode()
def forward_batch(lm: LoadedModel, items: Sequence[Encoded], layers: Sequence[int] | None = None) -> list[torch.Tensor]:
    """Attention of the chosen layers (all by default) for one batch: a list of (B, nh, T, T).

    Hooks on the wanted layers' attention modules catch their weights and the pass stops after the last of
    them (`_catch`): the last layer's output projection and feed-forward, and a pooler, feed no attention
    weight. When only some layers are wanted the model is asked for none, so the other layers' O(T²)
    tensors are never kept alive.
    """
    wanted, batch, extra = _inputs(lm, items, layers)
    caught: dict[int, torch.Tensor] = {}
    subset = len(wanted) < lm.config.num_hidden_layers
    _weights(lm, batch, wanted, extra, caught.__setitem__, asks=(False, True) if subset else (True,))
    return [caught[layer] for layer in wanted]


@torch.inference_mode()
def forward_each_layer(lm: LoadedModel, items: Sequence[Encoded], each: Callable[[int, torch.Tensor], None],
                       layers: Sequence[int] | None = None) -> None:
    """`forward_batch`'s weights handed over one layer at a time, as the pass gives them: `each(layer,
    weights)` with the model's own layer number and the layer's (B, nh, T, T), in layer order, called from
    the hook on that layer's attention module. The model is asked for no attention, so once `each` returns,
    nothing holds the layer's weights but `each` itself: a consumer that scores them as they come keeps one
    layer alive, never the batch's every layer. Where the attention modules give their weights only when
    asked (DeBERTa v2, MPNet) the pass asks for them (the model then keeps them until it returns); a family
    without hooks gives the model's whole output, handed over layer by layer."""
    wanted, batch, extra = _inputs(lm, items, layers)
    _weights(lm, batch, wanted, extra, each, asks=(False, True))


def is_cross_reader(lm: LoadedModel) -> bool:
    """Whether `lm` reads its images through cross-attention layers (Mllama), not through image tokens in its text."""
    family = SUPPORTED_TYPES.get(getattr(lm.config, "model_type", None))
    return family is not None and family.vision_language is not None and family.vision_language.cross is not None


def refuse_cross_reader(lm: LoadedModel) -> None:
    """A clear error for a decoder that reads its images through cross-attention layers (Mllama) asked for one
    map per layer: its layers are not one map over the text each, so the per-layer maps of `forward_batch` would
    mix them."""
    if is_cross_reader(lm):
        raise ValueError(f"{lm.name} reads its images through cross-attention layers; give it its images "
                         "(hs.extract(lm, texts, images=[...]); CLI: --image FILE), which read its self-attention "
                         "and cross-attention layers apart")


def _inputs(lm: LoadedModel, items: Sequence[Encoded], layers: Sequence[int] | None) -> tuple:
    """(wanted layers, the `ModelBatch`, extra inputs) of one batch, the layers checked."""
    refuse_cross_reader(lm)
    have = attention_layers(lm)
    wanted = list(have) if layers is None else list(layers)
    for layer in wanted:
        if layer not in have:
            raise ValueError(no_attention_reason(lm, layer))
    return wanted, model_batch(items, lm.device), extra_inputs(lm, items)


def _weights(lm: LoadedModel, batch: ModelBatch, wanted: list[int], extra: dict, keep: Callable[[int, torch.Tensor], None], *,
             asks: tuple[bool, ...]) -> None:
    """Every wanted layer's weights to `keep(layer, weights)`, in layer order: caught by hooks (`_catch`),
    asking the model for its attention as each of `asks` says in turn, else from its whole output."""
    for ask in asks:
        handed = _catch(lm, batch, wanted, extra, keep, output_attentions=ask)
        if len(handed) == len(wanted):
            return
        if handed:  # `keep` has seen some layers: handing them again would count them twice
            raise RuntimeError(f"{lm.name}'s attention modules gave the weights of layers {handed} but not of "
                               f"layers {[layer for layer in wanted if layer not in handed]}; headscope cannot "
                               "tell which map is which layer's")
    for layer, weights in zip(wanted, _whole(lm, batch, wanted, extra)):
        keep(layer, weights)


class _AllCaught(Exception):
    """Raised by `_catch`'s hook once the last wanted layer's weights are handed over (or once a layer gives
    none): the rest of the forward pass (that layer's output projection and feed-forward, the layers after it,
    a pooler) is not run."""


def _catch(lm: LoadedModel, batch: ModelBatch, wanted: list[int], extra: dict, keep: Callable[[int, torch.Tensor], None], *,
           output_attentions: bool) -> list[int]:
    """One forward pass with hooks on the wanted layers' attention modules: each layer's weights to
    `keep(layer, weights)` as the module returns them; the layers handed over, in order (all of `wanted`,
    or fewer where that cannot work: a family without hooks, hands none; a module that returns no weights,
    DeBERTa v2's and MPNet's unless asked, stops the hand-over there). The pass stops after the last wanted
    layer, or at the first layer without weights, except in a model that accelerate places or offloads
    (`hf_device_map`): its own hooks must run to their end. `output_attentions`: whether the model is asked
    for its attention (a subset of the layers asks for none, so the other layers' T² tensors are never
    kept). Another thread's pass through the same model (a server's) is neither caught nor stopped."""
    try:
        family = family_for(lm.config)
    except (UnsupportedArchitecture, UnsupportedFeature):
        return []
    placed = bool(getattr(lm.model, "hf_device_map", None))
    handed: list[int] = []
    missing: list[int] = []

    def hand(layer, out):
        if missing:
            return
        # the weights come last: (output, weights), or (output, position_bias, weights) in T5
        weights = out[-1] if isinstance(out, tuple) and len(out) > 1 else None
        if isinstance(weights, torch.Tensor):
            keep(layer, weights)
            handed.append(layer)
        else:
            missing.append(layer)
        if not placed and (missing or len(handed) == len(wanted)):
            raise _AllCaught

    attention = LayerModules(family, base_model(lm), lm.config, wanted, "attention")
    with watch(attention, hand, thread=threading.current_thread()):
        try:
            forward_one_stream(lm, batch, output_attentions=output_attentions, extra=extra)
        except _AllCaught:
            pass
    return handed


def _whole(lm: LoadedModel, batch: ModelBatch, wanted: list[int], extra: dict) -> list[torch.Tensor]:
    """The wanted layers' weights from the model's whole output, asked for its attention."""
    out = forward_one_stream(lm, batch, output_attentions=True, extra=extra)
    att = getattr(out, "attentions", None)
    if not att or any(a is None for a in att):
        raise RuntimeError(
            f"{lm.name} returned no attention weights although it runs eager attention "
            f"(implementation {lm.config._attn_implementation!r}); this model class does not expose them."
        )
    have = attention_layers(lm)
    if len(att) != len(have):
        raise RuntimeError(f"{lm.name} returned attention for {len(att)} layers, but its config names {len(have)} "
                           f"layers with softmax attention ({', '.join(map(str, have))}); headscope cannot tell which "
                           f"map is which layer's")
    row = {layer: k for k, layer in enumerate(have)}  # the model returns attention layers only, in order
    return [att[row[layer]] for layer in wanted]


def seq2seq_inputs(sources: Sequence[Encoded], targets: Sequence[Encoded], device: torch.device) -> dict:
    """Keyword arguments of one encoder–decoder forward pass: both sides right-padded, attention asked for."""
    ids, mask = pad_batch(sources, device)
    decoder_ids, decoder_mask = pad_batch(targets, device)
    return dict(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids, decoder_attention_mask=decoder_mask,
                output_attentions=True, use_cache=False)


_SEQ2SEQ_ATTENTIONS = {"encoder": "encoder_attentions", "decoder": "decoder_attentions", "cross": "cross_attentions"}


@torch.inference_mode()
def forward_seq2seq(lm: LoadedModel, sources: Sequence[Encoded], targets: Sequence[Encoded]) -> dict[str, torch.Tensor]:
    """Encoder self, decoder self and cross attention of one batch: "encoder" (B, L, nh, S, S),
    "decoder" (B, L, nh, T, T), "cross" (B, L, nh, T, S)."""
    out = base_model(lm)(**seq2seq_inputs(sources, targets, lm.device))
    found = {}
    for kind, name in _SEQ2SEQ_ATTENTIONS.items():
        att = getattr(out, name, None)
        if not att or any(a is None for a in att):
            raise RuntimeError(f"{lm.name} returned no {kind} attention weights although it runs eager attention")
        found[kind] = torch.stack(att, dim=1)
    return found
