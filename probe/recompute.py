"""Recompute-mode extraction: attention of long texts, one block of query rows at a time.

Eager attention with `output_attentions=True` keeps `heads × T²` floats for every layer (a
6,000-token text on SmolLM2 asks for about 39 GB). Here the model runs with its fast attention
(SDPA, which never materialises the probabilities), forward pre-hooks catch each chosen layer's
input `x` (and forward hooks the outputs of its q and k projections, where those are the plain
`nn.Linear` modules the layer spec reads: the model has made them, they are not made again), and the
verified from-scratch attention (`probe.scratch`) recomputes that layer's probabilities — only the
requested heads, in blocks of query rows:

    x (T, D) ──project_qk──> q (H, T, hs), k (H, T, hs)        requested heads only (norms, rotary)
    for each block of R rows:  probs = softmax(q[rows] kᵀ · scale + mask)   (H, R, T)
                               yield Block(layer, heads, query_start, probs)

No `[layer, head, T, T]` tensor for all layers ever exists: the extra memory is one block, its row
count chosen from a byte budget (`block_rows`), plus the caught inputs (layers × T × D). Consumers
(`analyses.blocks`) reduce each block as it comes.

Which texts are recomputed, and the maps, streams and checks built from these blocks, is the
business of the attention sources (`probe.sources`): every recomputed text is trusted only after
`check_prefix` compares the recomputation with the model's own eager attention on a short prefix.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from dataclasses import dataclass, replace
from typing import Iterator, Sequence

import torch

from .blocks import Block, Buffers
from .encoding import Encoded, check_texts, encode, pad_batch
from .families import Family, family_for
from .forward import attention_layers, base_model
from .hooks import LayerModules, watch
from .maps import select_heads, select_layers
from .model import LoadedModel
from .scratch import block_probs, project_qk
from .verify import tolerances

__all__ = [
    "PrefixCheck", "DEFAULT_BUDGET", "PREFIX_TOKENS",
    "block_rows", "fast_attention", "iter_blocks", "iter_blocks_encoded", "check_prefix", "layer_inputs",
    "streamed_inputs", "layer_blocks",
]

DEFAULT_BUDGET = 256 * 2**20  # bytes for one block and its working copies
PREFIX_TOKENS = 256  # tokens of the eager check in recompute mode
# One block is alive in up to this many copies at once: the scores buffer that `scratch.block_probs`
# turns into probabilities in place, the block handed out (zero outside the keys the rows can see),
# and what a consumer makes of it (`analyses.blocks`: word sums, entropy terms, ...).
_WORKING_COPIES = 5


@dataclass(frozen=True)
class PrefixCheck:
    """The recomputation checked against the model's own eager attention on a text's first tokens."""

    n_tokens: int
    max_abs_err: float
    tolerance: float
    dtype: str

    @property
    def passed(self) -> bool:
        return self.max_abs_err <= self.tolerance

    def summary(self) -> str:
        """One line for results and reports.

        >>> PrefixCheck(256, 2e-7, 1e-5, "float32").summary()
        'recomputed attention checked against eager attention on the first 256 tokens: max |Δ| = 2.0e-07 (tolerance 1e-05, float32)'
        """
        verdict = "checked against" if self.passed else "DISAGREES with"
        return (f"recomputed attention {verdict} eager attention on the first {self.n_tokens} tokens: "
                f"max |Δ| = {self.max_abs_err:.1e} (tolerance {self.tolerance:g}, {self.dtype})")

    def to_dict(self) -> dict:
        return {"n_tokens": self.n_tokens, "max_abs_err": self.max_abs_err, "tolerance": self.tolerance,
                "dtype": self.dtype, "passed": self.passed, "summary": self.summary()}


def block_rows(n_keys: int, n_heads: int, budget: int, itemsize: int = 4) -> int:
    """Query rows per block so that a block and its working copies fit in `budget` bytes (at least 1).

    >>> block_rows(1000, 4, 4 * 1000 * 4 * 5 * 10)
    10
    """
    per_row = n_heads * n_keys * itemsize * _WORKING_COPIES
    return max(1, int(budget) // per_row)


@contextlib.contextmanager
def fast_attention(model: torch.nn.Module, implementation: str = "sdpa") -> Iterator[str]:
    """Run `model` with another attention implementation inside the block; restore the old one after.

    Yields the implementation in force (the old one when the model class cannot switch).
    """
    before = model.config._attn_implementation
    if implementation == before:
        yield before
        return
    try:
        model.set_attn_implementation(implementation)
    except ValueError:  # the class has no such kernel (Gemma 2's softcap has no SDPA): keep the one it has
        yield before
        return
    try:
        yield model.config._attn_implementation
    finally:
        model.set_attn_implementation(before)


class _Enough(Exception):
    """Raised by the last wanted layer's hook: the layers after it need not run."""


def layer_inputs(lm: LoadedModel, family: Family, items: Sequence[Encoded], layers: Sequence[int],
                  implementation: str = "sdpa") -> dict[int, torch.Tensor]:
    """Each wanted layer's attention input (B, T, D), from one forward pass with fast attention (all of them
    kept at once: a caller that reads layer after layer streams them with `_streamed_inputs`)."""
    return dict(_streamed_inputs(lm, family, items, layers, implementation))


def streamed_inputs(lm: LoadedModel, family: Family, items: Sequence[Encoded], layers: Sequence[int],
                    implementation: str = "sdpa") -> Iterator[tuple[int, torch.Tensor]]:
    """Each wanted layer's attention input (B, T, D) in forward order, one layer at a time: the forward pass
    waits in the hook of the layer it handed out until the next is asked for, and stops after the last
    wanted layer; closing the iterator ends it there (the layers after it never run)."""
    return _streamed_inputs(lm, family, items, layers, implementation)


def _streamed_inputs(lm: LoadedModel, family: Family, items: Sequence[Encoded], layers: Sequence[int],
                     implementation: str) -> Iterator[tuple[int, torch.Tensor]]:
    """`(layer, its attention input (B, T, D))` in forward order, one layer at a time (`_streamed`)."""
    for layer, x, _ in _streamed(lm, family, items, layers, implementation, {}):
        yield layer, x


def layer_blocks(x: torch.Tensor, spec, layer: int, heads: Sequence[int], budget: int,
                  kv: torch.Tensor | None = None, rows: tuple[int, int] | None = None,
                  buffers: Buffers | None = None,
                  projected: tuple[torch.Tensor, torch.Tensor] | None = None) -> Iterator[Block]:
    """Blocks of one layer for one text's input `x` (T, D), real tokens only; `kv` (T, D) the input the keys
    come from where it is another layer's (shared KV); `rows`: only queries start .. stop - 1 (a viewer's
    zoom), every query by default; `buffers`: where the blocks' probabilities are written; `projected`: `x`'s
    q and k projections (T, nh*hs), (T, nkv*hs) as the model made them in its forward (not made again)."""
    T = x.shape[0]
    first, last = (0, T) if rows is None else rows
    q, k = project_qk(x[None], spec, kv=None if kv is None else kv[None],
                      projected=None if projected is None else (projected[0][None], projected[1][None]))
    group = spec.n_heads // spec.n_kv_heads  # grouped-query attention: query head h reads KV head h // group
    idx = torch.tensor(list(heads), device=x.device)
    q, k = q[:, idx], k[:, idx // group]  # (1, H, T, hs) each
    if spec.position_scores is None and spec.scale != 1.0:  # scaled once here, not once per block of scores
        q, spec = q * spec.scale, replace(spec, scale=1.0)  # the same bits where the scale is 2^-n
    valid = torch.ones(1, T, dtype=torch.long, device=x.device)
    step = block_rows(T, len(heads), budget, x.element_size())
    for start in range(first, last, step):
        stop = min(start + step, last)
        lo, hi = _key_band(spec, start, stop, T)
        out = None if buffers is None else buffers.take((1, len(heads), stop - start, hi - lo), q,
                                                        at_least=len(heads) * step * T)
        band = block_probs(q[:, :, start:stop], k[:, :, lo:hi], spec, valid[:, lo:hi],
                           query_start=start, key_start=lo, heads=list(heads), out=out)[0]  # (H, R, hi - lo)
        yield Block.banded(layer, tuple(heads), start, band, key_start=lo, n_keys=T)  # probs assembled if read


def _key_band(spec, start: int, stop: int, n_keys: int) -> tuple[int, int]:
    """Keys that queries start .. stop-1 can see at all: causal rows stop at the diagonal, sliding
    windows start `window - 1` keys back, a bidirectional local band reaches `local_window` keys either
    side. The mask hides every other key, so they are exact zeros."""
    hi = stop if spec.causal else n_keys
    lo = max(0, start - spec.sliding_window + 1) if spec.sliding_window is not None else 0
    if spec.local_window is not None:
        lo, hi = max(lo, start - spec.local_window), min(hi, stop + spec.local_window)
    return lo, hi


def iter_blocks_encoded(
    lm: LoadedModel,
    items: Sequence[Encoded],
    *,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    budget: int = DEFAULT_BUDGET,
    family: Family | None = None,
    implementation: str = "sdpa",
) -> Iterator[tuple[int, Block]]:
    """`(item index, block)` for a batch of tokenised texts: one forward pass, then layer by layer."""
    family = family or family_for(lm.config)
    layer_idx = select_layers(lm, layers)
    head_idx = select_heads(lm, heads)
    base = base_model(lm)
    specs = {layer: family.layer_spec(base, layer, lm.config) for layer in layer_idx}
    producers = {s.kv_layer for s in specs.values() if s.kv_layer is not None}  # shared KV: their inputs too
    wanted = set(layer_idx)
    inputs: dict[int, torch.Tensor] = {}  # the shared-KV producers' inputs, kept for their consumers
    buffers = Buffers()  # every layer's blocks written into the same two buffers while consumers let go of them
    catch = {layer: m for layer in layer_idx if (m := _projections(family, base, layer, specs[layer])) is not None}
    for layer, x, qk in _streamed(lm, family, items, sorted(wanted | producers), implementation, catch):
        if layer in producers:
            inputs[layer] = x
        if layer not in wanted:
            continue
        spec = specs[layer]
        kv = spec.kv_input(inputs)  # (B, T, D) the producer layer's input (shared KV), or None
        for b, enc in enumerate(items):
            n = len(enc.ids)
            for block in layer_blocks(x[b, :n], spec, layer, head_idx, budget,
                                       kv=None if kv is None else kv[b, :n], buffers=buffers,
                                       projected=None if qk is None else (qk[0][b, :n], qk[1][b, :n])):
                yield b, block
        del x, qk


def _projections(family: Family, base, layer: int, spec) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """The `nn.Linear` modules inside `layer`'s attention whose weights and biases are `spec`'s q and k
    projections (the same storage), whose outputs can be caught in the model's forward instead of projected
    again; None where there are none (a fused qkv, latent attention, shared KV, a module run by several layers)."""
    if spec.latent is not None or spec.kv_layer is not None:
        return None
    attention = family.attention(base, layer)
    if sum(family.attention(base, other) is attention for other in family.attention_layers(base.config)) > 1:
        return None  # ALBERT: one module for every layer

    def same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
        if a is None or b is None:
            return a is None and b is None
        return (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
                and a.dtype == b.dtype)

    def find(w, bias):
        found = [m for m in attention.modules() if type(m) is torch.nn.Linear and not m._forward_hooks
                 and not m._forward_pre_hooks and same(m.weight, w) and same(m.bias, bias)]
        return found[0] if len(found) == 1 else None

    q, k = find(spec.wq, spec.bq), find(spec.wk, spec.bk)
    return None if q is None or k is None or q is k else (q, k)


def _streamed(lm: LoadedModel, family: Family, items: Sequence[Encoded], layers: Sequence[int],
              implementation: str, catch: dict[int, tuple[torch.nn.Module, torch.nn.Module]],
              ) -> Iterator[tuple[int, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]]:
    """`(layer, its attention input (B, T, D), its q and k projections or None)` in forward order, one layer at
    a time, from one forward pass. `catch`: the layers whose q and k projection modules' outputs are caught
    (`_projections`); the layer is handed over once both have run (or, failing that, once its attention has).

    `layer_inputs` keeps every layer's input until the pass ends (layers × T × D floats: 755 MB for
    gemma3-270m at 16,384 tokens, on top of the forward's own peak). Here the pass runs in a worker thread
    that stops in each wanted layer's pre-hook (or its k projection's hook) until the caller has taken that
    layer's blocks, so one layer's input is held at a time. The two threads take turns, never run at once. The worker only
    stops in its own calls: the caller may use the model meanwhile (hooks of other threads pass through).
    """
    handoff: queue.Queue = queue.Queue(maxsize=1)
    resume = threading.Semaphore(0)
    state = {"stop": False}
    last = max(layers)

    caught: dict[int, dict] = {}  # layer -> its input and projections, until it is handed over

    def hand(i, x, qk):
        handoff.put(("layer", i, (x, qk)))
        resume.acquire()  # the caller has taken this layer's blocks
        if state["stop"] or i == last:
            raise _Enough

    def grab(i, x):
        if i in catch:  # handed over once its projections have run
            caught[i] = {"x": x.detach()}
        else:
            hand(i, x.detach(), None)

    def projection(key, output):
        i, which = key
        slot = caught.get(i)
        if slot is None or which in slot:
            return
        slot[which] = output.detach()
        if "q" in slot and "k" in slot:
            del caught[i]
            hand(i, slot["x"], (slot["q"], slot["k"]))

    def after(i, _):  # the projections were not both seen (never, for the modules `_projections` finds): x alone
        if i in caught:
            hand(i, caught.pop(i)["x"], None)

    def work():
        try:
            with torch.inference_mode(), fast_attention(lm.model, implementation):
                base(input_ids=ids, attention_mask=mask, output_attentions=False, use_cache=False)
        except _Enough:
            pass
        except BaseException as exc:  # handed to the caller, raised there
            handoff.put(("error", None, exc))
            return
        handoff.put(("done", None, None))

    base = base_model(lm)
    ids, mask = pad_batch(items, lm.device)
    catch = {i: m for i, m in catch.items() if i in set(layers)}
    worker = threading.Thread(target=work, name="headscope-layer-inputs", daemon=True)
    with contextlib.ExitStack() as hooks:  # the worker's calls only; removed once it has ended
        hooks.enter_context(watch(LayerModules(family, base, lm.config, layers, "attention"), grab, what="input",
                                  thread=worker))
        hooks.enter_context(watch(LayerModules(family, base, lm.config, list(catch), "attention"), after,
                                  thread=worker))
        hooks.enter_context(watch({(i, which): m for i, pair in catch.items() for which, m in zip("qk", pair)},
                                  projection, thread=worker))
        try:
            worker.start()
            while True:
                kind, layer, got = handoff.get()
                if kind == "error":
                    raise got
                if kind == "done":
                    return
                try:
                    yield layer, *got
                finally:
                    del got
                    resume.release()
        finally:
            state["stop"] = True
            resume.release()  # a worker waiting in a hook raises _Enough and ends
            while worker.is_alive():  # drain what it hands over while it unwinds
                try:
                    handoff.get(timeout=0.05)
                except queue.Empty:
                    pass
                worker.join(timeout=0.05)


def iter_blocks(
    lm: LoadedModel,
    text: str,
    *,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    budget: int = DEFAULT_BUDGET,
    truncate: bool = False,
) -> Iterator[Block]:
    """Attention of one text as blocks of query rows, layer by layer (layers in increasing order).

    >>> from headscope.probe.tiny import tiny_model
    >>> lm = tiny_model("gpt2")  # 7 tokens: one row of 2 heads in 5 working copies is 2·7·4·5 = 280 B
    >>> blocks = iter_blocks(lm, "The cat sat on the mat.", layers=[1], heads=[0, 2], budget=3 * 280)
    >>> [(b.layer, b.heads, b.query_start, tuple(b.probs.shape)) for b in blocks]
    [(1, (0, 2), 0, (2, 3, 7)), (1, (0, 2), 3, (2, 3, 7)), (1, (0, 2), 6, (2, 1, 7))]
    """
    [text] = check_texts(text)
    enc = encode(lm, text, truncate=truncate)
    for _, block in iter_blocks_encoded(lm, [enc], layers=layers, heads=heads, budget=budget):
        yield block


def check_prefix(
    lm: LoadedModel,
    enc: Encoded,
    *,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    n_tokens: int = PREFIX_TOKENS,
) -> PrefixCheck:
    """Recompute the first `n_tokens` of a text and compare with the model's eager attention there.

    Checks the whole recompute path (inputs caught under fast attention, from-scratch probabilities)
    against what the model itself computes with `output_attentions=True`, on the prefix only.
    """
    n = min(n_tokens, len(enc.ids))
    prefix = Encoded(text=enc.text, ids=enc.ids[:n], spans=enc.spans[:n], special=enc.special[:n])
    layer_idx = select_layers(lm, layers)
    head_idx = select_heads(lm, heads)
    reference = _eager_probs(lm, prefix, layer_idx)  # layer -> (nh, n, n)
    worst = 0.0
    for _, block in iter_blocks_encoded(lm, [prefix], layers=layer_idx, heads=head_idx):
        ref = reference[block.layer][head_idx, block.query_start : block.query_stop]  # (H, R, n)
        worst = max(worst, (ref.float() - block.probs.float()).abs().max().item())
    return PrefixCheck(n_tokens=n, max_abs_err=worst, tolerance=tolerances(lm.dtype)[0],
                       dtype=str(lm.dtype).replace("torch.", ""))


@torch.inference_mode()
def _eager_probs(lm: LoadedModel, enc: Encoded, layers: Sequence[int]) -> dict[int, torch.Tensor]:
    ids, mask = pad_batch([enc], lm.device)
    with fast_attention(lm.model, "eager"):
        out = base_model(lm)(input_ids=ids, attention_mask=mask, output_attentions=True, use_cache=False)
    have = attention_layers(lm)  # the model returns its attention layers' weights only, in order
    if not out.attentions or len(out.attentions) != len(have) or any(a is None for a in out.attentions):
        raise RuntimeError(f"{lm.name}: eager attention exposed no weights; the prefix check cannot run")
    row = {layer: k for k, layer in enumerate(have)}
    return {i: out.attentions[row[i]][0] for i in layers}
