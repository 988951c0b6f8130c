"""What a head writes and why it attends there: exact decompositions of one forward pass.

Both tools start from one traced forward pass of the real model (`trace`): every layer's input and
output (the residual stream), every head's output (its slice of the W_O input, as in
`probe.interventions`), and every norm the stream passes through, each with its scale **frozen at
this run's value** — the convention of TransformerLens's `apply_ln_to_stack`. With the scale frozen a
norm is linear (LayerNorm: centre, divide by the run's σ, multiply by the weight; RMS norm: divide
by the run's RMS, multiply by the weight or Gemma's 1 + weight), so everything between two norms is
a sum of parts:

    resid(t) = embed(t) + Σ_layers [ Σ_heads y_h(t) W_O,hᵀ + b_O  (through the post-attention norm
                                     where the model has one: Gemma 2/3, OLMo 2)  +  mlp(t) ]

where `mlp` is the rest of the layer's write: its output minus its input minus its attention's write
(the MLP, or for parallel-attention blocks the MLP branch). Which norm is where is read off the data
flow of the traced pass (the norm whose output is the attention's input, the one whose input is
W_O's output, the one whose output feeds the unembedding), and each norm's kind is the one that
reproduces the model's own output; a norm that none reproduces is refused.

- `direct_logit_attribution` (decoders): the next-token logit, or logit(right) − logit(wrong), as a
  sum over those parts through the final norm and the unembedding. Identity: the parts sum to the
  model's own number (`identity_abs_err`). Gemma 2's final logit softcap is applied after and said so.
- `qk_attribution`: one head's pre-softmax score for one query and one key as a sum over
  (query-side part, key-side part) pairs — q·k is bilinear once the pre-attention norm and the
  QK-norm scales are frozen; rotary is linear and applies to each part. Identity: the terms sum to
  the score of the verified from-scratch attention (`probe.scratch.row_scores`).

Hooks only: nothing is written to the model, and every hook is removed on exit, also after an error.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import Literal

import pandas as pd
import torch

from .encoding import check_texts, encode
from .errors import UnsupportedFeature
from .families import SUPPORTED_TYPES, Family, family_for
from .forward import base_model
from .hooks import catch, first_output
from .model import LoadedModel
from .placement import onloaded
from .results import DLAResult, QKAttribution
from .progress import progress as progress_bar
from .scratch import LayerSpec
from .types import head_name, parse_head, whole_number

__all__ = ["FrozenNorm", "Trace", "trace", "answer_token", "residual_parts", "direct_logit_attribution",
           "qk_attribution", "decoder_layers", "require_lm_head"]


# --------------------------------------------------------------------------------------------
# Norms with a frozen scale


@dataclass(frozen=True, eq=False)
class FrozenNorm:
    """A norm module linearised at one run: `apply(c, t)` = the linear part for position t, `bias` the rest.

    The norm of a sum x = Σ c_i is then Σ apply(c_i, t) + bias, exactly, at this run's scale.
    """

    kind: Literal["layer", "rms"]
    inv_scale: torch.Tensor  # (T,) 1 / σ (LayerNorm) or 1 / RMS (RMS norm) of the run's input, float64
    weight: torch.Tensor  # (D,) the multiplier (Gemma: 1 + w), float64
    bias: torch.Tensor | None  # (D,) or None
    max_abs_err: float  # this linearisation against the module's own output on the run

    def apply(self, c: torch.Tensor, t: int | torch.Tensor) -> torch.Tensor:
        """The linear part of the norm of `c` (..., D) at position(s) `t` (an int, or a tensor broadcast against c)."""
        if self.kind == "layer":
            c = c - c.mean(-1, keepdim=True)
        s = self.inv_scale[t]
        if isinstance(t, torch.Tensor):
            s = s[..., None]
        return c * s * self.weight

    def full(self, x: torch.Tensor) -> torch.Tensor:
        """The whole norm of (T, D) `x` at the frozen scale (the bias included)."""
        out = self.apply(x, torch.arange(x.shape[0]))
        return out if self.bias is None else out + self.bias


def _eps(module) -> float:
    for name in ("eps", "variance_epsilon", "epsilon", "layer_norm_eps"):
        v = getattr(module, name, None)
        if isinstance(v, (int, float)):
            return float(v)
    return 1e-5


def freeze_norm(module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> FrozenNorm:
    """The norm `module` linearised at input `x` (T, D) whose output was `y`: the kind (LayerNorm, RMS
    with w or with 1 + w) that reproduces `y`; `UnsupportedFeature` when none does."""
    x, y = x.double(), y.double()
    D = x.shape[-1]
    with onloaded(module):  # a norm that accelerate offloaded: its weights in for the copy
        w = getattr(module, "weight", None)
        w = torch.ones(D, dtype=torch.float64) if w is None else w.detach().double().cpu()
        b = getattr(module, "bias", None)
        b = None if b is None else b.detach().double().cpu()
    eps = _eps(module)
    centred = x - x.mean(-1, keepdim=True)
    candidates = [
        ("layer", torch.rsqrt(centred.pow(2).mean(-1) + eps), w),
        ("rms", torch.rsqrt(x.pow(2).mean(-1) + eps), w),
        ("rms", torch.rsqrt(x.pow(2).mean(-1) + eps), 1.0 + w),
    ]
    best = None
    for kind, inv, weight in candidates:
        norm = FrozenNorm(kind, inv, weight, b, 0.0)
        err = float((norm.full(x) - y).abs().max())
        if best is None or err < best[0]:
            best = (err, norm)
    err, norm = best
    if not err <= 1e-3 * (1.0 + float(y.abs().max())):
        raise UnsupportedFeature(f"{type(module).__name__} is neither a LayerNorm nor an RMS norm that headscope "
                                 f"can freeze (closest |Δ| = {err:.2g}); it cannot be decomposed")
    return FrozenNorm(norm.kind, norm.inv_scale, norm.weight, norm.bias, err)


# --------------------------------------------------------------------------------------------
# One traced forward pass


def decoder_layers(lm: LoadedModel, family: Family) -> list[torch.nn.Module]:
    """The transformer blocks, found as the parents of the family's attention modules."""
    family.require_attention_everywhere(lm.config, "tracing the residual stream through every block")
    base = base_model(lm)
    family.require_own_modules(base, lm.config, "tracing the residual stream through every block")
    parent = {id(child): mod for mod in base.modules() for child in mod.children()}
    return [parent[id(family.attention(base, i))] for i in range(family.n_layers(lm.config))]


def _is_norm(module: torch.nn.Module) -> bool:
    return isinstance(module, torch.nn.LayerNorm) or "norm" in type(module).__name__.lower()


def require_lm_head(lm: LoadedModel, what: str) -> torch.nn.Module:
    """The decoder's unembedding; a one-line refusal for an encoder."""
    get = getattr(lm.model, "get_output_embeddings", None)
    head = get() if get is not None else None
    if not lm.is_causal or head is None:
        kind = family_for(lm.config).kind if lm.model_type in SUPPORTED_TYPES else None
        why = ("an image model: no next token to read off" if getattr(lm, "is_image", False) else
               "an encoder–decoder model: only one stack of self-attention is decomposed" if kind == "encoder-decoder"
               else "an encoder's masked-LM head is not decomposed yet")
        raise ValueError(f"{what} needs a decoder with a language-model head; {lm.name} has none ({why})")
    return head


@dataclass(frozen=True, eq=False)
class Trace:
    """One prompt's forward pass, taken apart (float64, CPU, positions 0 .. T-1, one text).

    `heads_in[l]` (T, nh*hs) is the input of layer l's W_O (the heads' outputs concatenated),
    `attn_out[l]` (T, D) W_O's own output; `post_attn[l]` the frozen norm the attention's output
    passes before the residual (None for most models), `pre_attn[l]` the one that makes the
    attention's input (None where the attention reads the stream itself, OLMo 2).
    """

    ids: tuple[int, ...]
    labels: tuple[str, ...]
    specs: tuple[LayerSpec, ...]
    layer_in: tuple[torch.Tensor, ...]  # (T, D) per layer
    layer_out: tuple[torch.Tensor, ...]  # (T, D) per layer
    attn_in: tuple[torch.Tensor, ...]  # (T, D) the attention module's input x
    heads_in: tuple[torch.Tensor, ...]  # (T, nh*hs)
    attn_out: tuple[torch.Tensor, ...]  # (T, D)
    pre_attn: tuple[FrozenNorm | None, ...]
    post_attn: tuple[FrozenNorm | None, ...]
    final_norm: FrozenNorm | None
    unembed_in: torch.Tensor | None  # (D,) the input of the LM head at the last position
    logits: torch.Tensor | None  # (V,) the LM head's output at the last position (before any softcap)


def _traceable(lm: LoadedModel, text: str) -> Family:
    """`lm`'s family, once `text` and `lm` are known to be what `trace` can run (else the one error that says why)."""
    if not isinstance(text, str):
        raise TypeError(f"the text must be one str, got {type(text).__name__}")
    check_texts([text])  # an empty text has no last token ("Expected tensor for argument #1 'indices' ...")
    if getattr(lm, "is_image", False):
        raise ValueError(f"{lm.name} is an image model ({lm.model_type}); the decompositions (dla, qk, composition) "
                         "read a text's residual stream and cover text models only")
    family = family_for(lm.config)
    if family.kind == "encoder-decoder":
        raise ValueError(f"{lm.name} is an encoder–decoder model; attribution covers one stack of self-attention")
    return family


def trace(lm: LoadedModel, text: str, *, progress: bool = False) -> Trace:
    """Run `text` once through the model with hooks that catch everything the decompositions need; `progress`: a
    bar on stderr, one step per layer of the forward pass."""
    family = _traceable(lm, text)
    base = base_model(lm)
    enc = encode(lm, text)
    ids = torch.tensor([enc.ids], device=lm.device)
    layers = decoder_layers(lm, family)
    n = len(layers)
    head = getattr(lm.model, "get_output_embeddings", lambda: None)() if lm.is_causal else None
    inside = {id(m) for layer in layers for m in layer.modules()}
    norms_at = {**{(l, name): child for l, layer in enumerate(layers) for name, child in layer.named_modules()
                   if name and _is_norm(child)},
                **{(None, name): child for name, child in base.named_modules() if _is_norm(child) and id(child) not in inside}}
    blocks, attns, projs = dict(enumerate(layers)), {l: family.attention(base, l) for l in range(n)}, \
        {l: family.out_proj(base, l) for l in range(n)}

    def row(x):  # the one text's row
        return x[0].detach()

    def out_row(out):
        return first_output(out)[0].detach()

    with ExitStack() as stack, torch.inference_mode():
        bar = stack.enter_context(progress_bar(total=n, enabled=progress, desc=f"{lm.name} forward", unit="layer"))

        def on(modules, what, take):
            return stack.enter_context(catch(modules, what=what, take=take))

        def layer_out(out):  # a block's output: one step of the bar
            bar.update()
            return out_row(out)

        got = {"in": on(blocks, "input", row), "out": on(blocks, "output", layer_out),
               "attn_in": on(attns, "input", row), "heads": on(projs, "input", row),
               "attn_out": on(projs, "output", out_row)}
        norm_in, norm_out = on(norms_at, "input", row), on(norms_at, "output", row)
        unembed_in = on({} if head is None else {0: head}, "input", lambda x: x[0, -1].detach())
        logits = on({} if head is None else {0: head}, "output", lambda out: out[0, -1].detach())
        if head is not None:
            # the last position's logits, named as a tensor: an int lets Gemma 4 run its shared-KV layers on the
            # kept positions only, and every position's stream is needed here
            last = torch.tensor([ids.shape[1] - 1], device=ids.device)
            lm.model(input_ids=ids, use_cache=False, logits_to_keep=last)
        else:
            base(input_ids=ids, use_cache=False)

    def f64(t):
        return t.to("cpu", torch.float64)

    specs = tuple(family.layer_spec(base, l, lm.config) for l in range(n))
    norms = {key: (norms_at[key], norm_in[key], y) for key, y in norm_out.items()}  # in the order they ran
    pre, post = [], []
    for l in range(n):
        mine = [(m, x, y) for (layer, _), (m, x, y) in norms.items() if layer == l]
        a_in, a_out = got["attn_in"][l], got["attn_out"][l]
        pre.append(next((freeze_norm(m, x, y) for m, x, y in mine if y.shape == a_in.shape and torch.equal(y, a_in)),
                        None))
        post.append(next((freeze_norm(m, x, y) for m, x, y in mine if x.shape == a_out.shape and torch.equal(x, a_out)),
                         None))
    for l in range(n):  # a norm after the residual sum (BERT's post-LN) makes the stream no sum of parts
        out_l = got["out"][l]
        if any(y.shape == out_l.shape and torch.equal(y, out_l) for (layer, _), (m, x, y) in norms.items() if layer == l):
            raise UnsupportedFeature(f"{lm.name} normalises the residual stream after each layer (post-LN), so the "
                                     "stream is no sum of its parts; attribution covers pre-norm models")
    final = None
    unembed_in = unembed_in.get(0)
    if unembed_in is not None:
        top = [(m, x, y) for (layer, _), (m, x, y) in norms.items() if layer is None]
        final = next((freeze_norm(m, x, y) for m, x, y in top if y.shape[-1] == unembed_in.shape[-1]
                      and torch.equal(y[-1], unembed_in)), None)
        if final is None:
            raise UnsupportedFeature(f"{lm.name}: no final norm feeds the LM head directly (a projection between "
                                     "them?); the logit cannot be decomposed")
    from .encoding import token_labels

    return Trace(
        ids=tuple(enc.ids), labels=token_labels(lm, enc), specs=specs,
        layer_in=tuple(f64(got["in"][l]) for l in range(n)), layer_out=tuple(f64(got["out"][l]) for l in range(n)),
        attn_in=tuple(f64(got["attn_in"][l]) for l in range(n)), heads_in=tuple(f64(got["heads"][l]) for l in range(n)),
        attn_out=tuple(f64(got["attn_out"][l]) for l in range(n)), pre_attn=tuple(pre), post_attn=tuple(post),
        final_norm=final, unembed_in=None if unembed_in is None else f64(unembed_in),
        logits=None if 0 not in logits else f64(logits[0]),
    )


def residual_parts(tr: Trace, t: int, *, before: int | None = None) -> tuple[list[str], torch.Tensor, float]:
    """The residual stream at position t, at the input of layer `before` (default: after the last
    layer), as parts: (names, (P, D) float64, max |Δ| of the heads' sum against W_O's own output).

    Names: "embed" (the input of the first layer, position embeddings included), "L3H1" (the head's
    write: its output through its W_O slice, and the post-attention norm where there is one),
    "L3.attn_bias" (W_O's bias and the post-attention norm's bias), "L3.mlp" (the rest of the layer's
    write). They sum to the stream exactly (up to float64 rounding).
    """
    stop = len(tr.specs) if before is None else before
    names, parts, attn_err = ["embed"], [tr.layer_in[0][t]], 0.0
    for l in range(stop):
        spec = tr.specs[l]
        nh, vs = spec.n_heads, spec.value_head_dim  # a head's W_O slice is as wide as its value
        D = spec.wo.shape[0]
        y = tr.heads_in[l][t].view(nh, vs)  # (nh, vs)
        wo = spec.wo.double().cpu().view(D, nh, vs)  # (D, nh, vs): column block h is head h's W_O slice
        heads = torch.einsum("dhk,hk->hd", wo, y)  # (nh, D) each head's write before any post-norm
        bias = torch.zeros(D, dtype=torch.float64) if spec.bo is None else spec.bo.double().cpu()
        attn_err = max(attn_err, float((heads.sum(0) + bias - tr.attn_out[l][t]).abs().max()))
        post = tr.post_attn[l]
        if post is not None:
            heads, bias = post.apply(heads, t), post.apply(bias, t) + (0 if post.bias is None else post.bias)
        mlp = tr.layer_out[l][t] - tr.layer_in[l][t] - heads.sum(0) - bias
        names += [head_name(l, h) for h in range(nh)] + [f"L{l}.attn_bias", f"L{l}.mlp"]
        parts += [*heads, bias, mlp]
    return names, torch.stack(parts), attn_err


def answer_token(lm: LoadedModel, answer: str | int) -> int:
    """A token id: an int as it is, a string's first token (no special tokens added)."""
    if isinstance(answer, int) and not isinstance(answer, bool):
        if not 0 <= answer < lm.model.get_output_embeddings().weight.shape[0]:
            raise ValueError(f"token id {answer} is outside {lm.name}'s vocabulary")
        return answer
    if not isinstance(answer, str):
        raise TypeError(f"an answer is a str or a token id (int), got {answer!r}")
    ids = lm.tokenizer(answer, add_special_tokens=False)["input_ids"]
    if not ids:
        raise ValueError(f"answer {answer!r} is empty after tokenisation")
    return int(ids[0])


# --------------------------------------------------------------------------------------------
# Direct logit attribution


def _kind(name: str) -> tuple[str, int | None, int | None]:
    if name.endswith(".mlp"):
        return "mlp", int(name[1:-4]), None
    if name.endswith(".attn_bias"):
        return "attn_bias", int(name[1:].split(".")[0]), None
    try:
        layer, head = parse_head(name)
    except ValueError:
        return name, None, None
    return "head", layer, head


def direct_logit_attribution(lm: LoadedModel, prompt: str, answer: str | int | None, wrong: str | int | None = None,
                             *, progress: bool = False) -> DLAResult:
    """Split the logit of `answer` (minus that of `wrong`) after `prompt` into the residual stream's parts;
    `answer=None`: the model's own most likely next token (the report's sentences).

    Each part goes through the final norm at the run's frozen scale and the unembedding; the final
    norm's bias and the unembedding's bias are parts of their own ("final_norm_bias", "unembed_bias").
    `progress`: a bar on stderr over the traced forward pass's layers.

    >>> from headscope.probe.tiny import tiny_model
    >>> r = direct_logit_attribution(tiny_model("llama"), "The cat sat on the", " mat", " dog")
    >>> r.identity_rel_err < 1e-5, sorted(set(r.table["kind"]))
    (True, ['attn_bias', 'embed', 'head', 'mlp'])
    """
    head = require_lm_head(lm, "direct logit attribution")
    a = None if answer is None else answer_token(lm, answer)
    b = None if wrong is None else answer_token(lm, wrong)
    tr = trace(lm, prompt, progress=progress)
    if a is None:
        a = int(tr.logits.argmax())
        answer = lm.tokenizer.decode([a])
    if a == b:  # the difference would be 0 in every part: a table of zeros that looks like an answer
        raise ValueError(f"answer {answer!r} and wrong {wrong!r} are the same token ({lm.tokenizer.decode([a])!r}, "
                         f"id {a}): only their first tokens are compared; give a wrong answer that starts differently")
    t = len(tr.ids) - 1
    names, parts, attn_err = residual_parts(tr, t)
    with onloaded(head):  # an unembedding that accelerate offloaded: its weights in for the copy
        W = head.weight.detach().double().cpu()
        hb = getattr(head, "bias", None)
        hb = None if hb is None else hb.detach().double().cpu()
    u = W[a] - (W[b] if b is not None else 0)  # (D,) the direction read off the final norm's output
    values = tr.final_norm.apply(parts, t) @ u  # (P,)
    rows = [(n, *_kind(n), float(v)) for n, v in zip(names, values)]
    if tr.final_norm.bias is not None:
        rows.append(("final_norm_bias", "final_norm_bias", None, None, float(tr.final_norm.bias @ u)))
    if hb is not None:
        rows.append(("unembed_bias", "unembed_bias", None, None, float(hb[a] - (hb[b] if b is not None else 0))))
    table = pd.DataFrame(rows, columns=["component", "kind", "layer", "head", "value"])
    table[["layer", "head"]] = table[["layer", "head"]].astype("Int64")
    total = float(tr.logits[a] - (tr.logits[b] if b is not None else 0))
    cap = getattr(lm.config, "final_logit_softcapping", None)
    capped = None
    if cap:
        def c(v):
            return cap * torch.tanh(v / cap)
        capped = float(c(tr.logits[a]) - (c(tr.logits[b]) if b is not None else 0))
    final_err = float((tr.final_norm.full(tr.layer_out[-1])[t] - tr.unembed_in).abs().max())
    return DLAResult(model=lm.name, prompt=prompt, answer=str(answer), wrong=None if wrong is None else str(wrong),
                     answer_id=a, wrong_id=b, total=total, table=table,
                     identity_abs_err=abs(float(table["value"].sum()) - total), attention_abs_err=attn_err,
                     final_norm_abs_err=final_err, softcap=cap or None, capped_total=capped,
                     n_layers=len(tr.specs), n_heads=tr.specs[0].n_heads, labels=tr.labels,
                     answer_token=lm.tokenizer.decode([a]) if isinstance(answer, str) else None,
                     wrong_token=lm.tokenizer.decode([b]) if isinstance(wrong, str) else None)


# --------------------------------------------------------------------------------------------
# QK attribution


def _rotate_at(parts: torch.Tensor, spec: LayerSpec, pos: int, T: int) -> torch.Tensor:
    """Rotary at position `pos` applied to each row of `parts` (P, hs), as `probe.scratch` rotates a sequence of T."""
    if spec.inv_freq is None:
        return parts
    from .scratch import rotary_cos_sin, rotate

    inv_freq = spec.inv_freq(T) if callable(spec.inv_freq) else spec.inv_freq
    cos, sin = rotary_cos_sin(inv_freq.float().cpu(), torch.arange(T), spec.rope_scaling,
                              interleaved=spec.rotary_interleaved)
    cos, sin = cos[pos].double(), sin[pos].double()  # (d,)
    d = spec.rotary_dim or parts.shape[-1]
    turned = rotate(parts[..., :d], cos, sin, interleaved=spec.rotary_interleaved)
    return torch.cat([turned, parts[..., d:]], dim=-1)


def _side(tr: Trace, spec: LayerSpec, layer: int, pos: int, w: torch.Tensor, b: torch.Tensor | None,
          norm_w: torch.Tensor | None, full_w: torch.Tensor, full_b: torch.Tensor | None, slice_: slice
          ) -> tuple[list[str], torch.Tensor, float]:
    """One side (query or key) at position `pos`: names and (P, hs) parts of the projected, normed and
    rotated vector of one head, and the max |Δ| of the attention input rebuilt from the parts."""
    names, parts, _ = residual_parts(tr, pos, before=layer)
    pre = tr.pre_attn[layer]
    if pre is not None:
        parts = pre.apply(parts, pos)
        if pre.bias is not None:
            names, parts = [*names, "norm_bias"], torch.cat([parts, pre.bias[None]])
    x_err = float((parts.sum(0) - tr.attn_in[layer][pos]).abs().max())
    proj = parts @ w.T  # (P, hs): this head's slice of the projection
    if b is not None:
        names, proj = [*names, "proj_bias"], torch.cat([proj, b[None]])
    if norm_w is not None:  # QK-norm: the RMS of the whole vector (this head's, or the projection's) frozen
        whole = tr.attn_in[layer][pos] @ full_w.T + (0 if full_b is None else full_b)  # (n*hs,)
        if spec.norm_scope == "head":
            whole = whole[slice_]
        inv = torch.rsqrt(whole.pow(2).mean() + spec.norm_eps)
        proj = proj * inv * (spec.norm_offset + norm_w)
    return names, _rotate_at(proj, spec, pos, len(tr.ids)), x_err


def qk_attribution(lm: LoadedModel, text: str, *, layer: int, head: int, query: int | str, key: int | str,
                   occurrence: int = 0, progress: bool = False) -> QKAttribution:
    """Split head `layer`.`head`'s score from `query` to `key` (token indices, or tokens of `text`) over
    the residual stream's parts on each side, with the pre-attention norm and QK-norm scales frozen at
    this run's values and rotary applied to each part. `progress`: a bar on stderr over the traced forward
    pass's layers.

    >>> from headscope.probe.tiny import tiny_model
    >>> r = qk_attribution(tiny_model("llama"), "The cat sat on the mat.", layer=1, head=2, query=5, key=2)
    >>> r.identity_abs_err < 1e-5
    True
    """
    from .explain import find_token
    from .scratch import project_qk, row_probs, temperature_scales, visible_keys

    layer, head = whole_number(layer, "layer", minimum=None), whole_number(head, "head", minimum=None)
    occurrence = whole_number(occurrence, "occurrence")
    family = family_for(lm.config)
    n_layers, nh = family.n_layers(lm.config), lm.config.num_attention_heads
    if not (0 <= layer < n_layers and 0 <= head < nh):
        raise ValueError(f"layer {layer}, head {head} out of range: {lm.name} has {n_layers} layers x {nh} heads")
    # every refusal before the forward pass: the head's kind, the tokens asked for
    _traceable(lm, text)
    spec = family.layer_spec(base_model(lm), layer, lm.config)
    if spec.position_scores is not None:
        raise UnsupportedFeature("content↔position scores (DeBERTa) are not bilinear in the two residual streams; "
                                 "QK attribution does not split them")
    if spec.latent is not None:
        raise UnsupportedFeature("multi-head latent attention (DeepSeek) reads keys through a normed low-rank latent; "
                                 "QK attribution does not split it yet — use headscope dla or ablation for this model")
    from .encoding import token_labels

    enc = encode(lm, text)
    labels = list(token_labels(lm, enc))
    i = find_token(labels, enc, query, occurrence)
    j = find_token(labels, enc, key, 0)
    if isinstance(key, str) and (same := [n for n, lab in enumerate(labels) if lab.strip().lower() == labels[j].strip().lower()
                                          and not enc.special[n]])[1:]:
        raise ValueError(f"the key {key!r} matches tokens {', '.join(map(str, same))} of {labels}: give the key as its index "
                         "(CLI: --key N)")
    if spec.causal and j > i:
        raise ValueError(f"key {labels[j]!r} (token {j}) comes after query {labels[i]!r} (token {i}): a decoder's "
                         "query never sees it")
    tr = trace(lm, text, progress=progress)
    hs, g = spec.head_dim, head // (spec.n_heads // spec.n_kv_heads)
    wq, wk = spec.wq.double().cpu(), spec.wk.double().cpu()
    bq = None if spec.bq is None else spec.bq.double().cpu()
    bk = None if spec.bk is None else spec.bk.double().cpu()
    qs, ks = slice(head * hs, (head + 1) * hs), slice(g * hs, (g + 1) * hs)
    qn = kn = None
    if spec.q_norm is not None:
        if spec.norm_scope == "head":
            qn, kn = spec.q_norm.double().cpu(), spec.k_norm.double().cpu()
        else:
            qn, kn = spec.q_norm.double().cpu()[qs], spec.k_norm.double().cpu()[ks]
    q_names, q_parts, q_err = _side(tr, spec, layer, i, wq[qs], None if bq is None else bq[qs], qn, wq, bq, qs)
    k_layer = layer if spec.kv_layer is None else spec.kv_layer  # shared KV (Gemma 4): keys of the producer's stream
    k_names, k_parts, k_err = _side(tr, spec, k_layer, j, wk[ks], None if bk is None else bk[ks], kn, wk, bk, ks)
    if spec.temperature is not None:  # Llama 4's NoPE layers: the query's temperature at its position, a constant
        q_parts = q_parts * float(temperature_scales(i + 1, *spec.temperature)[i])
    terms = spec.scale * (q_parts @ k_parts.T)  # (Pq, Pk)
    raw = float(terms.sum())
    extra: dict[str, float] = {}
    T = len(tr.ids)
    if spec.score_bias is not None:
        extra["position_bias"] = float(spec.score_bias(i + 1, T, query_start=i, key_start=0)[head, 0, j])
    if spec.softcap is not None:
        before = raw + extra.get("position_bias", 0.0)
        extra["softcap"] = spec.softcap * float(torch.tanh(torch.tensor(before / spec.softcap))) - before
    # the verified from-scratch attention on the model's own attention input, apart from the parts
    x = tr.attn_in[layer][None].float()  # (1, T, D)
    kv = None if spec.kv_layer is None else tr.attn_in[k_layer][None].float()  # (1, T, D) the producer's input
    q_all, k_all = project_qk(x, spec, kv=kv)  # (1, nh, T, hs), (1, nkv, T, hs)
    k_rep = k_all.repeat_interleave(spec.n_heads // spec.n_kv_heads, dim=1)
    valid = torch.ones(1, T, dtype=torch.long)
    scores, probs = row_probs(q_all[:, head : head + 1, i : i + 1], k_rep[:, head : head + 1], spec, valid,
                              query_start=i, heads=[head])  # (1, 1, 1, T)
    score = float(scores[0, 0, 0, j])
    total = raw + sum(extra.values())
    # the key's weight with one part removed from one side (frozen scales: the rest of the row unchanged)
    q_full, k_mat = q_parts.sum(0), k_rep[0, head].double()  # (hs,), (T, hs) rotated keys of every position
    row_scores_ = scores[0, 0, 0].double()  # (T,)
    visible = visible_keys(valid, causal=spec.causal, sliding_window=spec.sliding_window, local_window=spec.local_window,
                           chunk_size=spec.chunk_size, rows=(i, i + 1))[0, 0, 0]  # (T,) the keys query i sees
    rows = []

    def weight_of(new_row: torch.Tensor) -> float:
        return float(torch.softmax(new_row.masked_fill(~visible, float("-inf")), -1)[j])

    base_w = float(probs[0, 0, 0, j])
    for a, name in enumerate(q_names):  # the query loses part a: every key's score changes
        new = row_scores_ - spec.scale * (k_mat @ q_parts[a]) if spec.softcap is None else None
        if new is not None:
            rows.append(("query", name, weight_of(new)))
    for b, name in enumerate(k_names):  # key j loses part b: only its own score changes
        if spec.softcap is None:
            new = row_scores_.clone()
            new[j] = new[j] - spec.scale * float(q_full @ k_parts[b])
            rows.append(("key", name, weight_of(new)))
    without = pd.DataFrame(rows, columns=["side", "component", "weight"])
    without["change"] = without["weight"] - base_w
    return QKAttribution(model=lm.name, text=text, layer=layer, head=head, query=i, key=j, query_label=labels[i],
                         key_label=labels[j], score=score, weight=base_w,
                         terms=pd.DataFrame(terms.numpy(), index=q_names, columns=k_names), extra=extra,
                         identity_abs_err=abs(total - score), input_abs_err=max(q_err, k_err), weight_without=without)
