"""`headscope dla`: direct logit attribution of a decoder's next token, summed back to the model's own logit."""

from __future__ import annotations

import click

from ..common.exits import refusals
from ..common.loading import load_or_fail
from ..common.options import options, prompt, top, utf8_text
from ..common.outputs import emit

__all__ = ["cli"]


@click.command()
@options("model")
@prompt()
@click.option("--answer", required=True, callback=utf8_text("--answer"), help="The next token (its first token, e.g. ' Mary' with its space).")
@click.option("--wrong", default=None, callback=utf8_text("--wrong"), help="A wrong answer: explain logit(answer) − logit(wrong).")
@options(top(10), "figure", "out", "json", "quiet", "device")
def cli(model_name, prompt, answer, wrong, k, figure_path, out_path, as_json, placement, quiet) -> None:
    """Split the next-token logit (difference) into embeddings, heads, MLPs and biases.

    The final norm's scale is frozen at this run's value; the parts sum to the model's own logit
    (difference), and the error of that sum is printed with every result. --out writes every part.
    """
    from headscope import dla

    lm = load_or_fail(model_name, placement)
    with refusals(model_name):
        result = dla(lm, prompt, answer, wrong, progress=not quiet)
    if emit(result, out_path, figure_path, as_json=as_json):
        for r in result.top(k).itertuples():
            click.echo(f"  {r.component:>16}  {r.value:+.4f}")
