"""Activation patching on clean/corrupt prompt pairs, batched: many patches per forward pass.

A pair is a clean prompt, a corrupted one of the same length in tokens, and a right and a wrong next
token; the metric is logit(right) − logit(wrong) at the last token. Patching runs one prompt of each
pair (the *base* run) and overwrites some activations with the other prompt's (the *source*):

    denoise   run corrupt, patch in clean activations  (does this part restore the clean answer?)
    noise     run clean, patch in corrupt activations  (does the clean answer need this part?)

A *site* is one activation, at every position of the prompt:

    ("head", l, h)    head h's output in layer l: its slice of the W_O input (as `probe.interventions`)
    ("mlp", l, None)  layer l's MLP output (the `mlp` module of the block)
    ("resid", l, p)   the residual stream entering layer l, at position p (None: every position)
    ("q", l, h)       head h's queries: its pattern recomputed from the source's queries and the run's keys
    ("k", l, h)       head h's keys (the KV head as query head h sees it; its group's other heads keep theirs)
    ("v", l, h)       head h's values: the run's pattern over the source's values
    ("pattern", l, h) head h's attention pattern: the source's pattern over the run's values

A q, k, v or pattern patch recomputes head h's output (its slice of the W_O input) from the layer's
verified from-scratch attention (`probe.scratch`) on the run's and the source's attention inputs; the
rest of the layer and every other head are the model's own. Patched together, q + k + v of a head is
its output patch, pattern + v too, and q + k is the pattern patch (tested).

`patch_metrics(lm, prepared, jobs, direction=...)` evaluates any number of *jobs* — each a set of
sites patched together — and answers `[job, pair]`. Jobs are stacked along the batch: a forward pass
runs `batch_rows // n_pairs` jobs over all pairs at once (copy j of the batch is job j), so patching
every head of a model is one forward per group of heads, never one per pair or per head.

Exact limits (tests/test_mechanisms.py): the empty job gives the base run's metric; patching the
residual stream at every position of any layer gives the source's; clean == corrupt gives the same
number everywhere. Hooks only: every hook is removed on exit, also after an error, and the model's
weights are never touched.
"""

from __future__ import annotations

import inspect
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Sequence

import torch

from .attribution import answer_token, decoder_layers, require_lm_head
from .encoding import encode_many, pad_batch
from .families import family_for
from .forward import base_model
from .hooks import catch, replace, watch
from .progress import extend
from .interventions import head_dim
from .model import LoadedModel
from .placement import onloaded
from .names import PatchDirection as Direction, PatchWhat
from .scratch import project_qk, project_v, row_probs

__all__ = ["Direction", "PatchWhat", "Site", "Prepared", "prepare_pairs", "patch_metrics", "path_patch_metrics",
           "attribution_estimates", "sweep_sites"]

Site = tuple[str, int, int | None]
ATTN_KINDS = ("q", "k", "v", "pattern")  # sites recomputed inside the attention from its input
KINDS = ("head", "mlp", "resid", *ATTN_KINDS)


@dataclass(frozen=True, eq=False)
class Prepared:
    """Pairs tokenised and padded (right) to one length: (N, T) ids of each side, the mask, the last real
    position of each pair, and the right and wrong token ids."""

    clean: torch.Tensor  # (N, T)
    corrupt: torch.Tensor  # (N, T)
    mask: torch.Tensor  # (N, T)
    last: torch.Tensor  # (N,)
    right: torch.Tensor  # (N,)
    wrong: torch.Tensor  # (N,)
    lengths: tuple[int, ...]

    @property
    def n(self) -> int:
        return self.clean.shape[0]

    def subset(self, index: Sequence[int]) -> "Prepared":
        idx = torch.as_tensor(list(index), dtype=torch.long)
        return Prepared(self.clean[idx], self.corrupt[idx], self.mask[idx], self.last[idx], self.right[idx],
                        self.wrong[idx], tuple(self.lengths[i] for i in idx.tolist()))


def prepare_pairs(lm: LoadedModel, clean: Sequence[str], corrupt: Sequence[str], right: Sequence[str],
                  wrong: Sequence[str]) -> Prepared:
    """Tokenise pairs; each clean and corrupt prompt must have the same number of tokens."""
    require_lm_head(lm, "activation patching")
    if not (len(clean) == len(corrupt) == len(right) == len(wrong)) or not clean:
        raise ValueError("patching needs at least one pair, each with clean, corrupt, right and wrong")
    for i, pair in enumerate(zip(clean, corrupt)):
        for which, text in zip(("clean", "corrupt"), pair):
            if not isinstance(text, str) or not text.strip():  # no last token to read the metric at
                raise ValueError(f"pair {i}: the {which} prompt is {text!r}; every prompt needs a non-space character")
    a, b = encode_many(lm, list(clean)), encode_many(lm, list(corrupt))
    for i, (x, y) in enumerate(zip(a, b)):
        if len(x.ids) != len(y.ids):
            raise ValueError(f"pair {i}: the clean prompt has {len(x.ids)} tokens and the corrupt one {len(y.ids)}; "
                             "patching needs the same number (change the corrupt prompt's words)")
    rights, wrongs = [answer_token(lm, r) for r in right], [answer_token(lm, w) for w in wrong]
    ids_a, mask = pad_batch(a, lm.device)
    ids_b, _ = pad_batch(b, lm.device)
    lengths = tuple(len(x.ids) for x in a)
    return Prepared(ids_a, ids_b, mask, torch.tensor([n - 1 for n in lengths], device=lm.device),
                    torch.tensor(rights, device=lm.device), torch.tensor(wrongs, device=lm.device), lengths)


def _mlp(layer: torch.nn.Module, l: int) -> torch.nn.Module:
    mlp = getattr(layer, "mlp", None)
    if mlp is None:
        raise ValueError(f"layer {l} has no `mlp` module to patch; patch head_out or resid")
    if "residual" in inspect.signature(mlp.forward).parameters:
        raise ValueError("this model's MLP module adds the residual stream itself (BLOOM); patch head_out or resid")
    return mlp


class _Metric:
    """logit(right) − logit(wrong) from the final hidden state at each pair's last position (after
    Gemma 2's final softcap where the model has one)."""

    def __init__(self, lm: LoadedModel) -> None:
        head = require_lm_head(lm, "activation patching")
        with onloaded(head):  # an unembedding that accelerate offloaded: its weights in, kept for the metric
            self.w = head.weight.detach()
            self.b = None if getattr(head, "bias", None) is None else head.bias.detach()
        self.cap = getattr(lm.config, "final_logit_softcapping", None)

    def __call__(self, hidden: torch.Tensor, p: Prepared, copies: int) -> torch.Tensor:
        last, right, wrong = p.last.repeat(copies), p.right.repeat(copies), p.wrong.repeat(copies)
        h = hidden[torch.arange(hidden.shape[0], device=hidden.device), last]  # (B, D)

        def logit(tok):
            v = (h * self.w[tok].to(h.dtype)).sum(-1)
            if self.b is not None:
                v = v + self.b[tok].to(h.dtype)
            return self.cap * torch.tanh(v / self.cap) if self.cap else v

        return (logit(right) - logit(wrong)).double().cpu().view(copies, -1)  # (copies, N)


def _source(lm: LoadedModel, family, layers, ids, mask, sites: set[Site]) -> dict:
    """The source run's activations at the sites' layers: head inputs of W_O, MLP outputs, layer inputs."""
    base = base_model(lm)
    need = {("attn" if kind in ATTN_KINDS else kind, l) for kind, l, _ in sites}
    inputs = {"head": lambda l: family.out_proj(base, l),  # the input of W_O: the heads' outputs
              "attn": lambda l: family.attention(base, l),  # the attention's input, for q, k, v and pattern patches
              "resid": lambda l: layers[l]}
    ins = {(kind, l): inputs[kind](l) for kind, l in need if kind in inputs}
    outs = {(kind, l): _mlp(layers[l], l) for kind, l in need if kind == "mlp"}
    with catch(ins, what="input", take=_copy) as got, catch(outs, take=_copy) as got_out:
        base(input_ids=ids, attention_mask=mask, use_cache=False)
    return got | got_out


def _copy(x: torch.Tensor) -> torch.Tensor:
    return x.detach().clone()


def _setup(lm: LoadedModel, p: Prepared, direction: Direction):
    """What every patching run starts from: the family, the base model, its decoder layers, and the prompts
    run and the prompts the patched activations come from (denoise: the corrupt run, clean activations)."""
    if direction not in ("denoise", "noise"):
        raise ValueError(f"direction must be 'denoise' or 'noise', got {direction!r}")
    family = family_for(lm.config)
    run_ids, src_ids = (p.corrupt, p.clean) if direction == "denoise" else (p.clean, p.corrupt)
    return family, base_model(lm), decoder_layers(lm, family), run_ids, src_ids


@torch.inference_mode()
def patch_metrics(lm: LoadedModel, p: Prepared, jobs: Sequence[frozenset[Site] | set[Site]], *,
                  direction: Direction = "denoise", batch_rows: int = 512, bar=None) -> torch.Tensor:
    """The metric of every pair with each job's sites patched: `[job, pair]` (float64).

    `direction="denoise"` runs the corrupt prompts with clean activations patched in; `"noise"` the
    clean prompts with corrupt ones. An empty job is the base run itself. `bar`: a `probe.progress` bar that
    gains one step per forward pass of the jobs.
    """
    family, base, layers, run_ids, src_ids = _setup(lm, p, direction)
    n_layers, nh = len(layers), lm.config.num_attention_heads
    jobs = [frozenset(j) for j in jobs]
    for kind, l, x in set().union(*jobs) if jobs else ():
        if kind not in KINDS or not 0 <= l < n_layers:
            raise ValueError(f"no site {(kind, l, x)} in {lm.name} ({n_layers} layers)")
        if kind in ("head", *ATTN_KINDS) and not (x is not None and 0 <= x < nh):
            raise ValueError(f"no head {x} in layer {l} of {lm.name} ({nh} heads)")
        if kind == "resid" and x is not None and not 0 <= x < p.clean.shape[1]:
            raise ValueError(f"position {x} is outside the prompts ({p.clean.shape[1]} tokens)")
    wanted = set().union(*jobs) if jobs else set()
    source = _source(lm, family, layers, src_ids, p.mask, wanted) if wanted else {}  # no site: no source run
    return _run_jobs(lm, p, jobs, run_ids, source, family, base, layers, batch_rows, bar)


def _run_jobs(lm, p: Prepared, jobs, run_ids, source, family, base, layers, batch_rows, bar=None) -> torch.Tensor:
    """The metric of the base run `run_ids` with each job's sites overwritten from `source`: `[job, pair]`;
    `bar` gains one step per forward pass."""
    metric = _Metric(lm)
    N = p.n
    per = max(1, batch_rows // N)
    extend(bar, -(-len(jobs) // per))
    out = []
    for start in range(0, len(jobs), per):
        chunk = jobs[start : start + per]
        k = len(chunk)
        # which batch copies patch which site: copy j holds rows j*N .. (j+1)*N - 1
        where: dict[Site, list[int]] = {}
        for j, job in enumerate(chunk):
            for site in job:
                where.setdefault(site, []).append(j)
        with ExitStack() as stack:
            for (kind, l), sites in _by_module(where).items():  # q/k/v/pattern first: a head_out patch overrides them
                hs = head_dim(lm, family, l)  # this layer's value head size (Gemma 4's global layers differ)
                if kind == "attn":
                    for hooks in _attn_hooks(l, sites, where, source, family, base, lm, p.mask.repeat(k, 1), N, hs):
                        stack.enter_context(hooks)
                else:
                    stack.enter_context(_hook(kind, l, sites, where, source, family, base, layers, N, hs))
            hidden = base(input_ids=run_ids.repeat(k, 1), attention_mask=p.mask.repeat(k, 1),
                          use_cache=False).last_hidden_state  # (k*N, T, D)
        out.append(metric(hidden, p, k))
        if bar is not None:
            bar.update()
    return torch.cat(out) if out else torch.zeros(0, N, dtype=torch.float64)


@torch.inference_mode()
def path_patch_metrics(lm: LoadedModel, p: Prepared, sender: tuple[int, int],
                       receivers: Sequence[frozenset[Site] | set[Site]], *, direction: Direction = "denoise",
                       freeze_mlps: bool = False, batch_rows: int = 512, bar=None) -> torch.Tensor:
    """Path patching (Wang et al. 2022): the metric with the path sender head → each job's receiver
    q, k or v inputs patched, and nothing else: `[job, pair]` (float64).

    1. The base run with the sender's output taken from the source run and every other head's output
       frozen at the base run's (`freeze_mlps`: every MLP's output too; by default the MLPs are
       recomputed, as in Wang et al.); each later layer's attention input is kept.
    2. The base run again with each receiver's q, k or v recomputed from that kept input, everything
       downstream of the receivers recomputed as usual.

    Sites are ("q" | "k" | "v", layer, head) with layer after the sender's. An empty job is the base run.
    `bar`: a `probe.progress` bar that gains one step per forward pass of the jobs.
    """
    family, base, layers, run_ids, src_ids = _setup(lm, p, direction)
    n_layers, nh = len(layers), lm.config.num_attention_heads
    ls, hs_ = sender
    if not (0 <= ls < n_layers and 0 <= hs_ < nh):
        raise ValueError(f"no sender head L{ls}H{hs_} in {lm.name} ({n_layers} layers × {nh} heads)")
    jobs = [frozenset(j) for j in receivers]
    for kind, l, h in set().union(*jobs) if jobs else ():
        if kind not in ("q", "k", "v") or not (ls < l < n_layers) or not (h is not None and 0 <= h < nh):
            raise ValueError(f"receiver {(kind, l, h)}: a receiver is the q, k or v of a head in a layer after the "
                             f"sender's (layer {ls}; {lm.name} has {n_layers} layers × {nh} heads)")
    frozen = {("head", l, 0) for l in range(ls, n_layers)}
    if freeze_mlps:
        frozen |= {("mlp", l, None) for l in range(ls, n_layers)}
    kept = _source(lm, family, layers, run_ids, p.mask, frozen)  # the base run's head inputs and MLP outputs
    sender_src = _source(lm, family, layers, src_ids, p.mask, {("head", ls, hs_)})[("head", ls)]
    hd = head_dim(lm, family, ls)  # the sender layer's value head size
    after: dict = {}
    with ExitStack() as stack:
        for l in range(ls, n_layers):
            y = kept[("head", l)].clone()  # (N, T, nh*hs): every head frozen at the base run's output
            if l == ls:
                y[:, :, hs_ * hd : (hs_ + 1) * hd] = sender_src[:, :, hs_ * hd : (hs_ + 1) * hd]
            stack.enter_context(replace({l: family.out_proj(base, l)}, lambda key, _, y=y: y, what="input"))
            if freeze_mlps:
                stack.enter_context(replace({l: _mlp(layers[l], l)}, lambda key, _, o=kept[("mlp", l)]: o.clone()))
            if l > ls:
                stack.enter_context(watch({("attn", l): family.attention(base, l)},
                                          lambda key, x: after.__setitem__(key, _copy(x)), what="input"))
        base(input_ids=run_ids, attention_mask=p.mask, use_cache=False)
    return _run_jobs(lm, p, jobs, run_ids, after, family, base, layers, batch_rows, bar)


def attribution_estimates(lm: LoadedModel, p: Prepared, what: PatchWhat = "head_out", *,
                          direction: Direction = "denoise") -> tuple[list[Site], torch.Tensor]:
    """Attribution patching (the gradient approximation of activation patching; Nanda 2023, Syed et al.
    2023): for every site, base metric + (source activation − base activation) · ∂metric/∂activation at
    the base run, summed over positions. One forward pass of the source run and one forward + backward
    pass of the base run, whatever the number of sites. `what`: "head_out" (each head's output) or
    "resid" (the stream entering each layer, every position). Answers the sites and `[site, pair]`
    (float64), comparable with `patch_metrics`.

    Gradients are taken with `torch.autograd.grad` with respect to added zero tensors: no parameter's
    `.grad` is written, whatever its `requires_grad`.
    """
    family, base, layers, run_ids, src_ids = _setup(lm, p, direction)
    if what not in ("head_out", "resid"):
        raise ValueError(f"attribution patching covers head_out and resid, got {what!r}")
    n_layers = len(layers)
    kind = "head" if what == "head_out" else "resid"
    with torch.no_grad():
        src = _source(lm, family, layers, src_ids, p.mask, {(kind, l, 0) for l in range(n_layers)})
    acts: dict[int, torch.Tensor] = {}
    zeros: dict[int, torch.Tensor] = {}

    def add_zero(l, x):
        acts[l] = x.detach()
        zeros[l] = torch.zeros_like(x, requires_grad=True)
        return x + zeros[l]  # the same values, and a leaf to take the gradient at

    modules = {l: family.out_proj(base, l) if kind == "head" else layers[l] for l in range(n_layers)}
    with torch.enable_grad(), replace(modules, add_zero, what="input"):  # W_O's input, or the layer's
        hidden = base(input_ids=run_ids, attention_mask=p.mask, use_cache=False).last_hidden_state
        metric = _Metric(lm)(hidden, p, 1)[0]  # (N,)
        grads = torch.autograd.grad(metric.sum(), [zeros[l] for l in range(n_layers)])
    base_metric = metric.detach()
    rows = []
    sites = sweep_sites(lm, what)
    for site in sites:
        _, l, h = site
        diff = (src[(kind, l)] - acts[l]) * grads[l]  # (N, T, ·): pairs are independent rows of the batch
        if kind == "head":
            hs = head_dim(lm, family, l)  # this layer's value head size
            diff = diff[..., h * hs : (h + 1) * hs]
        rows.append(diff.double().sum((1, 2)).cpu())
    est = torch.stack(rows) if rows else torch.zeros(0, p.n, dtype=torch.float64)
    return sites, base_metric + est


def _by_module(where: dict[Site, list[int]]) -> dict[tuple[str, int], list[Site]]:
    grouped: dict[tuple[str, int], list[Site]] = {}
    for site in sorted(where, key=lambda s: s[0] not in ATTN_KINDS):
        grouped.setdefault(("attn" if site[0] in ATTN_KINDS else site[0], site[1]), []).append(site)
    return grouped


def _rows(copies: list[int], N: int) -> torch.Tensor:
    return torch.cat([torch.arange(j * N, (j + 1) * N) for j in copies])


def _hook(kind, l, sites, where, source, family, base, layers, N, hs):
    """Within the block, the sites of one module (W_O's input, an MLP's output or a layer's input) overwritten
    from `source` in the batch copies that patch them."""
    src = source[(kind, l)]
    if kind == "head":
        def heads(_, y):
            y = y.clone()  # (k*N, T, nh*hs): never the caller's tensor
            for _, _, h in sites:
                rows = _rows(where[(kind, l, h)], N).to(y.device)
                y[rows, :, h * hs : (h + 1) * hs] = src[:, :, h * hs : (h + 1) * hs].repeat(len(where[(kind, l, h)]), 1, 1)
            return y
        return replace({l: family.out_proj(base, l)}, heads, what="input")
    if kind == "mlp":
        def mlp(_, out):
            out = out.clone()
            for site in sites:
                rows = _rows(where[site], N).to(out.device)
                out[rows] = src.repeat(len(where[site]), 1, 1)
            return out
        return replace({l: _mlp(layers[l], l)}, mlp)

    def resid(_, x):
        x = x.clone()
        for site in sites:
            rows = _rows(where[site], N).to(x.device)
            pos = site[2]
            if pos is None:
                x[rows] = src.repeat(len(where[site]), 1, 1)
            else:
                x[rows, pos] = src[:, pos].repeat(len(where[site]), 1)
        return x
    return replace({l: layers[l]}, resid, what="input")


def _attn_hooks(l, sites, where, source, family, base, lm, key_valid, N, hs):
    """Two hooks on layer l (context managers, to enter in order): one keeps the attention's input of this forward,
    the other rewrites the patched heads' slices of the W_O input, recomputed from the run's and the source's q, k, v."""
    spec = family.layer_spec(base, l, lm.config)
    group = spec.n_heads // spec.n_kv_heads
    per_head: dict[int, dict[int, set[str]]] = {}  # head -> batch copy -> the kinds patched there
    for kind, _, h in sites:
        for j in where[(kind, l, h)]:
            per_head.setdefault(h, {}).setdefault(j, set()).add(kind)
    now: dict = {}

    def pre(_, y):
        x = now.pop("x")
        y = y.clone()  # (k*N, T, nh*hs): never the caller's tensor
        cur = _project(x, spec)  # q (k*N, nh, T, hs), k and v (k*N, nkv, T, hs)
        src = _project(source[("attn", l)], spec)  # (N, ...)
        for h, copies in per_head.items():
            g = h // group
            by_kinds: dict[frozenset, list[int]] = {}
            for j, kinds in copies.items():
                by_kinds.setdefault(frozenset(kinds), []).append(j)
            for kinds, js in by_kinds.items():
                rows = _rows(js, N).to(y.device)
                n = len(js)

                def side(i, kind):  # the source's q, k or v where this kind (or the pattern) is patched
                    if kind in kinds or (kind != "v" and "pattern" in kinds):
                        return src[i].repeat(n, 1, 1, 1)
                    return cur[i][rows]

                q = side(0, "q")[:, h : h + 1]  # (n*N, 1, T, hs)
                k = side(1, "k")[:, g : g + 1]
                v = side(2, "v")[:, g : g + 1]
                _, probs = row_probs(q, k, spec, key_valid[rows], query_start=0, heads=[h])  # (n*N, 1, T, T)
                y[rows, :, h * hs : (h + 1) * hs] = (probs @ v)[:, 0].to(y.dtype)  # (n*N, T, hs)
        return y

    return (watch({"x": family.attention(base, l)}, now.__setitem__, what="input"),
            replace({l: family.out_proj(base, l)}, pre, what="input"))


def _project(x: torch.Tensor, spec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries, keys and values of one attention input (B, T, D), as the verified from-scratch attention makes them."""
    q, k = project_qk(x, spec)  # (B, nh, T, hs), (B, nkv, T, hs)
    v = project_v(x, spec)  # (B, nkv, T, vs): MLA's from its latent, value norms applied
    return q, k, v


def sweep_sites(lm: LoadedModel, what: PatchWhat, *, n_positions: int | None = None) -> list[Site]:
    """Every site of one kind: each head of each layer, each layer's MLP, or the residual stream
    entering each layer (at every position, or at each of `n_positions` positions alone)."""
    n_layers, nh = lm.config.num_hidden_layers, lm.config.num_attention_heads
    if what == "head_out":
        return [("head", l, h) for l in range(n_layers) for h in range(nh)]
    if what == "mlp":
        return [("mlp", l, None) for l in range(n_layers)]
    if what in ATTN_KINDS:
        return [(what, l, h) for l in range(n_layers) for h in range(nh)]
    if what == "resid":
        if n_positions is None:
            return [("resid", l, None) for l in range(n_layers)]
        return [("resid", l, t) for l in range(n_layers) for t in range(n_positions)]
    raise ValueError(f"what must be head_out, mlp, resid, q, k, v or pattern, got {what!r}")
