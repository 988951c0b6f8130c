"""`headscope generate`: generation that records each new token's attention (KV cache on): greedy or
sampled, one prompt or several, plain text or a chat.

A thin wrapper over `headscope.generate_attention` (and `probe.generate.chat_prompt` for --chat).
"""

from __future__ import annotations

import click

from ..common import internals as hs_
from ..common.exits import fail
from ..common.loading import inputs_or_fail, load_or_fail
from ..common.options import model, options, prompt, seed, top, utf8_text
from ..common.outputs import emit

__all__ = ["cli"]


@click.command()
@model(default="smollm2")
@prompt(multiple=True)
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=20, show_default=True)
@click.option("--temperature", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="0: greedy; above 0: sample from softmax(logits / temperature).")
@click.option("--top-p", type=click.FloatRange(min=0, max=1, min_open=True), default=1.0, show_default=True,
              help="Sampling: draw from the smallest set of tokens whose probability reaches this.")
@seed()
@click.option("--chat", is_flag=True, help="Apply the tokenizer's chat template: each --prompt is a user message; "
                                          "every token is labelled by its turn (system / user / assistant).")
@click.option("--system", default=None, callback=utf8_text("--system"), help="With --chat: a system message first.")
@options(top(3), "image", "json", "quiet", "device")
def cli(model_name, prompts, max_new_tokens, temperature, top_p, seed, chat, system, k, images, as_json, placement,
        quiet) -> None:
    """Continue each --prompt (repeat it for several, each generated in turn; with --chat the user's message) and
    record the attention of every generated token. --model must be a decoder; --seed seeds the sampling; --top lists
    the keys each step attends to most (averaged over layers and heads)."""
    from headscope import generate_attention

    if system is not None and not chat:
        fail("--system goes with --chat")
    if images and chat:
        fail("--image puts the prompt in the processor's chat template already; leave out --chat")
    if images:
        inputs_or_fail([model_name], images=True)
    lm = load_or_fail(model_name, placement)
    results = []
    for prompt in prompts:
        try:
            turns = None
            if chat:
                messages = ([{"role": "system", "content": system}] if system is not None else []) + \
                    [{"role": "user", "content": prompt}]
                prompt, turns = hs_.chat_prompt(lm, messages)
            results.append((prompt, generate_attention(lm, prompt, max_new_tokens=max_new_tokens,
                                                       temperature=temperature, top_p=top_p, seed=seed, turns=turns,
                                                       progress=not quiet,
                                                       **({"images": list(images)} if images else {}))))
        except (TypeError, ValueError) as exc:
            fail(str(exc))
    dicts = [r.to_dict() for _, r in results] if as_json else []
    if not emit(results[0][1], as_json=as_json, payload=dicts[0] if len(dicts) == 1 else {"generations": dicts},
                summary=None):
        return
    for prompt, result in results:
        how = "greedy" if temperature == 0 else f"sampled at temperature {temperature:g}, top-p {top_p:g}, seed {seed}"
        click.echo(f"{result.model}: {len(result.prompt)} prompt tokens, {len(result)} generated "
                   f"({how}, stopped at {result.stopped})")
        click.echo(f"{prompt}\u2192{result.text}")
        if result.prompt.patches:
            click.echo(_image_share(result))
        if result.prompt_turns:
            spans, last = [], None
            for label, turn in zip(result.prompt.labels, result.prompt_turns):
                if turn != last:
                    spans.append(f"[{turn}]")
                    last = turn
                spans.append(label)
            click.echo("turns: " + "".join(spans) + "[assistant]" + result.text)
        click.echo(f"{'step':>4}  {'token':<16} top {k} keys (mean attention over layers and heads)")
        for t, row in enumerate(result.steps):
            mean = row.mean(dim=(0, 1))  # [key]
            labels = result.key_labels(t)
            turns = result.turns(t)
            top = mean.topk(min(k, len(labels)))
            cells = "   ".join(f"{labels[i]!r}@{i}{'/' + turns[i] if turns else ''} {w:.3f}"
                               for w, i in zip(top.values.tolist(), top.indices.tolist()))
            click.echo(f"{t:>4}  {result.generated_tokens[t]!r:<16} {cells}")


def _image_share(result) -> str:
    """Each step's share of attention (mean over layers and heads) on the prompt's image tokens, and where in the
    picture the most of it lands."""

    on_image = [i for i, p in enumerate(result.prompt.patches) if p is not None]
    cells = []
    for t, row in enumerate(result.steps):
        mean = row.mean(dim=(0, 1))[on_image]  # [image key]
        best = result.prompt.patches[on_image[int(mean.argmax())]]
        cells.append(f"{result.generated_tokens[t]!r} {float(mean.sum()):.3f} (most at {hs_.patch_label(best)})")
    return f"attention on the {len(on_image)} image tokens, per step: " + ", ".join(cells)
