"""`headscope dla`: direct logit attribution of a decoder's next token, summed back to the model's own logit."""

from __future__ import annotations

import click

from ..common import (device_options, echo_json, json_option, load_or_fail, model_option, new_figure_or_fail,
                      out_option, quiet_option, refusals, utf8_text, write_table)

__all__ = ["cli"]


@click.command()
@model_option
@click.option("--prompt", required=True, callback=utf8_text("--prompt"), help="The text whose next token is explained.")
@click.option("--answer", required=True, callback=utf8_text("--answer"), help="The next token (its first token, e.g. ' Mary' with its space).")
@click.option("--wrong", default=None, callback=utf8_text("--wrong"), help="A wrong answer: explain logit(answer) − logit(wrong).")
@click.option("--top", "k", type=click.IntRange(min=1), default=10, show_default=True, help="Parts listed.")
@click.option("--figure", "figure_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the layer × head grid (.png, .svg or .pdf).")
@out_option
@json_option
@quiet_option
@device_options
def cli(model_name, prompt, answer, wrong, k, figure_path, out_path, as_json, device, dtype, quiet) -> None:
    """Split the next-token logit (difference) into embeddings, heads, MLPs and biases.

    The final norm's scale is frozen at this run's value; the parts sum to the model's own logit
    (difference), and the error of that sum is printed with every result. --out writes every part.
    """
    from headscope import dla

    new_figure_or_fail(figure_path)
    lm = load_or_fail(model_name, device, dtype)
    with refusals(model_name):
        result = dla(lm, prompt, answer, wrong)
    if out_path:
        write_table(result.to_frame(), out_path)
    if figure_path is not None:
        from headscope.reports.figures import dla_grid, save

        save(dla_grid(result), figure_path)
    if as_json:
        echo_json(result.to_dict())
        return
    click.echo(result.summary())
    for r in result.top(k).itertuples():
        click.echo(f"  {r.component:>16}  {r.value:+.4f}")
