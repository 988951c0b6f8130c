"""`headscope extract`: the attention maps of texts or images, written to one file (`headscope.extract_file`)."""

from __future__ import annotations

import click

from ..common.corpus import corpus_or_fail
from ..common.exits import fail, refusals
from ..common.loading import load_or_fail
from ..common.options import options, utf8_text
from ..common.outputs import emit

__all__ = ["cli"]


@click.command()
@options("model")
@click.argument("texts", nargs=-1, metavar="[TEXT]...", callback=utf8_text("TEXT"))
@options("corpus", "image", "level", "select", "maps_out", "attention", "batching", "truncate", "json", "quiet",
         "device")
def cli(model_name, texts, corpus_path, limit, images, level, layers, heads, out_path, attention, memory_budget,
        batch_size, truncate, as_json, quiet, placement) -> None:
    """Write the attention maps of TEXT... (and/or --corpus FILE, or --image FILE) to --out.

    An image's units are its patches at either --level.

    \b
    One map per text (or image): [layer, head, query, key], float32, rows summing to 1, with its labels,
    spans, special-unit marks ([CLS], <bos>, registers) and, for an image, each patch's (row, column).
    The suffix of --out picks the format:
      .safetensors  a tensor per map (map0, map1, ...); the labels in the file's metadata
      .npz          an array per map (map0, ...), the labels in the array 'headscope' (JSON)
      .pt           torch.save of a dict: map0, ... and 'headscope' (written from memory)
      .parquet      long format: map, text, layer, head, query, query_label, key, key_label, weight
    hs.load_maps(FILE) reads any of them back as AttentionMaps; numpy or torch alone read the arrays
    (np.load(FILE)["map0"], safetensors.torch.load_file(FILE)["map0"]).

    \b
    A text too long for eager attention (--attention auto, --memory-budget) is recomputed and written one
    layer at a time; what would not fit (a layer over the budget, a .pt file over it, a file larger than
    the free disk) is refused before any compute. --force replaces only a file headscope wrote.

    \b
    Example:
      headscope extract --model minilm "The cat sat on the mat." --level token --out attention.safetensors
    """
    from headscope import extract_file

    if corpus_path is None and limit is not None:
        fail("--limit counts the texts of --corpus; give --corpus FILE with it")
    all_texts = list(texts)
    if corpus_path is not None:
        all_texts += corpus_or_fail(corpus_path, limit).texts
    if not all_texts and not images:
        fail("nothing to extract: give one or more TEXT arguments, --corpus FILE or --image FILE")
    lm = load_or_fail(model_name, placement)
    with refusals(model_name, FileNotFoundError):
        result = extract_file(lm, all_texts or None, out_path, images=list(images) or None, level=level, layers=layers,
                              heads=heads, attention=attention, budget=memory_budget, batch_size=batch_size,
                              truncate=truncate, force=True, progress=not quiet)
    emit(result, as_json=as_json)  # the maps file is written by extract_file, atomically, as it computes
