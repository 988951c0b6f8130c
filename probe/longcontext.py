"""Heads for long context, on the model: a per-head KV-cache plan applied in the model's own attention path,
needle prompts, greedy answers with each head's top-attended key, and each KV head streamed alone.

    kv_layout(lm)                  per layer: query and KV heads, head size, the layer's own window, planned or not
    stream_heads(lm, plan)         within the block, every streaming KV head of `plan` (`probe.kvplan.KVPlan`)
                                   sees only the first `sink` keys and the last `recent` keys (itself included):
                                   a forward pre-hook on each attention module replaces the 4-D mask it is called
                                   with by a per-head one, the streamed heads' other keys set to the dtype's
                                   minimum (transformers' own masked value) and every other entry left as the
                                   model made it. Grouped-query attention: a plan is per KV head (what a cache
                                   stores); each of its query heads streams. A list of plans: the batch is that
                                   many stacked copies and copy c runs plan c (one pass for many plans).
    needle_prompt(lm, needle, lines)  the haystack cut from `lines` to the needle's length, the needle at its
                                   depth, the question at the end; the needle's token range and where the
                                   question starts (`context`: the tokens before it)
    prefill(lm, ids)               the KV cache of a prompt's first tokens (`Prefix`), computed once; every run
                                   that continues it (`answer(..., prefix=)`) starts from a copy
    answer(lm, prompt, ...)        greedy generation with the KV cache; optionally each step's top-attended key
                                   of every head (Wu et al.'s copy-paste test, `retrieval_hits`); `copies` rows
                                   at once (one per plan of `stream_heads(lm, [plans])`), one answer each
    copy_steps(prompt, answer)     Wu et al.'s copy-paste test step by step: which steps copy a needle token and
                                   which heads' top keys hold it there (`retrieval_hits` is its sum)
    gate_heads(lm, gates, ...)     DuoAttention's training-time mixing: every planned layer's attention runs on two
                                   stacked copies of its input, one with the model's mask and one with every head
                                   streaming, and W_O reads α·full + (1 − α)·streaming per query head, α the gate of
                                   its KV head (`gates[layer, kv_head]`, a tensor that may require grad)
    optimise_gates(lm, examples, ...)  DuoAttention's gate optimisation: the gates (initialised at 1) trained with
                                   Adam to keep the last hidden states of passkey answers as the full model's (mean
                                   squared distance) under an L1 penalty on the gates, clamped to [0, 1] after each
                                   step; the model's weights frozen (only the gates get a gradient)
    stream_sensitivity(lm, ids, plan_shape, ...)  each KV head streamed alone: the mean KL divergence of the
                                   model's next-token distribution from the full model's, over the positions
                                   whose keys the window drops (or the last `queries` positions, the text
                                   before them run once by the full model and shared)

Keys are counted from the start of the sequence (right padding, as everywhere in headscope); a query's
position is the `position_ids` the model passes its attention (else the last of the keys). Hooks are removed
on exit, also after an error: the model is what it was.
"""

from __future__ import annotations

import copy
import inspect
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .encoding import encode, token_labels
from .errors import UnsupportedFeature
from .families import family_for
from .forward import attention_layers, base_model
from .generate import cache_argument, eos_ids
from .hooks import LayerModules, first_input, replace
from .kvplan import KVPlan, Needle
from .model import LoadedModel

__all__ = ["KVLayout", "kv_layout", "stream_heads", "gate_heads", "GateFit", "optimise_gates", "NeedlePrompt",
           "needle_prompt", "Prefix", "prefill", "Answer", "answer", "answers", "copy_steps", "retrieval_hits",
           "stream_sensitivity", "token_losses"]


@dataclass(frozen=True)
class KVLayout:
    """What a model's KV cache is made of, per layer."""

    model: str
    n_heads: int
    n_kv_heads: int
    head_dim: int
    bytes_per_value: int
    planned: tuple[bool, ...]  # False: a layer the model windows itself, or one without softmax attention
    own_window: tuple[int | None, ...]

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.planned), self.n_kv_heads

    @property
    def group(self) -> int:
        return self.n_heads // self.n_kv_heads


def kv_layout(lm: LoadedModel) -> KVLayout:
    """The model's KV layout; `UnsupportedFeature` for an encoder or layers of different head counts."""
    if not lm.is_causal:
        raise ValueError(f"a KV-cache plan needs a decoder; {lm.name} is an encoder")
    family = family_for(lm.config)
    base = base_model(lm)
    n_layers = lm.config.num_hidden_layers
    with_attention = set(attention_layers(lm))
    specs = {l: family.layer_spec(base, l, lm.config) for l in sorted(with_attention)}
    shapes = {(s.n_heads, s.n_kv_heads, s.head_dim) for s in specs.values()}
    if len(shapes) != 1:
        raise UnsupportedFeature(f"{lm.name}'s layers have different head counts or sizes ({sorted(shapes)}); "
                                 "a KV plan here needs one shape")
    nh, nkv, hd = shapes.pop()
    windows = tuple(specs[l].sliding_window if l in specs else None for l in range(n_layers))
    planned = tuple(l in specs and windows[l] is None and specs[l].local_window is None and specs[l].chunk_size is None
                    for l in range(n_layers))
    if not any(planned):
        raise UnsupportedFeature(f"{lm.name} has no layer with full attention to plan")
    size = next(lm.model.parameters()).element_size()
    return KVLayout(model=lm.name, n_heads=nh, n_kv_heads=nkv, head_dim=hd, bytes_per_value=size, planned=planned,
                    own_window=windows)


def _check_plan(layout: KVLayout, plan: KVPlan) -> None:
    if plan.full.shape != layout.shape:
        raise ValueError(f"the plan is {plan.full.shape} (layers × KV heads); {layout.model} has {layout.shape}")
    wrong = [l for l in range(len(layout.planned)) if not layout.planned[l] and not plan.full[l].all()]
    if wrong:
        raise ValueError(f"layers {wrong} of {layout.model} are not planned (the model windows them itself, or they "
                         "have no attention); their heads must stay as the model runs them")


def _mask_of(lm: LoadedModel, kwargs: dict) -> torch.Tensor:
    mask = kwargs.get("attention_mask")
    if not isinstance(mask, torch.Tensor) or mask.dim() != 4:
        raise UnsupportedFeature(f"{lm.name}'s attention was not called with a 4-D mask (attn_implementation "
                                 f"{lm.config._attn_implementation!r}); streaming heads need the eager path")
    return mask


def _streamed(mask: torch.Tensor, kwargs: dict, heads: torch.Tensor, sink: torch.Tensor,
              recent: torch.Tensor) -> torch.Tensor:
    """The attention's 4-D mask with the keys outside row b's first `sink[b]` and last `recent[b]` set to the
    dtype's minimum for the query heads `heads[b]` (bool, (B, n_heads)); every other entry the model's own."""
    B, Tq, K = heads.shape[0], mask.shape[-2], mask.shape[-1]
    pos = kwargs.get("position_ids")
    q = (pos.to("cpu") if isinstance(pos, torch.Tensor) else torch.arange(K - Tq, K)[None]).reshape(-1, Tq)
    q = q.expand(B, Tq) if q.shape[0] == 1 else q  # (B, Tq) absolute query positions
    j = torch.arange(K)
    drop = ~((j[None, None] < sink[:, None, None]) | (j[None, None] > q[..., None] - recent[:, None, None]))
    hit = drop[:, None] & heads[:, :, None, None]  # (B, nh, Tq, K)
    low = torch.tensor(torch.finfo(mask.dtype).min, dtype=mask.dtype, device=mask.device)
    return torch.where(hit.to(mask.device), low, mask)


@contextmanager
def stream_heads(lm: LoadedModel, plan: KVPlan | Sequence[KVPlan]) -> Iterator[None]:
    """Within the block the plan's streaming KV heads see only their sink and recent keys (see the module).

    >>> from headscope.probe.tiny import tiny_model
    >>> lm = tiny_model("llama"); ids = torch.tensor([[1, 5, 6, 7, 8, 9, 10, 11]])
    >>> plan = KVPlan(np.array([[True, True], [False, True]]), sink=1, recent=2)
    >>> with torch.no_grad():
    ...     clean = lm.model(ids).logits
    ...     with stream_heads(lm, plan):
    ...         hit = lm.model(ids).logits
    ...     again = lm.model(ids).logits
    >>> bool((hit[0, :3] == clean[0, :3]).all()), bool((hit[0, 3:] != clean[0, 3:]).any()), torch.equal(again, clean)
    (True, True, True)
    """
    plans = [plan] if isinstance(plan, KVPlan) else list(plan)
    if not plans:
        raise ValueError("stream_heads needs at least one plan")
    layout = kv_layout(lm)
    for p in plans:
        _check_plan(layout, p)
    streamed = np.stack([~p.full for p in plans])  # (copies, layer, kv_head)
    layers = [l for l in range(len(layout.planned)) if streamed[:, l].any()]
    family = family_for(lm.config)
    base = base_model(lm)
    sinks = torch.tensor([p.sink for p in plans])
    recents = torch.tensor([p.recent for p in plans])

    # (copies, n_heads) per layer: query head h streams when its KV head does
    heads = {layer: torch.from_numpy(np.repeat(streamed[:, layer], layout.group, axis=1)) for layer in layers}

    def stream(layer, call):
        args, kwargs = call
        mask = _mask_of(lm, kwargs)
        B = first_input(args, kwargs).shape[0]
        copies = len(plans)
        if B % copies:
            raise ValueError(f"a batch of {B} rows is not {copies} stacked copies")
        rows = B // copies
        return args, {**kwargs, "attention_mask": _streamed(mask, kwargs, heads[layer].repeat_interleave(rows, 0),
                                                            sinks.repeat_interleave(rows),
                                                            recents.repeat_interleave(rows))}

    with replace(LayerModules(family, base, lm.config, layers, "attention"), stream, what="arguments"):
        yield


def _two_copies(value, batch: int, heads: int):
    """A batch-shaped keyword argument of the attention as two stacked copies: a tensor whose first dimension is
    the batch (rotary cos / sin, position ids) or the batch × heads, batch outer (Bloom's ALiBi biases), or a
    tuple of them; anything else as it is."""
    if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[0] in (batch, batch * heads):
        return torch.cat([value, value])
    if isinstance(value, tuple) and value and all(isinstance(v, torch.Tensor) for v in value):
        return tuple(_two_copies(v, batch, heads) for v in value)
    return value


@contextmanager
def gate_heads(lm: LoadedModel, gates: torch.Tensor, *, sink: int, recent: int) -> Iterator[None]:
    """Within the block every planned layer mixes full and streaming attention per KV head (see the module).

    The attention module of each planned layer is called once on two stacked copies of its input: copy 0 with
    the model's own mask, copy 1 with every head's keys cut to the first `sink` and last `recent` (the mask
    `stream_heads` applies); a pre-hook on W_O then writes α·copy 0 + (1 − α)·copy 1 per query head, α the
    gate of the KV head it reads, so the layer returns one batch (a residual passed in after the hidden states,
    Bloom's, is added to that one batch as it is). `gates` [layer, KV head] (float; entries of a
    layer not planned are not read). No KV cache: call the model with `use_cache=False`.

    >>> from headscope.probe.tiny import tiny_model
    >>> lm = tiny_model("llama"); ids = torch.tensor([[1, 5, 6, 7, 8, 9, 10, 11]])
    >>> with torch.no_grad():
    ...     clean = lm.model(ids, use_cache=False).logits
    ...     with gate_heads(lm, torch.ones(2, 2), sink=1, recent=2):
    ...         ones = lm.model(ids, use_cache=False).logits
    ...     with gate_heads(lm, torch.tensor([[1.0, 1.0], [0.5, 1.0]]), sink=1, recent=2):
    ...         half = lm.model(ids, use_cache=False).logits
    >>> torch.equal(ones, clean), bool((half[0, 3:] != clean[0, 3:]).any())
    (True, True)
    """
    layout = kv_layout(lm)
    if not isinstance(gates, torch.Tensor) or tuple(gates.shape) != layout.shape:
        shape = tuple(gates.shape) if isinstance(gates, torch.Tensor) else type(gates).__name__
        raise ValueError(f"gates are a tensor [layer, KV head] of {layout.shape} for {lm.name}; got {shape}")
    if sink < 0 or recent < 1:
        raise ValueError(f"a streaming head keeps sink >= 0 and recent >= 1 keys; got sink {sink}, recent {recent}")
    layers = [l for l, p in enumerate(layout.planned) if p]
    family, base = family_for(lm.config), base_model(lm)
    widths = {l: family.layer_spec(base, l, lm.config).value_head_dim for l in layers}
    nh = layout.n_heads

    def both_masks(layer, call):
        args, kwargs = call
        if any(kwargs.get(k) is not None for k in ("cache", "past_key_values", "past_key_value", "layer_past")):
            raise ValueError("gated attention runs without a KV cache: call the model with use_cache=False")
        mask = _mask_of(lm, kwargs)
        x = first_input(args, kwargs)
        B = x.shape[0]
        every = torch.ones(B, nh, dtype=torch.bool)
        streamed = _streamed(mask, kwargs, every, torch.full((B,), sink), torch.full((B,), recent))
        full = mask.expand(B, nh, *mask.shape[-2:])
        kwargs = {k: _two_copies(v, B, nh) for k, v in kwargs.items()}
        kwargs["attention_mask"] = torch.cat([full, streamed])  # copy 0 full, copy 1 streaming
        if args:
            return (torch.cat([x, x]), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": torch.cat([x, x])}

    def mix(layer, y):  # W_O's input (2B, T, nh · d_v): α·full + (1 − α)·streaming per query head
        B = y.shape[0] // 2
        if y.shape[-1] != nh * widths[layer] or 2 * B != y.shape[0]:
            raise RuntimeError(f"layer {layer}'s W_O was called with {tuple(y.shape)}, not two stacked copies of "
                               f"{nh} heads × {widths[layer]}")
        a = gates[layer].to(y.device, y.dtype).repeat_interleave(layout.group * widths[layer])
        return a * y[:B] + (1 - a) * y[B:]

    with (replace(LayerModules(family, base, lm.config, tuple(layers), "attention"), both_masks, what="arguments"),
          replace(LayerModules(family, base, lm.config, tuple(layers), "out_proj"), mix, what="input")):
        yield


@dataclass(frozen=True, eq=False)
class GateFit:
    """Learned gates [layer, KV head] (NaN where a layer is not planned; high: keep the full cache), per step the
    loss and its distillation part, and the recipe (steps, tokens, λ, ...)."""

    gates: np.ndarray
    losses: tuple[float, ...]
    distill: tuple[float, ...]
    settings: dict = field(default_factory=dict)


def optimise_gates(lm: LoadedModel, examples: Sequence[tuple[Sequence[int], int]], *, sink: int, recent: int,
                   steps: int = 30, lr: float = 0.1, l1: float = 0.05, seed: int = 0,
                   progress: Callable[[int], None] | None = None) -> GateFit:
    """DuoAttention's gate optimisation (Xiao et al. 2024) on `examples`: (token ids, `answer`) pairs, a passkey
    prompt followed by its answer's tokens from position `answer` on. Per step one example (a seeded order,
    every example once per round): the full model's last hidden states at the positions that predict the answer
    (answer − 1 … end − 1) are the target (computed once per example); under `gate_heads` the loss is their
    mean squared distance (mean over the hidden size, then over positions: DuoAttention's distillation) plus
    `l1` × the mean gate over planned KV heads (its L1 term, λ = 0.05 there). Adam (`lr`; DuoAttention's default
    0.1), gates initialised at 1 and clamped to [0, 1] after each step. Only the gates get a gradient
    (`torch.autograd.grad`): the model's weights and their `.grad` are never touched."""
    layout = kv_layout(lm)
    if not examples:
        raise ValueError("gate optimisation needs at least one passkey example")
    for ids, ans in examples:
        if not 1 <= ans < len(ids):
            raise ValueError(f"an example's answer starts at {ans}: it must lie in 1 .. {len(ids) - 1} (its ids "
                             "hold the prompt and then the answer)")
    if int(steps) != steps or steps < 1:
        raise ValueError(f"steps is a whole number >= 1, got {steps}")
    if not lr > 0 or not l1 >= 0:
        raise ValueError(f"the learning rate is > 0 and the L1 weight >= 0; got lr {lr}, l1 {l1}")
    base = base_model(lm)
    planned = torch.tensor(layout.planned, device=lm.device)
    gates = torch.ones(layout.shape, dtype=torch.float32, device=lm.device, requires_grad=True)
    opt = torch.optim.Adam([gates], lr=lr)
    rng = np.random.default_rng(seed)
    order = np.concatenate([rng.permutation(len(examples)) for _ in range(-(-int(steps) // len(examples)))])
    targets: dict[int, torch.Tensor] = {}
    losses, distills, tokens = [], [], 0

    def hidden(x: torch.Tensor, first: int) -> torch.Tensor:
        return base(input_ids=x, use_cache=False).last_hidden_state[0, first - 1 : -1].float()

    for step in range(int(steps)):
        i = int(order[step])
        ids, ans = examples[i]
        x = torch.tensor([list(ids)], device=lm.device)
        if i not in targets:
            with torch.no_grad():
                targets[i] = hidden(x, ans)
        with torch.enable_grad(), gate_heads(lm, gates, sink=sink, recent=recent):
            distill = (hidden(x, ans) - targets[i]).pow(2).mean(-1).mean()
            loss = distill + l1 * gates[planned].mean()
            (grad,) = torch.autograd.grad(loss, gates)
        gates.grad = grad
        opt.step()
        opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            gates.clamp_(0, 1)
        losses.append(float(loss.detach()))
        distills.append(float(distill.detach()))
        tokens += len(ids)
        if progress is not None:
            progress(1)
    out = gates.detach().cpu().numpy().astype(float)
    out[~np.array(layout.planned)] = np.nan
    settings = {"steps": int(steps), "lr": float(lr), "l1": float(l1), "seed": int(seed), "sink": int(sink),
                "recent": int(recent), "examples": len(examples), "tokens": int(tokens),
                "tokens_per_step": tokens / int(steps), "optimiser": "Adam", "init": 1.0,
                "loss": "mean squared distance of the last hidden states at the answer's positions + l1 × mean gate"}
    return GateFit(gates=out, losses=tuple(losses), distill=tuple(distills), settings=settings)


@dataclass(frozen=True)
class NeedlePrompt:
    """A needle's prompt as token ids, the needle sentence's token range [start, stop), the key's text,
    `context`, the tokens before the question (the haystack with the needle), and each token's display label."""

    needle: Needle
    ids: tuple[int, ...]
    span: tuple[int, int]
    key: str
    context: int
    labels: tuple[str, ...] = ()

    @property
    def n_tokens(self) -> int:
        return len(self.ids)


def needle_prompt(lm: LoadedModel, needle: Needle, lines: Sequence[str]) -> NeedlePrompt:
    """The haystack from line `needle.offset` of `lines` on (cycled) until the prompt reaches `needle.length`
    tokens, the needle between lines at `needle.depth`, then the question."""
    if not lines:
        raise ValueError("the haystack needs at least one line of text")
    if needle.length > lm.max_length:
        raise ValueError(f"a needle prompt of {needle.length} tokens passes {lm.name}'s limit of {lm.max_length}")
    tok = lm.tokenizer
    lengths = [len(tok(line, add_special_tokens=False)["input_ids"]) + 1 for line in lines]
    fixed = len(tok(needle.statement + "\n" + needle.question, add_special_tokens=False)["input_ids"]) + 4
    if fixed >= needle.length:
        raise ValueError(f"a needle and its question take {fixed} tokens; ask for a length above that")
    chosen, total, i = [], fixed, needle.offset % len(lines)
    while total < needle.length:
        room = needle.length - total
        if lengths[i] > room:  # the last line, cut to the tokens left (a first line longer than the whole prompt too)
            cut = tok.decode(tok(lines[i], add_special_tokens=False)["input_ids"][:room - 1]).strip()
            if cut or not chosen:
                chosen.append(cut)
            break
        chosen.append(lines[i])
        total += lengths[i]
        i = (i + 1) % len(lines)
    at = int(round(needle.depth * len(chosen)))
    before, after = " ".join(chosen[:at]), " ".join(chosen[at:])
    start = len(before) + (1 if before else 0)
    text = (before + " " if before else "") + needle.statement
    stop = len(text)
    text += (" " + after if after else "") + "\n"
    asked = len(text)
    text += needle.question
    enc = encode(lm, text)
    inside = [t for t, (a, b) in enumerate(enc.spans) if b > a and a < stop and b > start]
    if not inside:
        raise RuntimeError("the needle's tokens were not found in its prompt")
    # the question's first token: the first whose text starts at or after it (the newline may join either side)
    context = next((t for t, (a, b) in enumerate(enc.spans) if b > a and a >= asked), len(enc.ids) - 1)
    context = max(inside[-1] + 1, min(context, len(enc.ids) - 1))
    return NeedlePrompt(needle=needle, ids=enc.ids, span=(inside[0], inside[-1] + 1), key=needle.key, context=context,
                        labels=token_labels(lm, enc))


@dataclass(frozen=True, eq=False)
class Answer:
    """A greedy answer: its token ids and text, and per step the position of each head's top-attended key
    (`[step, layer, head]`, -1 for a layer without attention), when asked for."""

    ids: tuple[int, ...]
    text: str
    top_keys: np.ndarray | None

    def retrieved(self, key: str) -> bool:
        return key in self.text.replace(" ", "")


@dataclass(frozen=True, eq=False)
class Prefix:
    """The KV cache after a prompt's first tokens `ids`, as the model (and any hooks active at `prefill`) made it.
    Runs that continue it each start from a copy: the prefix is never changed."""

    ids: tuple[int, ...]
    cache: object

    def copy(self, copies: int = 1):
        cache = copy.deepcopy(self.cache)
        if copies > 1:
            for layer in getattr(cache, "layers", ()):
                layer.batch_repeat_interleave(copies)
        return cache


def _last(lm: LoadedModel) -> dict:
    # the prefill's logits are never read: where the model can, it computes only the last one
    return {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(lm.model.forward).parameters else {}


def _cache(out):
    return out["cache"] if "cache" in out else out.past_key_values


@torch.inference_mode()
def prefill(lm: LoadedModel, ids: Sequence[int]) -> Prefix:
    """One forward over `ids` with the KV cache kept (hooks active around the call apply, as to any forward).

    >>> from headscope.probe.tiny import tiny_model
    >>> lm = tiny_model("llama"); ids = [1, 5, 6, 7, 8, 9, 10, 11]
    >>> answer(lm, ids, max_new_tokens=3, prefix=prefill(lm, ids[:5])).ids == answer(lm, ids, max_new_tokens=3).ids
    True
    """
    ids = tuple(int(i) for i in ids)
    if not ids:
        raise ValueError("a prefix needs at least one token")
    out = lm.model(input_ids=torch.tensor([ids], device=lm.device), use_cache=True, **_last(lm))
    return Prefix(ids=ids, cache=_cache(out))


def answer(lm: LoadedModel, ids: Sequence[int], *, max_new_tokens: int, top_keys: bool = False,
           prefix: Prefix | None = None) -> Answer:
    """Greedy generation after `ids` with the KV cache. The prompt's last token is fed as the first decoding
    step, so that with `top_keys` every step that picks a token has one attention row per head (1 query), the
    cost of one generation; hooks active around the call (ablation, streaming) apply to every step. `prefix`:
    the cache of the prompt's first tokens (`prefill`), continued from a copy; the rest of the prompt is one
    chunk (hooks apply to it, not to the prefix)."""
    return answers(lm, ids, max_new_tokens=max_new_tokens, top_keys=top_keys, prefix=prefix)[0]


@torch.inference_mode()
def answers(lm: LoadedModel, ids: Sequence[int], *, max_new_tokens: int, copies: int = 1, top_keys: bool = False,
            prefix: Prefix | None = None) -> list[Answer]:
    """`answer` for `copies` stacked rows of the same prompt, decoded together (each row its own greedy tokens):
    under `stream_heads(lm, plans)` with `copies = len(plans)` row c answers under plan c."""
    ids = [int(i) for i in ids]
    if len(ids) < 2:
        raise ValueError("a prompt needs at least 2 tokens")
    if len(ids) + max_new_tokens > lm.max_length:
        raise ValueError(f"the prompt has {len(ids)} tokens; with {max_new_tokens} new ones that passes "
                         f"{lm.name}'s limit of {lm.max_length}")
    device, arg = lm.device, cache_argument(lm.model)
    if prefix is None:
        cache, chunk = None, ids[:-1]
    else:
        n = len(prefix.ids)
        if n >= len(ids) or tuple(ids[:n]) != prefix.ids:
            raise ValueError("the prefix is not the start of the prompt (with at least its last token left)")
        cache, chunk = prefix.copy(copies), ids[n:-1]
    if chunk:
        kw = {arg: cache} if cache is not None else {}
        out = lm.model(input_ids=torch.tensor([chunk] * copies, device=device), use_cache=True, **kw, **_last(lm))
        cache = _cache(out)
    eos = eos_ids(lm)
    n_layers = lm.config.num_hidden_layers
    feed = torch.full((copies, 1), ids[-1], device=device)
    made, rows = [], []
    for step in range(max_new_tokens):
        out = lm.model(input_ids=feed, **{arg: cache}, use_cache=True, output_attentions=top_keys)
        cache = _cache(out)
        if top_keys:
            n_keys = len(ids) + step
            row = np.full((copies, n_layers, lm.config.num_attention_heads), -1, dtype=np.int64)
            for layer, a in enumerate(out.attentions):
                if a is not None:  # (copies, nh, 1, keys in the cache): a windowed layer's keys end at the last one
                    row[:, layer] = a[:, :, -1].float().argmax(-1).cpu().numpy() + n_keys - a.shape[-1]
            rows.append(row)
        feed = out.logits[:, -1].argmax(-1, keepdim=True)
        made.append(feed[:, 0].tolist())
        if all(any(m[c] in eos for m in made) for c in range(copies)):
            break
    result = []
    for c in range(copies):
        toks = [m[c] for m in made]
        end = next((i + 1 for i, t in enumerate(toks) if t in eos), len(toks))
        toks = toks[:end]
        result.append(Answer(ids=tuple(toks), text=lm.tokenizer.decode(toks, skip_special_tokens=True),
                             top_keys=np.stack([r[c] for r in rows])[:end] if top_keys else None))
    return result


def copy_steps(prompt: NeedlePrompt, ans: Answer) -> tuple[np.ndarray, np.ndarray]:
    """Wu et al.'s copy-paste test per step of one answer: ([step] copied, [step, layer, head] hit). A step copies
    when its token occurs in the needle; a head hits at a copy step when its top key is in the needle and holds
    that token (never at a step that copies nothing)."""
    if ans.top_keys is None:
        raise ValueError("the answer was generated without top_keys=True")
    start, stop = prompt.span
    needle = set(prompt.ids[start:stop])
    full = np.array(prompt.ids + ans.ids)
    copied = np.array([w in needle for w in ans.ids], dtype=bool)
    hit = np.zeros(ans.top_keys.shape, dtype=bool)
    for step in np.flatnonzero(copied):
        top = ans.top_keys[step]
        hit[step] = (top >= start) & (top < stop) & (full[np.clip(top, 0, len(full) - 1)] == ans.ids[step])
    return copied, hit


def retrieval_hits(prompt: NeedlePrompt, ans: Answer) -> tuple[np.ndarray, int]:
    """Wu et al.'s copy-paste counts for one answer: ([layer, head] hits, copy steps), `copy_steps` summed."""
    copied, hit = copy_steps(prompt, ans)
    return hit.sum(0, dtype=np.int64), int(copied.sum())


@torch.inference_mode()
def token_losses(lm: LoadedModel, ids: Sequence[int], plan: KVPlan | None = None, *,
                 prefix: Prefix | None = None) -> torch.Tensor:
    """Next-token loss (nats) at positions 1..T-1 of one sequence, under `plan` (None: the model as it is).
    `prefix`: the cache of the first n tokens (`prefill`), continued from a copy; the plan applies to the rest
    only and the losses are those of tokens n+1 .. T-1."""
    ids = [int(i) for i in ids]
    n = 0 if prefix is None else len(prefix.ids)
    if prefix is not None and (n >= len(ids) - 1 or tuple(ids[:n]) != prefix.ids):
        raise ValueError("the prefix is not the start of the text (with at least 2 tokens left)")
    x = torch.tensor([ids[n:]], device=lm.device)
    kw = {} if prefix is None else {cache_argument(lm.model): prefix.copy(), "use_cache": True}
    with stream_heads(lm, plan) if plan is not None else nullcontext():
        logits = lm.model(input_ids=x, **({"use_cache": False} | kw)).logits
    return F.cross_entropy(logits[0, :-1].float(), x[0, 1:], reduction="none").double().cpu()


@torch.inference_mode()
def stream_sensitivity(lm: LoadedModel, ids: Sequence[int], *, sink: int, recent: int, copies: int = 4,
                       queries: int | None = None, progress=None) -> np.ndarray:
    """[layer, KV head]: with that KV head alone streaming, the mean KL(full ‖ streamed) of the next-token
    distribution over the positions past `sink + recent` (where the window drops keys); NaN for a layer not
    planned. `copies` heads run in one batch of stacked copies. `queries`: only the last `queries` positions are
    run per head, the text before them once by the full model (`prefill`, its cache shared): the same numbers
    for those positions at a fraction of the cost."""
    layout = kv_layout(lm)
    T = len(ids)
    if T <= sink + recent + 1:
        raise ValueError(f"the text has {T} tokens; streaming with sink {sink} and recent {recent} drops no key "
                         f"before {sink + recent + 1}: give a longer text")
    if queries is not None and not 1 <= queries <= T - (sink + recent):
        raise ValueError(f"queries is the number of last positions scored, 1 to {T - sink - recent} here "
                         f"(the text has {T} tokens, sink + recent {sink + recent}); got {queries}")
    start = sink + recent if queries is None else T - queries
    prefix = prefill(lm, ids[:start]) if queries is not None else None
    x = torch.tensor([list(ids) if prefix is None else list(ids[start:])], device=lm.device)
    arg = cache_argument(lm.model)

    def run(n: int) -> torch.Tensor:
        kw = {} if prefix is None else {arg: prefix.copy(n)}
        logits = lm.model(input_ids=x.repeat(n, 1), use_cache=prefix is not None, **kw).logits
        return logits[:, start:] if prefix is None else logits

    full = F.log_softmax(run(1)[0].float(), -1)
    cells = [(l, h) for l in range(layout.shape[0]) if layout.planned[l] for h in range(layout.shape[1])]
    out = np.full(layout.shape, np.nan)
    for first in range(0, len(cells), copies):
        chunk = cells[first : first + copies]
        plans = []
        for c in chunk:
            f = np.ones(layout.shape, bool)
            f[c] = False
            plans.append(KVPlan(f, sink, recent, planned=np.array(layout.planned), own_window=layout.own_window))
        with stream_heads(lm, plans):
            logits = run(len(chunk))
        for i, c in enumerate(chunk):
            streamed = F.log_softmax(logits[i].float(), -1)
            out[c] = float((full.exp() * (full - streamed)).sum(-1).mean())
        if progress is not None:
            progress(len(chunk))
    return out
