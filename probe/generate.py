"""Attention during generation: what each new token looks at, recorded step by step.

`generate_attention(lm, prompt, max_new_tokens=N)` runs the prompt once (its own `[layer, head,
query, key]` attention becomes an `AttentionMap`, as `extract` gives it), then decodes greedily with
the KV cache on. Step t feeds generated token t and keeps its attention row, `[layer, head, key]`
over the prompt and generated[:t+1] — the last row of a full forward pass over that sequence, but
computed at the cost of one token. Generation stops after N tokens or at an end-of-sequence token
(whose row is kept too).

Sampling: `temperature` 0 (the default) is greedy; above 0 the next token is drawn from
softmax(logits / temperature), cut to the smallest set of tokens whose probability reaches `top_p`
(nucleus sampling), with a `torch.Generator` seeded by `seed`, so a seed gives the same tokens again.

Chat: `chat_prompt(lm, messages)` renders a list of `{"role", "content"}` messages with the tokenizer's
chat template (and the generation prompt); `generate_attention(..., turns=...)` then labels each prompt
token with the role of the turn it sits in (system / user / assistant; the template's own markup of a
turn belongs to it), and every generated token "assistant".

Images: a vision–language decoder (`lm.reads_images`: LLaVA, Gemma 3, PaliGemma) takes `images=[...]`, placed
in the prompt as `extract` places them (`probe.vision_language`: one per image slot, or before a prompt without
one, in a chat turn where the processor has a template). The prompt's map then carries each image token's
`ImagePatch` and the pictures, so each new token's row over the image tokens draws over the picture; the pixels
enter the first forward pass only (the image tokens' keys and values are in the cache from then on).

Layers with a sliding window (Gemma 3) keep only the window's keys in the cache; their rows are
placed at the end of the full-length row, the keys before the window getting weight 0, exactly as
the full forward pass masks them.
"""

from __future__ import annotations

from typing import Literal, Sequence

import torch

from .encoding import encode
from .extract import extract
from .forward import extra_inputs, is_cross_reader, is_seq2seq
from .images import check_images, require_modality
from .model import LoadedModel
from .results import GenerationAttention, Stop
from .progress import progress as progress_bar
from .types import AttentionMap, seed_value, whole_number
from .vision_language import encode_with_images

__all__ = ["generate_attention", "chat_prompt", "Turn", "cache_argument", "eos_ids"]

Turn = Literal["system", "user", "assistant"]


@torch.inference_mode()
def generate_attention(lm: LoadedModel, prompt: str, *, max_new_tokens: int = 20, temperature: float = 0.0,
                       top_p: float = 1.0, seed: int | None = None,
                       turns: Sequence[tuple[int, int, str]] | None = None,
                       images: object = None, progress: bool = False) -> GenerationAttention:
    """Generation from `prompt` with the KV cache, keeping every new token's attention row: greedy, or
    sampled at `temperature` > 0 with nucleus `top_p` and a `seed`. `turns`: (start, stop, role) character
    ranges of `prompt` (`chat_prompt` gives them) that label its tokens by turn. `images`: a vision–language
    decoder's pictures for the prompt's image slots (paths, PIL images or arrays). `progress`: a bar on stderr,
    one step per generated token."""
    if not isinstance(prompt, str):  # a list reached the tokenizer: "TextEncodeInput must be Union[...]"
        raise TypeError(f"prompt must be one str, got {type(prompt).__name__}; call generate_attention once per prompt")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature < float("inf"):
        raise ValueError(f"temperature must be 0 (greedy) or more, got {temperature!r}")
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    seed = None if seed is None else seed_value(seed)  # a torch.Generator's range: 2**70 was "Overflow ... long long"
    if temperature == 0 and top_p != 1:  # greedy decoding never reads it: the run would not be the one asked for
        raise ValueError(f"top_p={top_p:g} is nucleus sampling, which needs a temperature above 0 (greedy decoding "
                         "takes the argmax); give a temperature or leave top_p at 1")
    max_new_tokens = whole_number(max_new_tokens, "max_new_tokens", minimum=None)  # True would be 1 token
    rng = torch.Generator().manual_seed(seed if seed is not None else 0)
    if is_seq2seq(lm):
        raise ValueError(f"{lm.name} is an encoder-decoder model; generate follows a decoder-only model's one "
                         "stream — pick a decoder such as smollm2, or extract(lm, source, target=...) for all three "
                         "kinds of attention")
    if is_cross_reader(lm):  # each new token's row would be one map over the text: Mllama's layers are not
        raise ValueError(f"{lm.name} reads its images through cross-attention layers; generate does not follow them "
                         "yet (it keeps one map per layer over the text); hs.extract(lm, text, images=[...]) gives "
                         "its self-attention and cross-attention maps apart")
    if not lm.is_causal:
        raise ValueError(f"{lm.name} is an encoder (bidirectional attention) and does not generate text; "
                         "pick a decoder such as smollm2 or gemma3-270m")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if images is not None:
        images = check_images(images)  # once: an iterator is read here, not emptied by a second look
        require_modality(lm, images=True)  # an image on a text model: one clear line
        if not getattr(lm, "reads_images", False):
            raise ValueError(f"{lm.name} does not generate text over an image; pick a vision–language decoder "
                             "such as tiny:llava")
        if turns:
            raise ValueError("turns= label a text prompt's chat turns; a prompt with images takes the processor's "
                             "chat template already (give the user's message as the prompt)")
        [enc] = encode_with_images(lm, [prompt], images)
    else:
        enc = encode(lm, prompt)
    if len(enc.ids) + max_new_tokens > lm.max_length:
        raise ValueError(f"the prompt has {len(enc.ids)} tokens; with {max_new_tokens} new ones that passes "
                         f"{lm.name}'s limit of {lm.max_length}")
    # the prompt's own attention, labels and words (image tokens: their patches and pictures), as everywhere else
    [prompt_map] = extract(lm, prompt) if images is None else extract(lm, [prompt], images=images)
    out = lm.model(input_ids=torch.tensor([enc.ids], device=lm.device), use_cache=True, **extra_inputs(lm, [enc]))
    if getattr(out, "logits", None) is None:
        raise ValueError(f"{lm.name} was loaded without a language-model head, so it cannot pick next tokens")
    eos = eos_ids(lm)
    cache_arg = cache_argument(lm.model)
    ids: list[int] = []
    steps: list[torch.Tensor] = []
    stopped: Stop = "max_new_tokens"
    with progress_bar(total=max_new_tokens, enabled=progress, desc=f"{lm.name} generate", unit="token") as bar:
        for _ in range(max_new_tokens):
            next_id = _pick(out.logits[0, -1], temperature, top_p, rng)
            ids.append(next_id)
            cache = out["cache"] if "cache" in out else out["past_key_values"]
            out = lm.model(input_ids=torch.tensor([[next_id]], device=lm.device), **{cache_arg: cache},
                           use_cache=True, output_attentions=True)
            steps.append(_row(out.attentions, n_keys=len(enc.ids) + len(ids)))
            bar.update()
            if next_id in eos:
                stopped = "eos"
                break
    tokens = tuple(lm.tokenizer.decode([i]) for i in ids)
    sampling = {"temperature": float(temperature)}
    if temperature > 0:
        sampling.update(top_p=float(top_p), seed=seed if seed is not None else 0)
    labels = _token_turns(enc, turns) if turns else ()
    return GenerationAttention(model=lm.name, prompt=prompt_map, generated_ids=tuple(ids), generated_tokens=tokens,
                               steps=tuple(steps), stopped=stopped, sampling=sampling, prompt_turns=labels)


def _pick(logits: torch.Tensor, temperature: float, top_p: float, rng: torch.Generator) -> int:
    """The next token: the argmax (temperature 0), or a draw from the nucleus of softmax(logits / temperature)."""
    if temperature == 0:
        return int(logits.argmax())
    logits = logits.float().cpu()
    probs = ((logits - logits.max()) / temperature).softmax(-1)  # shifted first: a tiny temperature made inf / inf
    order = probs.argsort(descending=True, stable=True)
    sorted_p = probs[order]
    keep = (sorted_p.cumsum(-1) - sorted_p) < top_p  # the smallest prefix whose mass reaches top_p (at least one)
    keep[0] = True  # a top_p below float32's smallest number compared as 0 and kept nothing
    nucleus = sorted_p * keep
    return int(order[torch.multinomial(nucleus / nucleus.sum(), 1, generator=rng)])


def _token_turns(enc, turns: Sequence[tuple[int, int, str]]) -> tuple[str, ...]:
    """Each token's turn: the role of the character range its span starts in (a special token with an
    empty span: the turn of the next token that has one, else the last turn)."""
    def role(pos: int) -> str | None:
        return next((r for a, b, r in turns if a <= pos < b), None)

    out: list[str | None] = [role(a) if b > a else None for a, b in enc.spans]
    following = turns[-1][2] if turns else "assistant"
    for i in range(len(out) - 1, -1, -1):
        out[i] = following = out[i] or following
    return tuple(out)


def _injected_system(render, first: dict, stop: int) -> int:
    """Where the first turn starts when the template put a default system turn before it (else 0): the
    first turn rendered alone and after a system message of our own end alike; what comes before that
    common end in the first rendering is the template's system turn."""
    try:
        alone, after = render([first]), render([{"role": "system", "content": "\u00a7"}, first])
    except Exception:  # a template that refuses a system role (Gemma's) adds none
        return 0
    common = 0
    while common < min(len(alone), len(after)) and alone[-1 - common] == after[-1 - common]:
        common += 1
    start = len(alone) - common
    # the common end starts inside the system turn's closing markup ("<|im_end|>\n"): the first turn
    # starts after that line, with its own header ("<|im_start|>user\n")
    own = alone.find(first["content"], start)
    if start == 0 or own < 0:
        return 0
    newline = alone.find("\n", start, own + 1)
    return min(stop, newline + 1 if newline >= 0 else start)


def chat_prompt(lm: LoadedModel, messages: Sequence[dict]) -> tuple[str, tuple[tuple[int, int, str], ...]]:
    """`messages` rendered by the tokenizer's chat template with the generation prompt, and the character
    range of each turn: (start, stop, role), the generation prompt belonging to the assistant."""
    tok = lm.tokenizer
    if not getattr(tok, "chat_template", None):
        raise ValueError(f"{lm.name}'s tokenizer has no chat template; generate without chat")
    if not messages or any(not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant")
                           or not isinstance(m.get("content"), str) for m in messages):
        raise ValueError("messages must be a non-empty list of {'role': system|user|assistant, 'content': text}")
    bos = getattr(tok, "bos_token", None) or ""
    bos_id = getattr(tok, "bos_token_id", None)
    adds_bos = bool(bos) and bos_id is not None and tok("a", add_special_tokens=True)["input_ids"][:1] == [bos_id]

    def render(chat: Sequence[dict], generation: bool = False) -> str:
        text = tok.apply_chat_template(list(chat), tokenize=False, add_generation_prompt=generation)
        return text[len(bos):] if adds_bos and text.startswith(bos) else text  # encoding adds <bos> itself

    ranges, start = [], 0
    for i, m in enumerate(messages):
        stop = len(render(messages[: i + 1]))
        ranges.append((start, stop, m["role"]))
        start = stop
    if messages[0]["role"] != "system":  # a template may put in a default system message (SmolLM2's does)
        injected = _injected_system(render, messages[0], ranges[0][1])
        if injected:
            ranges[0:1] = [(0, injected, "system"), (injected, ranges[0][1], ranges[0][2])]
    full = render(messages, True)
    if len(full) > start:
        ranges.append((start, len(full), "assistant"))
    return full, tuple(ranges)


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


def cache_argument(model) -> str:
    """The forward's name for the KV cache: `cache` in recent transformers, `past_key_values` before."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def eos_ids(lm: LoadedModel) -> set[int]:
    eos = getattr(lm.model.generation_config, "eos_token_id", None) if hasattr(lm.model, "generation_config") else None
    if eos is None:
        eos = lm.tokenizer.eos_token_id
    return set(eos) if isinstance(eos, (list, tuple)) else ({int(eos)} if eos is not None else set())
