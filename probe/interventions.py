"""Knock heads out three ways, through hooks: zero, the head's mean output, or uniform attention.

A head's output is its slice of the input to the attention output projection W_O (the heads'
outputs concatenated, `o_proj` / `c_proj` / BERT's `attention.output.dense`). Within
`ablate(lm, heads, method=...)` a forward pre-hook on W_O replaces that slice:

    zero     y_h = 0                                         at every position
    mean     y_h = mean of y_h over a reference corpus        (`head_means`, one vector per head)
    uniform  y_h(i) = mean of v_h(j) over the keys j visible from query i
             — the head attends uniformly (Kovaleva et al. 2019); v_h is the head's value vector,
             recomputed from the layer's input with its own weights (`LayerSpec`), and with
             grouped-query attention query head h reads KV head h // (n_heads / n_kv_heads).

Hooks only: no weight is touched, the caller's tensors are copied before they are changed, and
every hook is removed on exit, also after an error — the model is bit-for-bit what it was.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from typing import Callable, Iterable, Iterator, Sequence

import torch

from .encoding import check_count, encode_many, pad_batch
from .errors import UnsupportedFeature
from .families import Family, family_for
from .forward import attention_layers, base_model, is_seq2seq, no_attention_reason
from .hooks import LayerModules, catch, replace, watch
from .model import LoadedModel
from .names import AblationMethod
from .scratch import LayerSpec, build_mask, output_gate, project_v

__all__ = ["AblationMethod", "ABLATION_METHODS", "ablate", "ablate_copies", "check_heads", "head_dim", "head_means", "head_mask",
           "refuse_seq2seq"]

Head = tuple[int, int]


def head_dim(lm: LoadedModel, family: Family | None = None, layer: int | None = None) -> int:
    """Width of one head's slice of the W_O input: the value head size of the layer's spec
    (`LayerSpec.value_head_dim`), which multi-head latent attention sets apart from the q/k head size.
    `layer`: the model's layer number (default: its first layer with softmax attention)."""
    family = family or family_for(lm.config)
    if layer is None:
        layer = family.attention_layers(lm.config)[0]
    return family.layer_spec(base_model(lm), layer, lm.config).value_head_dim


def refuse_seq2seq(lm: LoadedModel, what: str) -> None:
    """A clear `ValueError` for an encoder–decoder model: ablation, head masks and importance cover one stack."""
    if is_seq2seq(lm):
        raise ValueError(f"{lm.name} is an encoder–decoder model: {what} covers encoders and decoders only "
                         "(it switches heads of one stack and reads that stack's output)")


def check_heads(lm: LoadedModel, heads: Iterable[Head]) -> tuple[Head, ...]:
    """`heads` sorted and deduplicated as ints; a clear error for one outside the model."""
    out = tuple(sorted({(int(l), int(h)) for l, h in heads}))
    n_layers, n_heads = lm.config.num_hidden_layers, lm.config.num_attention_heads
    bad = [(l, h) for l, h in out if not (0 <= l < n_layers and 0 <= h < n_heads)]
    if bad:
        raise ValueError(f"heads {bad} out of range: {lm.name} has layers 0..{n_layers - 1} and heads 0..{n_heads - 1}")
    have = attention_layers(lm)
    for layer, _ in out:
        if layer not in have:  # a hybrid stack's layer without softmax attention has no heads to switch
            raise ValueError(no_attention_reason(lm, layer))
    return out


def _by_layer(heads: Sequence[Head]) -> dict[int, list[int]]:
    grouped: dict[int, list[int]] = {}
    for l, h in heads:
        grouped.setdefault(l, []).append(h)
    return grouped


# --- what replaces a head's slice, per method ------------------------------------------------
# Each builder returns `fill(y, inputs, key_valid) -> y'` for one layer, where `y` is the
# (B, T, nh*hs) input of W_O, already a copy, and `inputs` the attention inputs caught so far by layer.

def _zero(lm, family, layer, cols, means):
    hs = head_dim(lm, family, layer)

    def fill(y, inputs, key_valid):
        for h in cols:
            y[..., h * hs : (h + 1) * hs] = 0
        return y

    return fill


def _mean(lm, family, layer, cols, means):
    if means is None:
        raise ValueError("method='mean' needs the heads' mean outputs: pass means=head_means(lm, reference_texts)")
    hs = head_dim(lm, family, layer)

    def fill(y, inputs, key_valid):
        for h in cols:
            y[..., h * hs : (h + 1) * hs] = means[layer, h].to(y.device, y.dtype)
        return y

    return fill


def _uniform(lm, family, layer, cols, means):
    spec: LayerSpec = family.layer_spec(base_model(lm), layer, lm.config)
    vs, group = spec.value_head_dim, spec.n_heads // spec.n_kv_heads

    def fill(y, inputs, key_valid):
        x = inputs[layer]
        B, T, _ = x.shape
        allowed = build_mask(key_valid, causal=spec.causal, sliding_window=spec.sliding_window,
                             local_window=spec.local_window, chunk_size=spec.chunk_size,
                             dtype=torch.float32)[:, 0].isfinite().to(x.device, x.dtype)  # (B, T, T) 1: i sees j
        weights = allowed / allowed.sum(-1, keepdim=True).clamp_min(1)  # uniform over the visible keys
        v_all = project_v(x, spec, kv=spec.kv_input(inputs))  # (B, nkv, T, vs): every KV head's values, MLA's from its kv latent
        for h in cols:
            v = v_all[:, h // group]  # (B, T, vs): the KV head that query head h reads
            out = weights @ v  # (B, T, vs)
            if spec.output_gate is not None:  # gated attention: the head's own gate still scales what it writes
                out = out * output_gate(x, spec)[..., h * vs : (h + 1) * vs]
            y[..., h * vs : (h + 1) * vs] = out
        return y

    return fill


ABLATION_METHODS: dict[str, Callable] = {"zero": _zero, "mean": _mean, "uniform": _uniform}


@contextmanager
def ablate(lm: LoadedModel, heads: Iterable[Head], *, method: AblationMethod = "zero",
           means: torch.Tensor | None = None) -> Iterator[None]:
    """Within the block, every (layer, head) in `heads` is ablated by `method` at every position.

    `means` is `head_means(lm, texts)` (`[layer, head, head_dim]`), needed for `method="mean"`.

    >>> from headscope.probe.tiny import tiny_model
    >>> lm = tiny_model("llama"); ids = lm.tokenizer("The cat sat.", return_tensors="pt")["input_ids"]
    >>> with torch.no_grad():
    ...     clean = lm.model(ids).logits
    ...     with ablate(lm, [(1, 0), (1, 3)], method="uniform"):
    ...         hit = lm.model(ids).logits
    ...     again = lm.model(ids).logits
    >>> bool((hit != clean).any()), torch.equal(again, clean)
    (True, True)
    """
    if method not in ABLATION_METHODS:
        raise ValueError(f"method must be one of {', '.join(ABLATION_METHODS)}, got {method!r}")
    refuse_seq2seq(lm, "head ablation")
    heads = check_heads(lm, heads)
    family = family_for(lm.config)
    base = base_model(lm)
    replacers = {l: ABLATION_METHODS[method](lm, family, l, cols, means) for l, cols in _by_layer(heads).items()}
    with ExitStack() as stack:
        caught = set(replacers) | {family.layer_spec(base, l, lm.config).kv_layer for l in replacers} - {None}
        state = _LayerInputs(lm, family, base, sorted(caught) if method == "uniform" else [], stack)
        stack.enter_context(replace(LayerModules(family, base, lm.config, list(replacers), "out_proj"),
                                    lambda layer, y: replacers[layer](y.clone(), state.inputs, state.key_valid(y)),
                                    what="input"))
        yield


@contextmanager
def ablate_copies(lm: LoadedModel, layer: int, heads: Sequence[int], *, method: AblationMethod = "zero",
                  means: torch.Tensor | None = None) -> Iterator[None]:
    """Within the block, a forward call on `len(heads)` stacked copies of a batch (copy c: rows c·B … (c+1)·B − 1)
    has head `heads[c]` of `layer` ablated by `method` in copy c only: one pass for that many single-head ablations.

    Rows of a batch do not mix, so copy c reads what a pass under `ablate(lm, [(layer, heads[c])])` reads.

    >>> from headscope.probe.tiny import tiny_model
    >>> lm = tiny_model("llama"); ids = lm.tokenizer("The cat sat.", return_tensors="pt")["input_ids"]
    >>> with torch.no_grad():
    ...     with ablate(lm, [(1, 2)]):
    ...         alone = lm.model(ids).logits
    ...     with ablate_copies(lm, 1, [0, 2]):
    ...         both = lm.model(ids.repeat(2, 1)).logits
    >>> torch.allclose(both[1], alone[0], atol=1e-6), bool((both[0] != alone[0]).any())
    (True, True)
    """
    if method not in ABLATION_METHODS:
        raise ValueError(f"method must be one of {', '.join(ABLATION_METHODS)}, got {method!r}")
    refuse_seq2seq(lm, "head ablation")
    check_heads(lm, [(layer, h) for h in heads])
    if not heads:
        raise ValueError("ablate_copies needs at least one head")
    family = family_for(lm.config)
    base = base_model(lm)
    replacers = [ABLATION_METHODS[method](lm, family, layer, [int(h)], means) for h in heads]
    with ExitStack() as stack:
        caught = {layer, family.layer_spec(base, layer, lm.config).kv_layer} - {None}
        state = _LayerInputs(lm, family, base, sorted(caught) if method == "uniform" else [], stack)

        def each_copy(_layer, y):
            y = y.clone()
            rows, k = y.shape[0] // len(replacers), len(replacers)
            if rows * k != y.shape[0]:
                raise ValueError(f"a batch of {y.shape[0]} rows is not {k} stacked copies")
            valid = state.key_valid(y)
            for c, fill in enumerate(replacers):
                part = slice(c * rows, (c + 1) * rows)
                y[part] = fill(y[part], {l: x[part] for l, x in state.inputs.items()}, valid[part])
            return y

        stack.enter_context(replace(LayerModules(family, base, lm.config, [layer], "out_proj"), each_copy, what="input"))
        yield


class _LayerInputs:
    """Catches, during a forward pass, the attention input `x` of some layers and the padding mask."""

    def __init__(self, lm, family: Family, base, layers: list[int], stack: ExitStack) -> None:
        self.inputs: dict[int, torch.Tensor] = {}
        self._masks: dict = {}
        if not layers:
            return
        self._masks = stack.enter_context(catch({"base": base}, what="arguments", take=_mask_2d))
        self.inputs = stack.enter_context(catch(LayerModules(family, base, lm.config, layers, "attention"),
                                                what="input", take=lambda x: x))  # not detached: a gradient flows

    def key_valid(self, y: torch.Tensor) -> torch.Tensor:
        """(B, T) 1 for real tokens: the 2-D mask the model was called with, else all ones."""
        B, T = y.shape[:2]
        mask = self._masks.get("base")
        if mask is not None and tuple(mask.shape) == (B, T):
            return mask.to("cpu")
        return torch.ones(B, T, dtype=torch.long)


def _mask_2d(call: tuple[tuple, dict]) -> torch.Tensor | None:
    """The call's `attention_mask` keyword where it is a 2-D (batch, token) padding mask, else None."""
    mask = call[1].get("attention_mask")
    return mask if isinstance(mask, torch.Tensor) and mask.dim() == 2 else None


@torch.inference_mode()
def head_means(lm: LoadedModel, texts: Sequence[str], *, batch_size: int = 8, truncate: bool = False) -> torch.Tensor:
    """Each head's mean output over the real tokens of `texts`: `[layer, head, head_dim]` (float32, CPU).

    The reference for `ablate(..., method="mean")`: the head is replaced by what it outputs on
    average, so only its input-specific part is removed.
    """
    check_count(batch_size, "batch_size")
    refuse_seq2seq(lm, "head_means")
    family = family_for(lm.config)
    base = base_model(lm)
    n_layers, nh = lm.config.num_hidden_layers, lm.config.num_attention_heads
    sizes = {head_dim(lm, family, l) for l in family.attention_layers(lm.config)}
    if len(sizes) > 1:
        raise UnsupportedFeature(f"{lm.name}'s heads have different sizes in different layers ({sorted(sizes)}); "
                                 "mean ablation needs one size — use method='zero' or 'uniform'")
    hs = sizes.pop()
    sums = torch.zeros(n_layers, nh * hs, dtype=torch.float64)
    count = 0
    encoded = encode_many(lm, list(texts), truncate=truncate)
    if not encoded:
        raise ValueError("head_means needs at least one reference text")
    for start in range(0, len(encoded), batch_size):
        ids, mask = pad_batch(encoded[start : start + batch_size], lm.device)
        real = mask.bool().cpu()

        def add(layer, y):
            sums[layer] += y.detach().to("cpu", torch.float64)[real].sum(0)

        with watch(LayerModules(family, base, lm.config, attention_layers(lm), "out_proj"), add, what="input"):
            base(input_ids=ids, attention_mask=mask, use_cache=False)
        count += int(real.sum())
    return (sums / count).float().view(n_layers, nh, hs)


@contextmanager
def head_mask(lm: LoadedModel, xi: torch.Tensor) -> Iterator[None]:
    """Within the block, head h of layer l outputs ξ[b, l, h] · y_h (Michel et al. 2019's head mask).

    `xi` is `(B, n_layers, n_heads)` (one mask per example, so that a gradient w.r.t. `xi[b]` is
    example b's own) or `(n_layers, n_heads)`; give it `requires_grad=True` to get ∂L/∂ξ.
    """
    refuse_seq2seq(lm, "the head mask")
    family = family_for(lm.config)
    base = base_model(lm)
    n_layers, nh = lm.config.num_hidden_layers, lm.config.num_attention_heads
    if tuple(xi.shape[-2:]) != (n_layers, nh):
        raise ValueError(f"head mask is {tuple(xi.shape)}; {lm.name} needs (..., {n_layers}, {nh})")

    layers = attention_layers(lm)  # a hybrid stack's other layers have no heads: their rows of ξ are unused
    sizes = {layer: head_dim(lm, family, layer) for layer in layers}  # each layer's own value head size

    def scaled(layer, y):  # y: (B, T, nh*hs)
        scale = xi[..., layer, :].to(y.dtype)  # (B, nh) or (nh,)
        scale = scale[:, None, :, None] if scale.dim() == 2 else scale[:, None]
        return (y.unflatten(-1, (nh, sizes[layer])) * scale).flatten(-2)  # (B, T, nh, hs) scaled per head

    with replace(LayerModules(family, base, lm.config, layers, "out_proj"), scaled, what="input"):
        yield
