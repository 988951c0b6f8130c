"""Check that the attention we show is the model's: recompute every layer from scratch and compare.

One real forward pass captures, per layer, the attention block's input `x` (a forward pre-hook on
the attention module), its output after W_O (a hook on the output projection) and the attention
probabilities. Each layer is then recomputed from its own captured input, so an error stays in its
layer and cannot compound. Only real positions are compared: padded queries and keys are dropped.

Errors reported per layer: max |Δ| of the probabilities, and of the block output after W_O;
relative errors are normwise (max |Δ| / max |reference|).

An encoder–decoder model is run on (source, target) pairs and each of its three kinds of attention
is checked layer by layer: the encoder's self-attention on the source, the decoder's causal
self-attention on the target, and the cross-attention, recomputed with the encoder's final output
as keys and values. Each row of the table names its kind.
"""

from __future__ import annotations

import math
import time
from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import Sequence

import torch

from .encoding import Encoded, check_count, check_texts, encode_many, encode_targets, model_batch
from .families import Family, Stack, family_for
from .forward import base_model, extra_inputs, forward_one_stream, seq2seq_inputs
from .hooks import catch, catch_layers
from .images import TOWER_NAMES, check_images, encode_images, is_two_tower, require_modality, tower
from .model import LoadedModel
from .results import LayerCheck, Verification
from .progress import progress as progress_bar
from .scratch import LayerSpec, attention_from_scratch

__all__ = ["Captured", "capture", "verify", "DEFAULT_TEXTS", "tolerances", "default_images"]

DEFAULT_TEXTS = (
    "The animal didn't cross the street because it was too tired.",
    "The animal didn't cross the street because it was too wide.",
    "我爱北京天安门",
    "Mary told John that she would call him tomorrow, and he said: \"Fine!\"",
)

# Probability tolerance (absolute) and output tolerance (normwise relative), by the model's dtype. A half
# precision model is checked against a float32 recomputation of the same layer inputs, so what is left is the
# model's own rounding: HALF_ROUNDOFFS unit roundoffs u = eps / 2 (bfloat16 2^-8, float16 2^-11; measured
# up to 5 u on the probabilities and 7 u on the outputs of smollm2 and minilm). float32 keeps its fixed bound.
HALF_ROUNDOFFS = 10
_TOL = {torch.float32: (1e-5, 1e-5), torch.float64: (1e-10, 1e-10),
        **{dt: (HALF_ROUNDOFFS * torch.finfo(dt).eps / 2,) * 2 for dt in (torch.float16, torch.bfloat16)}}


def tolerances(dtype: torch.dtype) -> tuple[float, float]:
    """(probability atol, output rtol) that fit a model running in `dtype`."""
    return _TOL[dtype]


@dataclass(frozen=True, eq=False)
class Captured:
    """What one forward pass showed of every layer: inputs, probabilities, outputs after W_O.

    Indexed by the model's own layer numbers; in a hybrid stack the layers without softmax attention hold None."""

    inputs: tuple[torch.Tensor | None, ...]  # per layer (B, T, D)
    probs: tuple[torch.Tensor | None, ...]  # per layer (B, nh, T, T)
    outputs: tuple[torch.Tensor | None, ...]  # per layer (B, T, D)
    key_valid: torch.Tensor  # (B, T), or (B, S) for cross-attention
    seconds: float
    memory: torch.Tensor | None = None  # cross-attention: the encoder's output (B, S, D), the keys' and values' source


@torch.inference_mode()
def capture(lm: LoadedModel, items: Sequence[Encoded], family: Family) -> Captured:
    """Run the real model once with hooks on every attention block."""
    base = base_model(lm)
    n = family.n_layers(lm.config)
    have = family.attention_layers(lm.config)
    batch = model_batch(items, lm.device)
    mask = batch.mask
    # layers that share one module (ALBERT) are told apart by call order
    with catch_layers(family, base, lm.config, have, where="attention", what="input") as ins, \
            catch_layers(family, base, lm.config, have, where="out_proj") as outs:
        t0 = time.perf_counter()
        out = forward_one_stream(lm, batch, output_attentions=True, extra=extra_inputs(lm, items))  # images' pixels
        seconds = time.perf_counter() - t0
    inputs, outputs = ([got.get(i) for i in range(n)] for got in (ins, outs))
    att = out.attentions or ()
    if len(att) == n > len(have):  # every layer's weights (Mllama's cross-attention layers among them): its own only
        att = tuple(att[i] for i in have)
    if (len(att) != len(have) or any(a is None for a in att)
            or any(inputs[i] is None or outputs[i] is None for i in have)):
        raise RuntimeError(f"{lm.name}: the forward pass did not expose every layer's attention to the hooks")
    probs: list = [None] * n
    for k, i in enumerate(have):  # the model returns its attention layers' weights only, in order
        probs[i] = att[k]
    return Captured(tuple(inputs), tuple(probs), tuple(outputs), mask.cpu(), seconds)


def default_images() -> list:
    """Two 48 × 48 images to verify an image model on when none is given: a colour ramp and a checkerboard."""
    import numpy as np

    y, x = np.mgrid[0:48, 0:48] / 47.0
    ramp = np.stack([x, y, 1.0 - x * y], axis=-1)
    board = np.repeat(((np.add.outer(np.arange(48) // 6, np.arange(48) // 6)) % 2)[..., None], 3, axis=-1) * 1.0
    return [ramp, board]


def verify(
    lm: LoadedModel,
    texts: str | Sequence[str] | None = None,
    *,
    images: object = None,
    batch_size: int = 8,
    truncate: bool = False,
    family: Family | None = None,
    target: str | Sequence[str] | None = None,
    progress: bool = False,
) -> Verification:
    """Recompute every layer of `lm` from scratch on `texts` and compare with the model; `progress`: a bar on
    stderr, one step per layer recomputed on a batch.

    An encoder–decoder model reads `texts` as sources and `target` as the decoder's texts (by
    default the sources shifted by one, so the two sides pad differently).

    >>> from headscope.probe import load_model                                   # doctest: +SKIP
    >>> verify(load_model("minilm")).summary()                         # doctest: +SKIP
    'attention verified: max |Δ| = 2.4e-07 over 6 layers × 12 heads (tolerance 1e-05, float32)'

    A two-tower model (CLIP, SigLIP: `probe.families.TOWERS`) is verified tower by tower, each with its own
    family: the image tower on `images` (default: `default_images()`), the text tower on `texts` (default:
    `DEFAULT_TEXTS`), whichever of them is given; `Verification.towers` holds each, named.
    """
    check_count(batch_size, "batch_size")
    if images is not None:
        images = check_images(images)  # once: an iterator is read here, not emptied by a second look
    if is_two_tower(lm):
        if target is not None:
            raise ValueError(f"target= is for encoder-decoder models; {lm.name} is a two-tower model (CLIP, SigLIP)")
        if family is not None:
            raise ValueError(f"{lm.name} is a two-tower model: give family= to one tower (hs.towers(lm))")
        return _verify_towers(lm, texts, images, batch_size=batch_size, truncate=truncate, progress=progress)
    family = family or family_for(lm.config)
    if family.vision_language is not None:
        if target is not None:
            raise ValueError(f"target= is for encoder-decoder models; {lm.name} is a vision–language decoder")
        return _verify_reading(lm, texts, images, family, progress=progress)
    if images is not None:
        require_modality(lm, images=True)  # an image on a text model: say that first
    if images is not None and texts is not None:
        raise ValueError("pass texts or images, not both")
    if images is not None or (texts is None and getattr(lm, "is_image", False)):
        require_modality(lm, images=True)
        encoded = encode_images(lm, check_images(default_images() if images is None else images))
        return _verify_one_stack(lm, encoded, family, batch_size=batch_size, progress=progress)
    require_modality(lm, images=False)
    texts = check_texts(DEFAULT_TEXTS if texts is None else texts)
    if family.kind == "encoder-decoder":
        return _verify_seq2seq(lm, texts, target, family, batch_size=batch_size, truncate=truncate, progress=progress)
    if target is not None:
        raise ValueError(f"target= is for encoder-decoder models; {lm.name} is a {family.kind}")
    return _verify_one_stack(lm, encode_many(lm, texts, truncate=truncate), family, batch_size=batch_size,
                             progress=progress)


def _verify_one_stack(lm: LoadedModel, encoded: list[Encoded], family: Family, *, batch_size: int,
                      progress: bool = False) -> Verification:
    have = family.attention_layers(lm.config)
    worst = {i: [0.0, 0.0, 0.0, 0.0] for i in have}  # abs, rel, abs_out, rel_out
    t_fwd = t_re = 0.0
    grids = {e.grid for e in encoded}
    step = 1 if len(grids) > 1 else batch_size  # one batch holds one image grid
    with progress_bar(total=-(-len(encoded) // step) * len(have), enabled=progress, desc=f"{lm.name} verify",
                      unit="layer") as bar:
        for start in range(0, len(encoded), step):
            batch = encoded[start : start + step]
            cap = capture(lm, batch, family)
            t_fwd += cap.seconds
            t0 = time.perf_counter()
            for i in have:
                lengths = [len(e.ids) for e in batch]
                errs = _compare_layer(family.layer_spec(base_model(lm), i, lm.config), cap, i, lengths, lengths)
                worst[i] = [max(a, b) for a, b in zip(worst[i], errs)]
                bar.update()
            t_re += time.perf_counter() - t0
    tol_p, tol_o = tolerances(lm.dtype)
    checks = tuple(
        LayerCheck(i, *w, passed=bool(w[0] <= tol_p and w[3] <= tol_o)) for i, w in worst.items()
    )
    return Verification(
        model=lm.name,
        family=family.name,
        dtype=str(lm.dtype).replace("torch.", ""),
        tolerance=tol_p,
        tolerance_output=tol_o,
        n_heads=lm.config.num_attention_heads,
        n_texts=len(encoded),
        n_tokens=sum(len(e.ids) for e in encoded),
        layers=checks,
        seconds_forward=t_fwd,
        seconds_recompute=t_re,
        no_attention=tuple(i for i in range(family.n_layers(lm.config)) if i not in have),
    )


def _verify_towers(lm: LoadedModel, texts, images, *, batch_size: int, truncate: bool,
                   progress: bool = False) -> Verification:
    """Both towers of a two-tower model, each on its own input, as one `Verification` whose rows name their tower."""
    parts = ((TOWER_NAMES["image"], verify(tower(lm, "image"), images=default_images() if images is None else images,
                                           batch_size=batch_size, progress=progress)),
             (TOWER_NAMES["text"], verify(tower(lm, "text"), texts, batch_size=batch_size, truncate=truncate,
                                          progress=progress)))
    vs = [v for _, v in parts]
    return Verification(
        model=lm.name, family=" + ".join(v.family for v in vs), dtype=vs[0].dtype, tolerance=vs[0].tolerance,
        tolerance_output=vs[0].tolerance_output, n_heads=max(v.n_heads for v in vs),
        n_texts=sum(v.n_texts for v in vs), n_tokens=sum(v.n_tokens for v in vs),
        layers=tuple(replace(c, kind=name) for name, v in parts for c in v.layers),
        seconds_forward=sum(v.seconds_forward for v in vs), seconds_recompute=sum(v.seconds_recompute for v in vs),
        towers=parts)


@torch.inference_mode()
def _compare_layer(spec: LayerSpec, cap: Captured, i: int, q_lengths: list[int], k_lengths: list[int]) -> list[float]:
    # recomputed in float32 from the layer inputs the model's own dtype gave (bf16 / fp16: the reference
    # is then exact to ~float32, and the difference is the model's own rounding, which `tolerances` bounds)
    x = cap.inputs[i].float()
    kv = cap.memory if spec.kv_layer is None else spec.kv_input(cap.inputs)  # shared KV: the producer's input
    ours = attention_from_scratch(x, spec, cap.key_valid.to(x.device), kv=None if kv is None else kv.float())
    if ours.probs.shape != cap.probs[i].shape:  # keys from the wrong sequence: no number can be compared
        return [float("inf")] * 4
    abs_p = abs_o = ref_p = ref_o = 0.0
    for b, (n, m) in enumerate(zip(q_lengths, k_lengths)):
        p_ref, p_new = cap.probs[i][b, :, :n, :m].float(), ours.probs[b, :, :n, :m].float()  # [head, query, key]
        o_ref, o_new = cap.outputs[i][b, :n].float(), ours.output[b, :n].float()  # (T, D)
        abs_p = max(abs_p, (p_ref - p_new).abs().max().item())
        abs_o = max(abs_o, (o_ref - o_new).abs().max().item())
        ref_p = max(ref_p, p_ref.abs().max().item())
        ref_o = max(ref_o, o_ref.abs().max().item())
    return [abs_p, abs_p / max(ref_p, 1e-30), abs_o, abs_o / max(ref_o, 1e-30)]


# --- vision–language decoders ---------------------------------------------------------------


def _verify_reading(lm: LoadedModel, texts, images, family: Family, *, progress: bool = False) -> Verification:
    """Both stacks of a vision–language decoder, one text (and its images) at a time: the vision tower's layers
    on the pixels by its image-encoder family, the decoder's on the merged text and image embeddings with the
    model's own mask (`VisionLanguage.blocks`) by its text family."""
    from .vision_language import default_texts, encode_with_images

    if texts is None and images is not None:  # the images alone: each with the default prompt
        texts = default_texts(images)
    texts = check_texts(DEFAULT_TEXTS[:2] if texts is None else texts)
    if images is None:  # each text its own picture, unless the texts place images themselves
        images = [default_images()[k % 2] for k in range(len(texts))]
    encoded = encode_with_images(lm, texts, check_images(images))
    reading = family.vision_language
    stacks = reading.hooked_stacks(family)
    base, cfg = base_model(lm), lm.config
    kinds = {s.kind: s for s in (reading.vision, *stacks)}  # the vision tower's rows, hooked or checked on outputs
    worst = {kind: {i: [0.0] * 4 for i in s.layer_numbers(cfg)} for kind, s in kinds.items()}
    t_fwd = t_re = 0.0
    for enc in progress_bar(encoded, enabled=progress, desc=f"{lm.name} verify", unit="text"):
        caps, seconds = _capture_stacks(lm, enc, stacks)
        t_fwd += seconds
        t0 = time.perf_counter()
        ids = torch.tensor([enc.ids])
        types = None if enc.inputs is None else enc.inputs.get("token_type_ids")
        at = reading.at_input(base, cfg, ids, enc.inputs)
        if reading.vision_outputs is not None:  # each row: no probability to compare (nan), the output's |Δ|
            for i, rel in enumerate(reading.vision_outputs(reading.vision, base, cfg, enc.inputs)):
                w = worst["vision"][i]
                w[:] = [math.nan, math.nan, max(w[2], rel), max(w[3], rel)]
        for stack in stacks:
            cap = caps[stack.kind]
            for i in stack.layer_numbers(cfg):
                spec = stack.layer_spec(base, i, cfg)
                if stack.kind == "decoder":
                    spec = at(reading.decoder_mask(spec, cfg, types, ids, i))
                keys = cap.inputs[i] if cap.memory is None else cap.memory
                spec = stack.for_input(spec, cfg, enc.inputs, cap.inputs[i].shape[1], keys.shape[1])
                lengths = [cap.inputs[i].shape[1]] * cap.inputs[i].shape[0]
                errs = _compare_layer(spec, cap, i, lengths, [keys.shape[1]] * keys.shape[0])
                worst[stack.kind][i] = [max(a, b) for a, b in zip(worst[stack.kind][i], errs)]
        t_re += time.perf_counter() - t0
    tol_p, tol_o = tolerances(lm.dtype)
    checks = tuple(LayerCheck(i, *w, passed=bool((math.isnan(w[0]) or w[0] <= tol_p) and w[3] <= tol_o), kind=kind)
                   for kind, layers in worst.items() for i, w in layers.items())
    return Verification(model=lm.name, family=family.name, dtype=str(lm.dtype).replace("torch.", ""), tolerance=tol_p,
                        tolerance_output=tol_o, n_heads=cfg.num_attention_heads, n_texts=len(encoded),
                        n_tokens=sum(len(e.ids) for e in encoded), layers=checks, seconds_forward=t_fwd,
                        seconds_recompute=t_re)


def _weights(out):
    """An attention module's probabilities: the last element of what it returns (None where it gives none)."""
    return out[-1].detach() if isinstance(out, tuple) and out[-1] is not None else None


@torch.inference_mode()
def _capture_stacks(lm: LoadedModel, enc: Encoded, stacks) -> tuple[dict[str, Captured], float]:
    """One forward pass of one text with its images, hooks on every attention block of every stack: each
    layer's input, its probabilities (the attention module's weights) and its output after W_O."""

    base, cfg = base_model(lm), lm.config
    at = {(s.kind, i): s for s in stacks for i in s.layer_numbers(cfg)}
    attn = {key: s.attention(base, key[1]) for key, s in at.items()}
    with ExitStack() as hooks:
        ins = hooks.enter_context(catch(attn, what="input"))
        probs = hooks.enter_context(catch(attn, take=_weights))
        outs = hooks.enter_context(catch({key: s.out_proj(base, key[1]) for key, s in at.items()}))
        memories = [hooks.enter_context(catch({key: m for key, m in attn.items() if key[0] == s.kind},
                                              what="arguments", take=lambda call, s=s: s.memory(*call).detach()))
                    for s in stacks if s.memory is not None]
        t0 = time.perf_counter()
        forward_one_stream(lm, model_batch([enc], lm.device), output_attentions=True, extra=extra_inputs(lm, [enc]))
        seconds = time.perf_counter() - t0
    memory = {key: value for got in memories for key, value in got.items()}
    size = {s.kind: max(s.layer_numbers(cfg)) + 1 for s in stacks}
    grabbed = {s.kind: [[got.get((s.kind, i)) for i in range(size[s.kind])] for got in (ins, probs, outs, memory)]
               for s in stacks}  # inputs, probs, outputs, memory
    caps = {}
    for stack in stacks:
        ins, probs, outs, memory = grabbed[stack.kind]
        have = stack.layer_numbers(cfg)
        if any(x[i] is None for x in (ins, probs, outs) for i in have):
            raise RuntimeError(f"{lm.name}: the forward pass did not expose every {stack.kind} layer's attention "
                               "(a text without images runs no vision tower)")
        keys = ins[have[0]] if stack.memory is None else memory[have[0]]
        valid = torch.ones(keys.shape[:2], dtype=torch.long)  # every patch and every token of one text is real
        caps[stack.kind] = Captured(tuple(ins), tuple(probs), tuple(outs), valid, seconds,
                                    memory=None if stack.memory is None else memory[have[0]])
    return caps, seconds


# --- encoder-decoder models ------------------------------------------------------------------


def _verify_seq2seq(lm: LoadedModel, sources: list[str], targets, family: Family, *, batch_size: int,
                    truncate: bool, progress: bool = False) -> Verification:
    targets = sources[1:] + sources[:1] if targets is None else check_texts(targets)
    if len(targets) != len(sources):
        raise ValueError(f"{len(sources)} source texts but {len(targets)} targets; give one target per source")
    src, tgt = encode_many(lm, sources, truncate=truncate), encode_targets(lm, targets, truncate=truncate)
    worst = {s.kind: [[0.0] * 4 for _ in range(s.n_layers(lm.config))] for s in family.stacks}
    t_fwd = t_re = 0.0
    with progress_bar(total=-(-len(src) // batch_size) * sum(map(len, worst.values())), enabled=progress,
                      desc=f"{lm.name} verify", unit="layer") as bar:
        for start in range(0, len(src), batch_size):
            s_items, t_items = src[start : start + batch_size], tgt[start : start + batch_size]
            caps, seconds = capture_seq2seq(lm, s_items, t_items, family)
            t_fwd += seconds
            t0 = time.perf_counter()
            lengths = {"source": [len(e.ids) for e in s_items], "target": [len(e.ids) for e in t_items]}
            for stack in family.stacks:
                q_side, k_side = _sides(stack)
                for i, w in enumerate(worst[stack.kind]):
                    spec = stack.layer_spec(base_model(lm), i, lm.config)
                    errs = _compare_layer(spec, caps[stack.kind], i, lengths[q_side], lengths[k_side])
                    w[:] = [max(a, b) for a, b in zip(w, errs)]
                    bar.update()
            t_re += time.perf_counter() - t0
    tol_p, tol_o = tolerances(lm.dtype)
    checks = tuple(LayerCheck(i, *w, passed=bool(w[0] <= tol_p and w[3] <= tol_o), kind=kind)
                   for kind, rows in worst.items() for i, w in enumerate(rows))
    return Verification(
        model=lm.name, family=family.name, dtype=str(lm.dtype).replace("torch.", ""), tolerance=tol_p,
        tolerance_output=tol_o, n_heads=lm.config.num_attention_heads, n_texts=len(src),
        n_tokens=sum(len(e.ids) for e in src) + sum(len(e.ids) for e in tgt), layers=checks,
        seconds_forward=t_fwd, seconds_recompute=t_re,
    )


def _sides(stack: Stack) -> tuple[str, str]:
    """Which text the stack's queries and keys come from: "source" or "target"."""
    query = "source" if stack.kind == "encoder" else "target"
    return query, "source" if stack.keys == "encoder" else query


@torch.inference_mode()
def capture_seq2seq(lm: LoadedModel, sources: Sequence[Encoded], targets: Sequence[Encoded],
                    family: Family) -> tuple[dict[str, Captured], float]:
    """One forward pass with hooks on every attention block of every stack -> ({kind: Captured}, seconds)."""
    base = base_model(lm)
    at = {(s.kind, i): s for s in family.stacks for i in range(s.n_layers(lm.config))}
    inputs = seq2seq_inputs(sources, targets, lm.device)
    with catch({key: s.attention(base, key[1]) for key, s in at.items()}, what="input") as ins, \
            catch({key: s.out_proj(base, key[1]) for key, s in at.items()}) as outs:
        t0 = time.perf_counter()
        out = base(**inputs)
        seconds = time.perf_counter() - t0
    grabbed = {s.kind: tuple([got.get((s.kind, i)) for i in range(s.n_layers(lm.config))] for got in (ins, outs))
               for s in family.stacks}
    masks = {"source": inputs["attention_mask"].cpu(), "target": inputs["decoder_attention_mask"].cpu()}
    probs = {"encoder": out.encoder_attentions, "decoder": out.decoder_attentions, "cross": out.cross_attentions}
    caps = {}
    for stack in family.stacks:
        ins, outs = grabbed[stack.kind]
        att = probs[stack.kind]
        if not att or any(a is None for a in att) or any(x is None for x in ins + outs):
            raise RuntimeError(f"{lm.name}: the forward pass did not expose every {stack.kind} layer's attention")
        _, k_side = _sides(stack)
        # keys and values from the encoder's final output, or (a self-attention stack) from the layer's own input
        memory = out.encoder_last_hidden_state.detach() if stack.keys == "encoder" else None
        caps[stack.kind] = Captured(tuple(ins), tuple(att), tuple(outs), masks[k_side], seconds, memory=memory)
    return caps, seconds
