"""`headscope generate`: greedy generation that records each new token's attention (KV cache on).

A thin wrapper over `headscope.generate.generate_attention`.
"""

from __future__ import annotations

import click

from ..common import device_options, echo_json, fail, json_option, load_or_fail, quiet_option, utf8_text

__all__ = ["cli"]


@click.command()
@click.option("--model", "model_name", default="smollm2", show_default=True,
              help="A decoder: packaged name, folder, GGUF file or hub id (NAME@REVISION).")
@click.option("--prompt", required=True, callback=utf8_text("--prompt"), help="The text to continue.")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=20, show_default=True)
@click.option("--top", "k", type=click.IntRange(min=1), default=3, show_default=True,
              help="Keys listed per step (attention averaged over layers and heads).")
@json_option
@quiet_option
@device_options
def cli(model_name, prompt, max_new_tokens, k, as_json, device, dtype, quiet) -> None:
    """Continue PROMPT greedily and record the attention of every generated token."""
    from headscope import generate_attention

    lm = load_or_fail(model_name, device, dtype)
    try:
        result = generate_attention(lm, prompt, max_new_tokens=max_new_tokens)
    except (TypeError, ValueError) as exc:
        fail(str(exc))
    if as_json:
        echo_json(result.to_dict())
        return
    click.echo(f"{result.model}: {len(result.prompt)} prompt tokens, {len(result)} generated "
               f"(greedy, stopped at {result.stopped})")
    click.echo(f"{prompt}\u2192{result.text}")
    click.echo(f"{'step':>4}  {'token':<16} top {k} keys (mean attention over layers and heads)")
    for t, row in enumerate(result.steps):
        mean = row.mean(dim=(0, 1))  # [key]
        labels = result.key_labels(t)
        top = mean.topk(min(k, len(labels)))
        cells = "   ".join(f"{labels[i]!r}@{i} {w:.3f}" for w, i in zip(top.values.tolist(), top.indices.tolist()))
        click.echo(f"{t:>4}  {result.generated_tokens[t]!r:<16} {cells}")
