"""What an ablation changes: one readout of the model per example, and how to compare two readouts.

An `EffectTask` holds prepared inputs and runs the model over them once per call of `read(lm)`;
`change(clean, ablated)` turns the clean and the ablated readouts into one number. Where a task has
`stacked(lm, copies)`, it runs every batch as `copies` stacked copies (rows c·B … (c+1)·B − 1 are copy
c) in one call and returns each copy's readouts: an intervention that differs per copy (one head
ablated in each, `probe.interventions.ablate_copies`) gets `copies` readouts from one pass, each what
`read` gives under that copy's intervention alone. Tasks are built by name from `EFFECT_TASKS`:

    next_token_loss   decoders: mean next-token cross-entropy of each text (nats); effect = mean
                      change, ablated − clean (higher = the heads mattered more)
    sequence_loss     decoders: the same loss on given token ids from a position on — the induction
                      task scores the second copy of a repeated random sequence (Olsson et al. 2022)
    logit_diff        decoders: a cloze, logit(right) − logit(wrong) for the next token after each
                      prompt; effect = mean change (lower = mattered more)
    option_preference decoders: a choice between continuations, log P(right option) − the largest
                      log P(other option) after each prompt (each option's log-probability summed
                      over its tokens); effect = mean change (lower = mattered more), and an
                      example's preference flips when its sign changes
    word_cosine       encoders: the final representation of a chosen word (mean over its tokens);
                      effect = mean cosine of the ablated to the clean vector (lower = mattered more)
    sentence_cosine   sentence encoders (minilm): the sentence embedding — the mean of the final
                      hidden states over the real tokens, sentence-transformers' mean pooling;
                      effect = mean cosine as for word_cosine
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Literal, Sequence

import torch
import torch.nn.functional as F

from .encoding import Encoded, check_count, check_texts, encode_many, pad_batch
from .forward import base_model
from .model import LoadedModel
from .names import Stronger

__all__ = ["EffectMetric", "EffectTask", "EFFECT_TASKS", "next_token_loss", "sequence_loss", "logit_diff",
           "option_logprobs", "option_preference", "word_cosine", "sentence_cosine"]

EffectMetric = Literal["next_token_loss", "sequence_loss", "logit_diff", "option_preference", "word_cosine",
                       "sentence_cosine"]


@dataclass(frozen=True, eq=False)
class EffectTask:
    """Prepared inputs for one effect metric: `read(lm)` runs the model, `change` compares readouts."""

    metric: EffectMetric
    read: Callable[[LoadedModel], torch.Tensor]  # per example: (N,) values or (N, D) vectors
    change: Callable[[torch.Tensor, torch.Tensor], float]  # (clean, ablated) -> the effect
    stronger: Stronger  # which direction of `change` means the ablation hurt more
    description: str  # what the effect is, in words, with its unit
    n: int  # examples
    stacked: Callable[[LoadedModel, int], torch.Tensor] | None = None  # (copies, ...read's shape): see the module
    copy_bytes: int = 0  # about the memory one copy of the largest batch takes in a stacked read


def _copy_bytes(lm: LoadedModel, items: Sequence[Encoded], batch_size: int, *, logits: bool) -> int:
    """A rough size of one copy of the largest batch's activations (float32): hidden states and MLP, each
    head's attention row per token, and the logits where the readout needs them."""
    config = lm.config
    width = 8 * getattr(config, "hidden_size", 1024) + (getattr(config, "vocab_size", 0) if logits else 0)
    largest = max((len(c) * max(len(items[i].ids) for i in c) for c in _by_length(items, batch_size)), default=0)
    length = max((len(e.ids) for e in items), default=0)
    return 4 * largest * (width + 2 * getattr(config, "num_attention_heads", 1) * length)


def _mean_difference(clean: torch.Tensor, ablated: torch.Tensor) -> float:
    return float((ablated.double() - clean.double()).mean())


def _mean_cosine(clean: torch.Tensor, ablated: torch.Tensor) -> float:
    return float(F.cosine_similarity(ablated.double(), clean.double(), dim=-1).mean())


def _require_decoder(lm: LoadedModel, what: str) -> None:
    get = getattr(lm.model, "get_output_embeddings", None)
    if not lm.is_causal or get is None or get() is None:
        raise ValueError(f"{what} needs a decoder with a language-model head; {lm.name} has none "
                         "(for an encoder use word_cosine or sentence_cosine)")


def _batches(items: Sequence[Encoded], batch_size: int):
    for start in range(0, len(items), batch_size):
        yield items[start : start + batch_size]


def _by_length(items: Sequence[Encoded], batch_size: int) -> list[list[int]]:
    """The items' indices in batches of texts of about one length (sorted by length, ties in order): each
    batch pads to its own longest text, so fewer padded tokens run through every layer."""
    order = sorted(range(len(items)), key=lambda i: len(items[i].ids))
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def _stack(t: torch.Tensor, copies: int) -> torch.Tensor:
    """`copies` copies of a batch stacked along the rows (copy c is rows c·B … (c+1)·B − 1)."""
    return t if copies == 1 else t.repeat(copies, *([1] * (t.dim() - 1)))


def _token_losses(lm: LoadedModel, items: Sequence[Encoded], starts: Sequence[int], batch_size: int,
                  copies: int = 1) -> torch.Tensor:
    """Per item: mean cross-entropy of the tokens at positions >= max(start, 1), each predicted from its prefix
    -> (copies, N), every batch run as `copies` stacked copies."""
    out = torch.zeros(copies, len(items), dtype=torch.float64)
    with torch.inference_mode():
        for batch in _by_length(items, batch_size):
            ids, mask = (_stack(t, copies) for t in pad_batch([items[i] for i in batch], lm.device))
            logits = lm.model(input_ids=ids, attention_mask=mask, use_cache=False).logits  # (cB, T, V)
            nll = F.cross_entropy(logits[:, :-1].float().transpose(1, 2), ids[:, 1:], reduction="none")  # (cB, T-1)
            for c in range(copies):
                for b, i in enumerate(batch):
                    out[c, i] = nll[c * len(batch) + b, max(starts[i], 1) - 1 : len(items[i].ids) - 1].double().mean()
    return out


def next_token_loss(lm: LoadedModel, texts: Sequence[str], *, batch_size: int = 8, truncate: bool = False) -> EffectTask:
    """Mean next-token loss of each text; the effect is its mean rise under ablation (nats)."""
    check_count(batch_size, "batch_size")
    _require_decoder(lm, "next_token_loss")
    items = [e for e in encode_many(lm, check_texts(texts), truncate=truncate)]
    short = [i for i, e in enumerate(items) if len(e.ids) < 2]
    if short:
        raise ValueError(f"text {short[0]} has fewer than 2 tokens: there is no next token to predict")
    starts = [1] * len(items)
    return EffectTask("next_token_loss", lambda m: _token_losses(m, items, starts, batch_size)[0],
                      _mean_difference, "higher", "change in mean next-token loss (nats)", len(items),
                      lambda m, copies: _token_losses(m, items, starts, batch_size, copies),
                      _copy_bytes(lm, items, batch_size, logits=True))


def sequence_loss(lm: LoadedModel, sequences: Sequence[Sequence[int]], *, start: int, batch_size: int = 8,
                  description: str = "change in next-token loss") -> EffectTask:
    """Loss on given token ids (no special tokens added) from position `start` on, e.g. a second copy."""
    check_count(batch_size, "batch_size")
    _require_decoder(lm, "sequence_loss")
    items = [Encoded(text="", ids=tuple(int(t) for t in s), spans=((0, 0),) * len(s), special=(False,) * len(s))
             for s in sequences]
    if not items or any(len(e.ids) <= start for e in items):
        raise ValueError(f"every sequence needs more than {start} tokens")
    starts = [start] * len(items)
    return EffectTask("sequence_loss", lambda m: _token_losses(m, items, starts, batch_size)[0],
                      _mean_difference, "higher", f"{description} (nats)", len(items),
                      lambda m, copies: _token_losses(m, items, starts, batch_size, copies),
                      _copy_bytes(lm, items, batch_size, logits=True))


def logit_diff(lm: LoadedModel, prompts: Sequence[str], right: Sequence[str], wrong: Sequence[str], *,
               batch_size: int = 8) -> EffectTask:
    """logit(right) − logit(wrong) for the token after each prompt (first token of each option)."""
    _require_decoder(lm, "logit_diff")
    prompts = check_texts(prompts)
    if not (len(prompts) == len(right) == len(wrong)):
        raise ValueError("a cloze needs one right and one wrong option per prompt")
    items = encode_many(lm, prompts)
    special = set(getattr(lm.tokenizer, "all_special_ids", []))
    items = [_drop_trailing_special(e, special) for e in items]
    pairs = [(_first_token(lm, r), _first_token(lm, w)) for r, w in zip(right, wrong)]

    def stacked(m: LoadedModel, copies: int) -> torch.Tensor:
        out = torch.zeros(copies, len(items), dtype=torch.float64)
        with torch.inference_mode():
            for batch in _by_length(items, batch_size):
                ids, mask = (_stack(t, copies) for t in pad_batch([items[i] for i in batch], m.device))
                logits = m.model(input_ids=ids, attention_mask=mask, use_cache=False).logits
                for c in range(copies):
                    for b, i in enumerate(batch):
                        (r, w), last = pairs[i], logits[c * len(batch) + b, len(items[i].ids) - 1].double()
                        out[c, i] = last[r] - last[w]
        return out

    return EffectTask("logit_diff", lambda m: stacked(m, 1)[0], _mean_difference, "lower",
                      "change in logit(right) − logit(wrong) of the next token", len(items), stacked,
                      _copy_bytes(lm, items, batch_size, logits=True))


def option_logprobs(lm: LoadedModel, prompts: Sequence[str], options: Sequence[Sequence[str]], *,
                    batch_size: int = 8) -> list[list[float]]:
    """log P(option | prompt), summed over the option's tokens, for each prompt and each of its options.

    Only the tokens that condition a prediction are run: the prompt plus all but the last token of
    an option. Options that share those (single-token options, or a shared first word such as
    " the") share one forward pass.
    """
    _require_decoder(lm, "option_logprobs")
    wanted = _option_contexts(lm, prompts, options)  # per prompt, per option: (context, option ids)
    # For each context, the (position, token) log-probabilities the options need.
    needed: dict[tuple[int, ...], set[tuple[int, int]]] = {}
    for row in wanted:
        for ctx, o_ids in row:
            start = len(ctx) - len(o_ids)  # position whose prediction is the option's first token
            needed.setdefault(ctx, set()).update((start + j, t) for j, t in enumerate(o_ids))
    contexts = sorted(needed, key=len)
    value: dict[tuple[tuple[int, ...], int, int], float] = {}
    with torch.inference_mode():
        for chunk in _batches(contexts, batch_size):
            t_max = max(len(c) for c in chunk)
            ids = torch.zeros(len(chunk), t_max, dtype=torch.long)
            mask = torch.zeros(len(chunk), t_max, dtype=torch.long)
            for b, c in enumerate(chunk):
                ids[b, : len(c)] = torch.tensor(c)
                mask[b, : len(c)] = 1
            logits = lm.model(input_ids=ids.to(lm.device), attention_mask=mask.to(lm.device), use_cache=False).logits
            lp = torch.log_softmax(logits.float(), dim=-1)  # (B, T, vocab)
            for b, c in enumerate(chunk):
                for pos, t in needed[c]:
                    value[(c, pos, t)] = float(lp[b, pos, t])
    return [[sum(value[(ctx, len(ctx) - len(o_ids) + j, t)] for j, t in enumerate(o_ids)) for ctx, o_ids in row]
            for row in wanted]


def _option_contexts(lm: LoadedModel, prompts: Sequence[str], options: Sequence[Sequence[str]]):
    """Per prompt, per option: (the token ids that condition the option's tokens, the option's ids)."""
    tok = lm.tokenizer
    special = set(getattr(tok, "all_special_ids", []))
    wanted = []
    for i, (prompt, opts) in enumerate(zip(prompts, options, strict=True)):
        p_ids = list(tok(prompt)["input_ids"])
        while p_ids and p_ids[-1] in special and len(p_ids) > 1:  # an appended EOS/SEP is no context
            p_ids.pop()
        row = []
        for opt in opts:
            o_ids = list(tok(opt, add_special_tokens=False)["input_ids"])
            if not o_ids:
                raise ValueError(f"option {opt!r} of prompt {i} is empty after tokenisation")
            if len(p_ids) + len(o_ids) > lm.max_length:
                raise ValueError(f"prompt {i} and option {opt!r} exceed {lm.name}'s {lm.max_length} tokens")
            row.append((tuple(p_ids + o_ids[:-1]), o_ids))
        wanted.append(row)
    return wanted


def option_preference(lm: LoadedModel, prompts: Sequence[str], options: Sequence[Sequence[str]],
                      answers: Sequence[int], *, batch_size: int = 8) -> EffectTask:
    """log P(right option) − max log P(other options) after each prompt; > 0 where the right one is preferred."""
    _require_decoder(lm, "option_preference")
    if not (len(prompts) == len(options) == len(answers)):
        raise ValueError("a choice needs one list of options and one answer per prompt")
    bad = [i for i, (opts, a) in enumerate(zip(options, answers)) if len(opts) < 2 or not 0 <= a < len(opts)]
    if bad:
        raise ValueError(f"prompt {bad[0]} needs at least two options and an answer that indexes one of them")
    _option_contexts(lm, prompts, options)  # a bad option fails here, before any ablation

    def read(m: LoadedModel) -> torch.Tensor:
        prefs = []
        for vals, a in zip(option_logprobs(m, prompts, options, batch_size=batch_size), answers):
            prefs.append(vals[a] - max(v for j, v in enumerate(vals) if j != a))
        return torch.tensor(prefs, dtype=torch.float64)

    return EffectTask("option_preference", read, _mean_difference, "lower",
                      "change in log P(right option) − max log P(other options) (nats)", len(prompts))


def _drop_trailing_special(e: Encoded, special: set[int]) -> Encoded:
    n = len(e.ids)
    while n > 1 and e.ids[n - 1] in special:  # an appended EOS/SEP is no context
        n -= 1
    return Encoded(e.text, e.ids[:n], e.spans[:n], e.special[:n])


def _first_token(lm: LoadedModel, option: str) -> int:
    ids = lm.tokenizer(option, add_special_tokens=False)["input_ids"]
    if not ids:
        raise ValueError(f"option {option!r} is empty after tokenisation")
    return int(ids[0])


def _final_states(m: LoadedModel, items: Sequence[Encoded], batch_size: int, pick, copies: int = 1) -> torch.Tensor:
    out: list[list[torch.Tensor | None]] = [[None] * len(items) for _ in range(copies)]
    with torch.inference_mode():
        for batch in _by_length(items, batch_size):
            ids, mask = (_stack(t, copies) for t in pad_batch([items[i] for i in batch], m.device))
            h = base_model(m)(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state  # (cB, T, D)
            for c in range(copies):
                for b, i in enumerate(batch):  # (D,) for text number i
                    out[c][i] = pick(h[c * len(batch) + b, : len(items[i].ids)], i).double().cpu()
    return torch.stack([torch.stack(o) for o in out])  # (copies, N, D)


def sentence_cosine(lm: LoadedModel, texts: Sequence[str], *, batch_size: int = 8, truncate: bool = False) -> EffectTask:
    """The sentence embedding (mean of the final hidden states over the text's tokens, specials included)."""
    check_count(batch_size, "batch_size")
    items = encode_many(lm, check_texts(texts), truncate=truncate)
    def pick(h, k):
        return h.mean(0)

    return EffectTask("sentence_cosine", lambda m: _final_states(m, items, batch_size, pick)[0],
                      _mean_cosine, "lower", "cosine of the ablated sentence embedding to the clean one", len(items),
                      lambda m, copies: _final_states(m, items, batch_size, pick, copies),
                      _copy_bytes(lm, items, batch_size, logits=False))


def word_cosine(lm: LoadedModel, texts: Sequence[str], word: str, *, batch_size: int = 8,
                truncate: bool = False) -> EffectTask:
    """The final representation of `word` (its first whole-word occurrence, mean over its tokens)."""
    check_count(batch_size, "batch_size")
    texts = check_texts(texts)
    items = encode_many(lm, texts, truncate=truncate)
    tokens = [_word_tokens(e, word, i) for i, e in enumerate(items)]
    def pick(h, k):
        return h[tokens[k]].mean(0)

    return EffectTask("word_cosine", lambda m: _final_states(m, items, batch_size, pick)[0],
                      _mean_cosine, "lower", f"cosine of the ablated final representation of {word!r} to the clean one",
                      len(items), lambda m, copies: _final_states(m, items, batch_size, pick, copies),
                      _copy_bytes(lm, items, batch_size, logits=False))


def _word_tokens(e: Encoded, word: str, index: int) -> list[int]:
    m = re.search(rf"(?<!\w){re.escape(word)}(?!\w)", e.text, flags=re.IGNORECASE)
    if m is None:
        raise ValueError(f"text {index} ({e.text[:40]!r}) does not contain the word {word!r}")
    picked = [t for t, (a, b) in enumerate(e.spans) if not e.special[t] and a < m.end() and b > m.start()]
    if not picked:
        raise ValueError(f"text {index}: {word!r} was cut off by truncation")
    return picked


EFFECT_TASKS: dict[str, Callable[..., EffectTask]] = {
    "next_token_loss": next_token_loss,
    "sequence_loss": sequence_loss,
    "logit_diff": logit_diff,
    "option_preference": option_preference,
    "word_cosine": word_cosine,
    "sentence_cosine": sentence_cosine,
}
