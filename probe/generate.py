"""Attention during generation: what each new token looks at, recorded step by step.

`generate_attention(lm, prompt, max_new_tokens=N)` runs the prompt once (its own `[layer, head,
query, key]` attention becomes an `AttentionMap`, as `extract` gives it), then decodes greedily with
the KV cache on. Step t feeds generated token t and keeps its attention row, `[layer, head, key]`
over the prompt and generated[:t+1] — the last row of a full forward pass over that sequence, but
computed at the cost of one token. Generation stops after N tokens or at an end-of-sequence token
(whose row is kept too).

Layers with a sliding window (Gemma 3) keep only the window's keys in the cache; their rows are
placed at the end of the full-length row, the keys before the window getting weight 0, exactly as
the full forward pass masks them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from .encoding import encode
from .extract import extract
from .forward import is_seq2seq
from .model import LoadedModel
from .types import AttentionMap

__all__ = ["GenerationAttention", "generate_attention"]

Stop = Literal["max_new_tokens", "eos"]


@dataclass(frozen=True, eq=False)
class GenerationAttention:
    """A greedy continuation of `prompt.text` and the attention row of every generated token.

    `steps[t]` is `[layer, head, key]` over `key_labels(t)` = the prompt's tokens + generated[:t+1].
    """

    model: str
    prompt: AttentionMap  # token level: the prompt's own [layer, head, query, key]
    generated_ids: tuple[int, ...]
    generated_tokens: tuple[str, ...]  # each id decoded alone, as it reads in the text
    steps: tuple[torch.Tensor, ...]  # [layer, head, key], key = len(prompt) + t + 1
    stopped: Stop

    def __len__(self) -> int:
        return len(self.generated_ids)

    @property
    def text(self) -> str:
        return "".join(self.generated_tokens)

    def key_labels(self, step: int) -> tuple[str, ...]:
        """Labels of the keys of `steps[step]`: the prompt's tokens, then the generated ones up to `step`."""
        return self.prompt.labels + self.generated_tokens[: step + 1]

    def to_dict(self) -> dict:
        """JSON-ready: prompt and generated tokens, and each step's `[layer, head, key]` row."""
        return {
            "model": self.model, "prompt": self.prompt.text, "prompt_tokens": list(self.prompt.labels),
            "text": self.text, "generated_ids": list(self.generated_ids),
            "generated_tokens": list(self.generated_tokens), "stopped": self.stopped,
            "steps": [{"step": t, "token": tok, "id": i, "attention": row.tolist()}
                      for t, (tok, i, row) in enumerate(zip(self.generated_tokens, self.generated_ids, self.steps))],
        }


@torch.inference_mode()
def generate_attention(lm: LoadedModel, prompt: str, *, max_new_tokens: int = 20) -> GenerationAttention:
    """Greedy generation from `prompt` with the KV cache, keeping every new token's attention row."""
    if is_seq2seq(lm):
        raise ValueError(f"{lm.name} is an encoder-decoder model; generate follows a decoder-only model's one "
                         "stream — pick a decoder such as smollm2, or extract(lm, source, target=...) for all three "
                         "kinds of attention")
    if not lm.is_causal:
        raise ValueError(f"{lm.name} is an encoder (bidirectional attention) and does not generate text; "
                         "pick a decoder such as smollm2 or gemma3-270m")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    enc = encode(lm, prompt)
    if len(enc.ids) + max_new_tokens > lm.max_length:
        raise ValueError(f"the prompt has {len(enc.ids)} tokens; with {max_new_tokens} new ones that passes "
                         f"{lm.name}'s limit of {lm.max_length}")
    [prompt_map] = extract(lm, prompt)  # the prompt's own attention, labels and words, as everywhere else
    out = lm.model(input_ids=torch.tensor([enc.ids], device=lm.device), use_cache=True)
    if getattr(out, "logits", None) is None:
        raise ValueError(f"{lm.name} was loaded without a language-model head, so it cannot pick next tokens")
    eos = _eos_ids(lm)
    cache_arg = _cache_argument(lm.model)
    ids: list[int] = []
    steps: list[torch.Tensor] = []
    stopped: Stop = "max_new_tokens"
    for _ in range(max_new_tokens):
        next_id = int(out.logits[0, -1].argmax())
        ids.append(next_id)
        cache = out["cache"] if "cache" in out else out["past_key_values"]
        out = lm.model(input_ids=torch.tensor([[next_id]], device=lm.device), **{cache_arg: cache},
                       use_cache=True, output_attentions=True)
        steps.append(_row(out.attentions, n_keys=len(enc.ids) + len(ids)))
        if next_id in eos:
            stopped = "eos"
            break
    tokens = tuple(lm.tokenizer.decode([i]) for i in ids)
    return GenerationAttention(model=lm.name, prompt=prompt_map, generated_ids=tuple(ids), generated_tokens=tokens,
                               steps=tuple(steps), stopped=stopped)


def _row(attentions, n_keys: int) -> torch.Tensor:
    """The new token's `[layer, head, key]` row; sliding-window layers right-aligned into `n_keys`."""
    if not attentions or any(a is None for a in attentions):
        raise RuntimeError("the model returned no attention weights during generation; it must run eager attention")
    n_heads = attentions[0].shape[1]
    row = torch.zeros(len(attentions), n_heads, n_keys, dtype=torch.float32)  # [layer, head, key]
    for layer, a in enumerate(attentions):  # a: (1, nh, 1, keys in the cache)
        kept = a[0, :, -1].to("cpu", torch.float32)
        row[layer, :, n_keys - kept.shape[-1]:] = kept
    return row


def _cache_argument(model) -> str:
    """The forward's name for the KV cache: `cache` in recent transformers, `past_key_values` before."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _eos_ids(lm: LoadedModel) -> set[int]:
    eos = getattr(lm.model.generation_config, "eos_token_id", None) if hasattr(lm.model, "generation_config") else None
    if eos is None:
        eos = lm.tokenizer.eos_token_id
    return set(eos) if isinstance(eos, (list, tuple)) else ({int(eos)} if eos is not None else set())
