"""Attention sinks, taken apart: what the first position gets, what it gives, and what breaks without it.

    sinks(lm, texts)        -> analyses.sinks.SinkReport
        per head            the share of attention on the first k = 1..4 positions (the rows of the
                            `first_token` metric), the norm of the value read at position 0 against the
                            median of the other keys', the norm-weighted share (Kobayashi et al. 2020),
                            and for sink heads a dormant call from mean ablation against random heads
                            (`ablate_each` + `AblationEvidence.head_effect`)
        sink rate           Gu et al. 2025's Sink_k^ε over sequences of `length` tokens cut from the texts,
                            over random tokens, and with the first token replaced (another token, a space,
                            a repeat of the second token), each with a bootstrap interval over sequences
        massive             Sun et al. 2024's massive activations of the residual stream, per layer
    streaming(lm, text)     -> analyses.sinks.StreamingResult: the StreamingLLM test (Xiao et al. 2024), the
                            per-position loss under dense attention, a window of W keys, and the window plus
                            the first s = 1..keep tokens, the mask given to the model's own attention

The default long text is the UD English EWT test treebank's text in the shared data, when it is there
(`default_streaming_text`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from headscope.analyses.corpus import builtin_corpus
from headscope.analyses.sinks import (SINK_EPSILON, SINK_LENGTH, SinkReport, StreamingResult, dormant_calls,
                                      first_k_share, massive_activations, sequence_mass, sink_rate)
from headscope.probe.encoding import check_texts
from headscope.probe.families import family_for
from headscope.probe.forward import attention_layers, is_seq2seq
from headscope.probe.model import LoadedModel
from headscope.probe.names import DEFAULT_ABLATION_METHOD, AblationMethod
from headscope.probe.inputs import AttentionInput
from headscope.probe.sinks import head_internals, residual_stream, special_frame, token_nll
from headscope.probe.sources import source_for
from headscope.probe.types import seed_value, whole_number

from .ablation import ablate_each

__all__ = ["sinks", "streaming", "default_streaming_text", "sink_sequences", "SHARED_DATA_ENV", "EWT_TEXT"]

K_MAX = 4  # first-position shares are reported for k = 1..K_MAX
SHARED_DATA_ENV = "HEADSCOPE_SHARED_DATA"  # a folder holding ud-english-ewt/ (default: shared/data beside the checkout)
EWT_TEXT = "ud-english-ewt/en_ewt-ud-test.conllu"
FIRST_TOKEN_VARIANTS = ("another token", "a space", "a repeated word")


def sinks(lm: LoadedModel, texts: Sequence[str] | None = None, *, k: int = 1, epsilon: float = SINK_EPSILON,
          length: int = SINK_LENGTH, n_sequences: int = 32, n_random_sequences: int = 32, ablation: bool = True,
          ablation_texts: int = 32, method: AblationMethod = DEFAULT_ABLATION_METHOD, n_random: int = 19,
          head_texts: int = 64, massive_sequences: int = 4, massive_top: int = 3, n_boot: int = 1000, seed: int = 0,
          batch_size: int = 8, progress: bool = False) -> SinkReport:
    """Sinks of `lm` over `texts` (default: the built-in corpus) -> `SinkReport`.

    Per-head shares over the first `head_texts` texts; the sink rate Sink_k^ε over up to `n_sequences`
    sequences of `length` tokens cut from the texts and `n_random_sequences` of random tokens; massive
    activations over the first `massive_sequences` text sequences; the dormant calls from `method`
    ablation of every head alone on the first `ablation_texts` texts, each against `n_random` other heads
    (`ablation=False` skips them: no head is then called dormant).

    >>> r = sinks(hs.load("smollm2"))                                  # doctest: +SKIP
    >>> r.sink_rate.value, r.heads[r.heads["sink"]]["dormant"].mean()   # doctest: +SKIP
    """
    texts = check_texts(builtin_corpus() if texts is None else texts)
    if getattr(lm, "is_image", False):  # was "'NoneType' object is not callable" (an image model has no tokenizer)
        raise ValueError(f"the sinks analysis reads texts; {lm.name} is an image model ({lm.model_type}): load a text model")
    if is_seq2seq(lm):
        raise ValueError(f"the sinks analysis covers encoders and decoders; {lm.name} is an encoder-decoder model")
    # before any work: its massive activations read the residual stream block by block (a hybrid stack's Mamba
    # layers, Mllama's cross-attention layers add to it outside every head)
    family_for(lm.config).require_attention_everywhere(lm.config, "the sinks analysis (the residual stream by block)")
    k = whole_number(k, "k", minimum=None)
    if not 1 <= k <= K_MAX:
        raise ValueError(f"k must be 1..{K_MAX}, got {k}")
    if not 0 <= epsilon < 1:
        raise ValueError(f"epsilon must be in [0, 1), got {epsilon}")
    counts = dict(n_sequences=n_sequences, ablation_texts=ablation_texts, n_random=n_random, head_texts=head_texts,
                  massive_sequences=massive_sequences, massive_top=massive_top, n_boot=n_boot, batch_size=batch_size)
    n_sequences, ablation_texts, n_random, head_texts, massive_sequences, massive_top, n_boot, batch_size = (
        whole_number(v, name, minimum=1) for name, v in counts.items())  # 0 of any: an IndexError or a table of nan
    n_random_sequences, seed = whole_number(n_random_sequences, "n_random_sequences"), seed_value(seed)
    length = whole_number(length, "length", minimum=None)
    lead, trail = special_frame(lm)
    if length < len(lead) + len(trail) + 2:
        raise ValueError(f"length {length} leaves fewer than 2 text tokens between {lm.name}'s special tokens")
    if length > lm.max_length:  # past the positions the model has (a crash on absolute positions, else silent)
        raise ValueError(f"length {length} is more than {lm.name}'s {lm.max_length} positions; give at most "
                         f"{lm.max_length} (CLI: --length)")
    heads = _head_table(lm, texts[:head_texts], batch_size=batch_size)
    notes: list[str] = []

    seqs = sink_sequences(lm, texts, length=length, n=n_sequences)
    if not len(seqs):
        raise ValueError(f"the texts hold fewer than {length} tokens: give more text or a smaller length")
    if len(seqs) < n_sequences:
        notes.append(f"the texts gave {len(seqs)} sequences of {length} tokens (asked for {n_sequences})")
    sources = {"text": seqs}
    if n_random_sequences:
        sources["random"] = _random_sequences(lm, len(lead), len(trail), length, n_random_sequences, seed)
    for variant in FIRST_TOKEN_VARIANTS:
        sources[f"first: {variant}"] = _replace_first(lm, seqs, variant)
    rates = []
    attend = source_for(lm, "eager", batch_size=batch_size)  # whole maps of equal-length token-id sequences
    for source, ids in sources.items():
        mass = torch.cat([sequence_mass(torch.stack(
            [m.attention for m in attend.maps(AttentionInput.of(sequences=ids[i : i + batch_size].tolist()))]), K_MAX)
            for i in range(0, len(ids), batch_size)])
        rates.append(sink_rate(mass.numpy(), k=k, epsilon=epsilon, source=source, length=length, n_boot=n_boot,
                               seed=seed))
        if source == "text":
            heads[f"gu_alpha_{k}"] = mass[..., k - 1].mean(0).reshape(-1).numpy()

    shown = seqs[:massive_sequences]
    states = torch.cat([residual_stream(lm, shown[i : i + batch_size]) for i in range(0, len(shown), batch_size)])
    labels = [lm.tokenizer.convert_ids_to_tokens(s.tolist()) for s in shown]
    massive = massive_activations(states, labels, top=massive_top)

    if ablation:
        frame = ablate_each(lm, method=method, corpus=texts[:ablation_texts], batch_size=batch_size, progress=progress)
        L, H = lm.config.num_hidden_layers, lm.config.num_attention_heads
        single = frame["effect"].to_numpy(dtype=float).reshape(L, H)
        stronger = "higher" if lm.is_causal else "lower"
        calls = dormant_calls(heads["first_share_1"].to_numpy(dtype=float).reshape(L, H), single, stronger=stronger,
                              effect_metric=str(frame["effect_metric"].iloc[0]), epsilon=epsilon, n_random=n_random,
                              seed=seed, method=method, n_texts=min(len(texts), ablation_texts), model=lm.name)
        heads = heads.merge(calls.drop(columns="sink"), on=["layer", "head"])
    heads["sink"] = heads["first_share_1"] > epsilon
    if not ablation:
        heads["dormant"] = None
        heads["ablation_p"] = np.nan
    settings = {"k": k, "epsilon": epsilon, "length": length, "n_sequences": len(seqs),
                "n_random_sequences": n_random_sequences, "head_texts": min(len(texts), head_texts),
                "ablation": ({"method": method, "texts": min(len(texts), ablation_texts), "n_random": n_random}
                             if ablation else None),
                "massive_sequences": len(shown), "bootstrap": n_boot, "seed": seed,
                "special_tokens": {"before": lm.tokenizer.convert_ids_to_tokens(lead),
                                   "after": lm.tokenizer.convert_ids_to_tokens(trail)}}
    return SinkReport(model=lm.name, heads=heads, rates=tuple(rates), massive=massive, settings=settings,
                      notes=tuple(notes))


def _head_table(lm: LoadedModel, texts: Sequence[str], *, batch_size: int) -> pd.DataFrame:
    """Per head: first_share_1..4 and norm_share (rows pooled over texts, as the `first_token` metric pools
    them) and value_norm_ratio (‖v_0‖ / median_{j>0} ‖v_j‖, averaged over texts)."""
    causal = lm.is_causal
    sums = {k: 0.0 for k in range(1, K_MAX + 1)}
    rows = {k: 0 for k in sums}
    norm_sum, ratio_sum, n_ratio = 0.0, 0.0, 0
    for item in head_internals(lm, texts, batch_size=batch_size):
        T = item.probs.shape[-1]
        for k in sums:
            n = max(T - k, 0)  # the queries outside the first k positions (all of them see those keys)
            if n:
                sums[k] = sums[k] + first_k_share(item.probs, k, causal=causal).double() * n
                rows[k] += n
                if k == 1:
                    norm_sum = norm_sum + first_k_share(item.norm_weights, 1, causal=causal).double() * n
        if T >= 2:
            v = item.value_norms.double()  # [layer, head, key]
            ratio_sum = ratio_sum + v[..., 0] / v[..., 1:].median(-1).values.clamp_min(1e-30)
            n_ratio += 1
    layers, H = attention_layers(lm), lm.config.num_attention_heads  # a hybrid stack's, Mllama's: not all layers
    L = len(layers)
    nan = torch.full((L, H), float("nan"), dtype=torch.float64)
    frame = pd.DataFrame({"layer": np.repeat(np.array(layers), H), "head": np.tile(np.arange(H), L)})
    for k in sums:
        frame[f"first_share_{k}"] = (sums[k] / rows[k] if rows[k] else nan).reshape(-1).numpy()
    frame["norm_share"] = (norm_sum / rows[1] if rows[1] else nan).reshape(-1).numpy()
    frame["value_norm_ratio"] = (ratio_sum / n_ratio if n_ratio else nan).reshape(-1).numpy()
    return frame


def sink_sequences(lm: LoadedModel, texts: Sequence[str], *, length: int, n: int) -> torch.Tensor:
    """(≤ n, length) token ids: the texts' tokens run together (a space between texts) and cut into pieces,
    each framed by the special tokens the tokenizer puts around a text."""
    lead, trail = special_frame(lm)
    body = length - len(lead) - len(trail)
    stream: list[int] = []
    tok = lm.tokenizer
    for i, t in enumerate(texts):
        stream.extend(tok(t if i == 0 else " " + t, add_special_tokens=False)["input_ids"])
        if len(stream) >= n * body:
            break
    pieces = [lead + stream[s : s + body] + trail for s in range(0, len(stream) - body + 1, body)][:n]
    return torch.tensor(pieces, dtype=torch.long).reshape(len(pieces), length)


def _random_sequences(lm: LoadedModel, n_lead: int, n_trail: int, length: int, n: int, seed: int) -> torch.Tensor:
    """Uniformly random non-special token ids (a private seeded generator), framed as the texts are."""
    lead, trail = special_frame(lm)
    special = set(getattr(lm.tokenizer, "all_special_ids", []) or [])
    vocab = [i for i in range(min(len(lm.tokenizer), lm.config.vocab_size)) if i not in special]
    rng = np.random.default_rng(seed)
    body = rng.choice(np.asarray(vocab), size=(n, length - n_lead - n_trail))
    return torch.tensor([lead + list(map(int, row)) + trail for row in body], dtype=torch.long)


def _replace_first(lm: LoadedModel, seqs: torch.Tensor, variant: str) -> torch.Tensor:
    """The sequences with position 0 replaced: by the token of "the", of a space, or by a copy of position 1."""
    out = seqs.clone()
    if variant == "a repeated word":
        out[:, 0] = seqs[:, 1]
        return out
    word = "the" if variant == "another token" else " "
    ids = lm.tokenizer(word, add_special_tokens=False)["input_ids"] or lm.tokenizer("x", add_special_tokens=False)["input_ids"]
    out[:, 0] = int(ids[0])
    return out


def default_streaming_text() -> tuple[str, str] | None:
    """(text, where it came from): the UD English EWT test treebank's sentences run together, from the shared
    data (`$HEADSCOPE_SHARED_DATA`, else shared/data beside the project checkout), or None when it is not there."""
    roots = [Path(os.environ[SHARED_DATA_ENV])] if os.environ.get(SHARED_DATA_ENV) else []
    roots.append(Path(__file__).resolve().parents[2].parent / "shared" / "data")
    for root in roots:
        path = root / EWT_TEXT
        if path.is_file():
            with open(path, encoding="utf-8") as f:
                lines = [line[len("# text = "):].strip() for line in f if line.startswith("# text = ")]
            return " ".join(lines), str(path)
    return None


def streaming(lm: LoadedModel, text: str | None = None, *, window: int = 256, keep: int = 4, max_tokens: int = 2048,
              source: str | None = None) -> StreamingResult:
    """The StreamingLLM test on the first `max_tokens` tokens of `text` (default: `default_streaming_text()`).

    >>> from headscope.probe.tiny import tiny_model
    >>> r = streaming(tiny_model("llama"), "The cat sat on the mat. " * 4, window=4, keep=1, max_tokens=20)
    >>> r.n_tokens, sorted(r.sink_window)
    (20, [1])
    """
    if not lm.is_causal:
        raise ValueError(f"the StreamingLLM test needs a decoder; {lm.name} is an encoder")
    window, keep = whole_number(window, "window", minimum=1), whole_number(keep, "keep", minimum=1)
    max_tokens = whole_number(max_tokens, "max_tokens", minimum=2)
    if text is None:
        found = default_streaming_text()
        if found is None:
            raise ValueError("no text given and no UD English EWT treebank in the shared data; give a text "
                             f"(--text-file) or set {SHARED_DATA_ENV}")
        text, source = found
    ids = list(lm.tokenizer(check_texts([text])[0])["input_ids"])[: min(max_tokens, lm.max_length)]
    if len(ids) < 2:
        raise ValueError("the text has fewer than 2 tokens")
    # A window or window + first tokens that reaches every key is dense attention again: equal numbers that look like
    # a finding (and --keep 999999 ran a million passes over 10 tokens).
    if window >= len(ids) - 1:
        raise ValueError(f"a window of {window} keys covers all {len(ids)} tokens of the text: the test would equal dense "
                         f"attention; give a longer text (CLI: --text-file, --max-tokens) or a window below {len(ids) - 1}")
    if keep >= len(ids) - 1 - window:  # the last query that predicts a token is at position len(ids) - 2
        raise ValueError(f"the first {keep} tokens beside a window of {window} reach every key of the {len(ids)} tokens: "
                         f"each test would equal dense attention; keep at most {len(ids) - window - 2} (CLI: --keep)")
    dense = token_nll(lm, ids).numpy()
    only = token_nll(lm, ids, window=window).numpy()
    kept = {s: token_nll(lm, ids, window=window, keep=s).numpy() for s in range(1, keep + 1)}
    return StreamingResult(model=lm.name, n_tokens=len(ids), window=window, keep=keep, dense=dense, window_only=only,
                           sink_window=kept, source=source or "given text")
