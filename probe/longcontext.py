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
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .encoding import encode
from .errors import UnsupportedFeature
from .families import family_for
from .forward import attention_layers, base_model
from .generate import cache_argument, eos_ids
from .hooks import LayerModules, first_input, replace
from .kvplan import KVPlan, Needle
from .model import LoadedModel

__all__ = ["KVLayout", "kv_layout", "stream_heads", "NeedlePrompt", "needle_prompt", "Prefix", "prefill", "Answer",
           "answer", "answers", "retrieval_hits", "stream_sensitivity", "token_losses"]


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
        mask = kwargs.get("attention_mask")
        if not isinstance(mask, torch.Tensor) or mask.dim() != 4:
            raise UnsupportedFeature(f"{lm.name}'s attention was not called with a 4-D mask (attn_implementation "
                                     f"{lm.config._attn_implementation!r}); streaming heads need the eager path")
        x = first_input(args, kwargs)
        B, Tq, K = x.shape[0], mask.shape[-2], mask.shape[-1]
        copies = len(plans)
        if B % copies:
            raise ValueError(f"a batch of {B} rows is not {copies} stacked copies")
        rows = B // copies
        pos = kwargs.get("position_ids")
        q = (pos.to("cpu") if isinstance(pos, torch.Tensor) else torch.arange(K - Tq, K)[None]).reshape(-1, Tq)
        q = q.expand(B, Tq) if q.shape[0] == 1 else q  # (B, Tq) absolute query positions
        j = torch.arange(K)
        sink = sinks.repeat_interleave(rows)[:, None, None]
        recent = recents.repeat_interleave(rows)[:, None, None]
        drop = ~((j[None, None] < sink) | (j[None, None] > q[..., None] - recent))  # (B, Tq, K)
        hit = drop[:, None] & heads[layer].repeat_interleave(rows, 0)[:, :, None, None]  # (B, nh, Tq, K)
        low = torch.tensor(torch.finfo(mask.dtype).min, dtype=mask.dtype, device=mask.device)
        return args, {**kwargs, "attention_mask": torch.where(hit.to(mask.device), low, mask)}

    with replace(LayerModules(family, base, lm.config, layers, "attention"), stream, what="arguments"):
        yield


@dataclass(frozen=True)
class NeedlePrompt:
    """A needle's prompt as token ids, the needle sentence's token range [start, stop), the key's text and
    `context`, the tokens before the question (the haystack with the needle)."""

    needle: Needle
    ids: tuple[int, ...]
    span: tuple[int, int]
    key: str
    context: int

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
    return NeedlePrompt(needle=needle, ids=enc.ids, span=(inside[0], inside[-1] + 1), key=needle.key, context=context)


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


def retrieval_hits(prompt: NeedlePrompt, ans: Answer) -> tuple[np.ndarray, int]:
    """Wu et al.'s copy-paste counts for one answer: ([layer, head] hits, copy steps). A step copies when its
    token occurs in the needle; a head hits when its top key is in the needle and holds that token."""
    if ans.top_keys is None:
        raise ValueError("the answer was generated without top_keys=True")
    start, stop = prompt.span
    needle = set(prompt.ids[start:stop])
    full = np.array(prompt.ids + ans.ids)
    hits = np.zeros(ans.top_keys.shape[1:], dtype=np.int64)
    copies = 0
    for step, w in enumerate(ans.ids):
        if w not in needle:
            continue
        copies += 1
        top = ans.top_keys[step]
        inside = (top >= start) & (top < stop)
        hits += inside & (full[np.clip(top, 0, len(full) - 1)] == w)
    return hits, copies


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
