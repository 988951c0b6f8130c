"""The options every command shares, each declared once here (a `SharedOption`) and composed by name with `options`.

    @click.command()
    @options("model", "corpus", "batching", top(3), "heads", "out", "json", "quiet", "device")
    def cli(model_name, corpus_path, limit, batch_size, k, heads, out_path, as_json, quiet, placement): ...

A group is a decorator that adds one or more options; `options` applies groups in the order given, which is
the order `--help` lists them. Each option has one help text and one default wherever it appears; a call
(`top(3)`, `model(default="smollm2")`) sets only a default, and only where `PER_COMMAND_DEFAULTS` says why;
what an option does in one command goes into that command's docstring. `tests/test_option_homes.py` scans the
command tree for an option two commands declare differently. The groups and the parameter each one gives:

    model       --model NAME (model_name)          models      --model NAME, repeatable (models)
    corpus      --corpus FILE, --limit N (corpus_path, limit)
    limit       --limit N alone (limit)            level       --level word|token (level)
    special     --special/--no-special (include_special)
    batching    --batch-size N (batch_size)        seed        --seed N (seed)
    top         --top K, rows shown, never what is computed (k)
    truncate    --truncate (truncate)
    head        --head L1H3, one head as (layer, head) (head; `head(option="--sender")` for patch's sender)
    heads       --heads L1H3,L2H0 as [(layer, head), ...] (heads)
    select      --layers 0,2 and --head-indices 0,3: which layers, and which heads of each, by index (layers, heads)
    out         --out FILE, a table by its suffix, and --force (out_path)
    maps_out    --out FILE, attention maps by its suffix (probe.mapfiles), required, and --force (out_path)
    report      --report DIR, the HTML report folder, and --force (report_dir)
    force       --force alone, read by --out and --report (`outputs.forced`)
    figure      --figure FILE, never an existing file (figure_path)
    json        --json (as_json)                   quiet       --quiet (quiet)
    verify      --no-verify (no_verify)            image       --image FILE, repeatable (images)
    attention   --attention, --memory-budget (attention, memory_budget)
    device      --device, --dtype, --max-memory, --offload-folder, given as one `hs.Placement` (placement)
    permutations --permutations N (permutations)   method      --method mean|zero|uniform (method)
    ablation_texts --ablation-texts N              random      --random N, random head sets (n_random)
    occurrence  --occurrence N                     induction   --induction-seqs N (induction_seqs)
    texts       --text, --target, repeatable (texts, targets)
    prompt      --prompt TEXT (prompt; `prompt(multiple=True)`: prompts)
    treebank    --conllu FILE, --select-on FILE (conllu_path, select_path)

An option renamed in this release keeps its old spelling for one release, hidden, with one line on stderr
(`renamed`: ablate --top METRIC:K is --heads-by, patch --top K is --confirm, run --out DIR is --report, sinks
--length is --sequence-length and --ablation/--no-ablation --dormant/--no-dormant, coref --random-sets is --random).

Head names are read by `probe.types.parse_head` (the inverse of `head_name`), the parser the workflows use;
a bad one is one line naming the option, exit 2, before any model loads.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Callable

import click

from headscope.probe.names import (DEFAULT_ABLATION_METHOD, DEFAULT_ATTENTION, DEFAULT_INCLUDE_SPECIAL, DEFAULT_LEVEL,
                                   AblationMethod, Attention, DType, Level, choices, device_spec)
from headscope.probe.sizes import parse_max_memory, parse_size  # the API's own readers: one value, one meaning

from .exits import fail
from .outputs import check_maps_path, check_report_dir, check_table_path, new_figure_or_fail, remember_force

__all__ = ["options", "GROUPS", "model", "models", "corpus", "limit", "level", "special", "batching", "seed", "top",
           "truncate", "head", "heads", "select", "out", "maps_out", "figure", "json", "quiet", "verify", "image", "attention", "device",
           "parsed", "utf8_text", "parse_size", "parse_max_memory"]

Decorator = Callable[[Callable], Callable]


class SharedOption(click.Option):
    """An option declared here, once, for every command that takes it (`tests/test_option_homes.py` finds an option
    that two commands declare apart)."""


_option = functools.partial(click.option, cls=SharedOption)


def _together(*decorators: Decorator) -> Decorator:
    """One decorator applying `decorators` so that `--help` lists their options in the order given."""
    def apply(fn: Callable) -> Callable:
        for decorate in reversed(decorators):
            fn = decorate(fn)
        return fn

    return apply


def options(*groups: str | Decorator) -> Decorator:
    """The option groups `groups` (a name from `GROUPS`, or a group already called with its settings), in order."""
    unknown = [g for g in groups if isinstance(g, str) and g not in GROUPS]
    if unknown:
        raise ValueError(f"no option group {', '.join(map(repr, unknown))}; the groups are {', '.join(GROUPS)}")
    return _together(*(GROUPS[g]() if isinstance(g, str) else g for g in groups))


# ---------------------------------------------------------------- parsing a value


def parsed(parse: Callable[[str], Any], option: str):
    """A click callback giving `parse(value)` (None stays None); a ValueError is one line naming `option`, exit 2."""
    def callback(ctx, param, value: str | None):
        if value is None:
            return None
        try:
            return parse(value)
        except ValueError as exc:
            fail(f"{option} {exc}")

    return callback


def utf8_text(option: str):
    """A click callback that refuses a text argument that is not UTF-8 (one value or a repeated option's tuple).

    A byte that is not UTF-8 in argv reaches Python as a lone surrogate, which the tokenizer would meet
    after the model has loaded, with a bare TypeError.
    """
    def callback(ctx, param, value):
        for i, text in enumerate((value,) if isinstance(value, str) else value or (), start=1):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                which = option if isinstance(value, str) else f"{option} {i}"
                code = ord(text[exc.start])  # an undecodable byte b arrives as U+DC00 + b (surrogateescape)
                what = f"the byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"a lone surrogate {text[exc.start]!r}"
                fail(f"{which} is not UTF-8 text (character {exc.start + 1} is {what}); pass the text in UTF-8")
        return value

    return callback


def _head_name(text: str) -> tuple[int, int]:
    from headscope.probe.types import parse_head  # imported when the option is given: it imports torch

    return parse_head(text)


def _head_or_number(text: str) -> tuple[int, int] | int:
    return int(text) if text.strip().isdigit() else _head_name(text)


def _indices(text: str) -> list[int]:
    """`0,2,5` as [0, 2, 5] (the model's indices, from 0)."""
    parts = [p.strip() for p in str(text).split(",")]
    if not all(p.isascii() and p.isdigit() for p in parts):
        raise ValueError(f"{text!r} is not a list of indices; give whole numbers from 0, separated by commas (0,2,5)")
    return [int(p) for p in parts]


def _head_names(text: str) -> list[tuple[int, int]]:
    from headscope.probe.types import parse_heads

    return parse_heads(text)


# ---------------------------------------------------------------- renamed options


def renamed(old: str, new: str, name: str, *, value: str = "", callback: Callable | None = None,
            **settings: Any) -> Decorator:
    """`old`, the spelling of `new` before this release, kept hidden for one release: what it is given goes to
    `new`'s parameter `name`, with one line on stderr. `value` is how the option's value is written in that line
    (`METRIC:K`); `callback` is `new`'s own check, run on the value as `new` runs it.

    Hidden aliases are left out of `--help` and of the one-declaration scan (`tests/test_option_homes.py`)."""
    def moved(ctx, param, given):
        if given is None:  # not on the command line
            return None
        shown = f" {value}" if value else ""
        click.echo(f"headscope: {ctx.info_name} {old}{shown} is deprecated: write {new}{shown} (the old spelling "
                   "works for one more release)", err=True)
        if callback is not None:
            given = callback(ctx, param, given)
        # Set here, outside click's own bookkeeping, so the new option's default does not replace it afterwards.
        ctx.params[name] = given
        return given

    return click.option(old, f"old_{name}", hidden=True, default=None, expose_value=False, callback=moved,
                        **settings)


# ---------------------------------------------------------------- the groups

# One help per option: what it is, the same in every command that takes it (the command's docstring says what
# it does there). A group's call may set only the default, and only where `PER_COMMAND_DEFAULTS` says why.
PER_COMMAND_DEFAULTS: dict[str, str] = {
    "--model": "`generate` needs a decoder (smollm2); every other command starts from minilm",
    "--top": "rows shown, and a row is a head of each metric (heads), a key of each step (generate) or one line of "
             "a ranked list (the others): 3 rows of a grouped listing, 10 of a list",
    "--random": "an empirical p over random sets (ablate, patch, sinks, coref) needs 19 to reach 0.05; retrieval "
                "averages its 10 in a paired test over needles, and each set costs a masked generation of every "
                "needle",
}

_MODEL_HELP = ("Packaged name, folder, GGUF file or hub id (NAME@REVISION); run and serve take several (repeat it, or "
               "separate names with commas).")


def model(*, default: str = "minilm") -> Decorator:
    """--model NAME (default minilm)."""
    return _option("--model", "model_name", default=default, show_default=True, help=_MODEL_HELP)


def models() -> Decorator:
    """--model NAME, repeatable (or comma-separated): the commands that take several models (run, serve)."""
    return _option("--model", "models", multiple=True, default=("minilm",), show_default=True, help=_MODEL_HELP)


def limit() -> Decorator:
    """--limit N: only the first N texts, sentences or examples of what a command reads."""
    return _option("--limit", type=click.IntRange(min=1), default=None,
                   help="Use only the first N texts (sentences, examples) of each input file; a subset: say so "
                        "when you report.")


def corpus() -> Decorator:
    """--corpus FILE (default: the built-in corpus) and --limit N of its texts."""
    return _together(_option("--corpus", "corpus_path", type=click.Path(dir_okay=False), default=None,
                             help="Text file (one text per line) or JSONL with a 'text' field; default: the "
                                  "built-in corpus."),
                     limit())


def level() -> Decorator:
    """--level word|token (default word)."""
    return _option("--level", type=click.Choice(choices(Level, first=DEFAULT_LEVEL)), default=DEFAULT_LEVEL,
                   show_default=True, help="Units: words (a word's pieces summed as keys, averaged as queries; "
                                           "Clark et al. 2019) or sub-word tokens.")


def special() -> Decorator:
    """--special/--no-special: keep the special tokens as units (default), or drop them."""
    return _option("--special/--no-special", "include_special", default=DEFAULT_INCLUDE_SPECIAL, show_default=True,
                   help="Keep [CLS]/[SEP]/<bos> as units, or drop them and renormalise each row.")


def batching() -> Decorator:
    """--batch-size N (default 8)."""
    return _option("--batch-size", type=click.IntRange(min=1), default=8, show_default=True)


def seed() -> Decorator:
    """--seed N (default 0)."""
    return _option("--seed", type=int, default=0, show_default=True,
                   help="Seed of every random choice (splits, samples, random heads and sequences): the same seed, "
                        "the same result.")


def top(default: int = 10) -> Decorator:
    """--top K: how many of the strongest rows the text output shows (the parameter `k`); never what is computed."""
    return _option("--top", "k", type=click.IntRange(min=1), default=default, show_default=True,
                   help="Rows shown, the strongest first (--out holds every row).")


def truncate() -> Decorator:
    """--truncate."""
    return _option("--truncate", is_flag=True, help="Cut texts longer than the model's context instead of failing.")


def head(*, option: str = "--head", name: str = "head", required: bool = False, bare: bool = False) -> Decorator:
    """One head, `L2H3` (or `2,3`), given to the command as (layer, head); `bare`: a bare number passes as an int
    (a head of the layer another option names). `option="--sender"`: patch's sender head."""
    text = {"--head": "A head, e.g. L2H3 or 2,3 (model indices, from 0).",
            "--sender": "With --what path: the sender head, e.g. L9H6."}[option]
    return _option(option, name, required=required, default=None, metavar="LxHy", help=text,
                   callback=parsed(_head_or_number if bare else _head_name, option))


def heads() -> Decorator:
    """--heads L16H0,L18H6, given to the command as [(layer, head), ...]."""
    return _option("--heads", "heads", default=None, metavar="LxHy,...", help="Heads, e.g. L16H0,L18H6.",
                   callback=parsed(_head_names, "--heads"))


def permutations() -> Decorator:
    """--permutations N (default 10,000): Monte Carlo permutations of each permutation test."""
    return _option("--permutations", "permutations", type=click.IntRange(min=100), default=10_000,
                   show_default=True, help="Monte Carlo permutations per test.")


def method() -> Decorator:
    """--method mean|zero|uniform (default `DEFAULT_ABLATION_METHOD`, mean, as the API's): how a head is ablated."""
    return _option("--method", type=click.Choice(choices(AblationMethod, first=DEFAULT_ABLATION_METHOD)),
                   default=DEFAULT_ABLATION_METHOD,
                   show_default=True,
                   help="How a head is ablated: its mean output (over the corpus, else the first 64 built-in "
                        "texts), zero, or uniform attention.")


def ablation_texts() -> Decorator:
    """--ablation-texts N (default 32): the texts every single-head ablation is measured on."""
    return _option("--ablation-texts", type=click.IntRange(min=1), default=32, show_default=True,
                   help="Corpus texts every single-head ablation is measured on.")


def random_sets(default: int = 19) -> Decorator:
    """--random N (default 19): random head sets of the same size that an effect is compared with."""
    return _option("--random", "n_random", type=click.IntRange(min=1), default=default, show_default=True,
                   help="Random head sets of the same size that the effect is compared with (an empirical p needs "
                        "19 to reach 0.05).")


def occurrence() -> Decorator:
    """--occurrence N (default 0): which occurrence of the query token."""
    return _option("--occurrence", type=click.IntRange(min=0), default=0, show_default=True,
                   help="Which occurrence of the query token (0-based: 0 is the first).")


def texts() -> Decorator:
    """--text (repeatable) and --target (repeatable, encoder-decoder models): the texts a command reads."""
    return _together(
        _option("--text", "texts", multiple=True, callback=utf8_text("--text"),
                help="A text to read (repeatable); replaces the command's built-in examples."),
        _option("--target", "targets", multiple=True, callback=utf8_text("--target"),
                help="Encoder-decoder models: the decoder's text for each --text, in order (repeatable); default: "
                     "one made from each --text."))


def prompt(*, multiple: bool = False) -> Decorator:
    """--prompt TEXT (required; `multiple`: repeatable): the text the model continues."""
    return _option("--prompt", "prompts" if multiple else "prompt", required=True, multiple=multiple,
                   callback=utf8_text("--prompt"), help="The text the model continues.")


def treebank(*, required: bool = False) -> Decorator:
    """--conllu FILE and --select-on FILE: the CoNLL-U treebank the syntax heads are scored on, and one to choose
    them on."""
    return _together(
        _option("--conllu", "conllu_path", required=required, default=None, metavar="FILE",
                help="The CoNLL-U treebank the syntax heads are scored on."),
        _option("--select-on", "select_path", default=None, metavar="FILE",
                help="A second CoNLL-U file to choose heads and offsets on (e.g. dev -> test); without it, a "
                     "seeded random half of --conllu. Needs --conllu."))


def induction() -> Decorator:
    """--induction-seqs N (default 20): repeated random sequences for the induction scores."""
    return _option("--induction-seqs", type=click.IntRange(min=0), default=20, show_default=True,
                   help="Repeated random sequences for the induction and duplicate-token scores (decoders; 0 "
                        "skips).")


def select() -> Decorator:
    """--layers 0,2 and --head-indices 0,3: the layers kept, and the heads kept in each of them, by the model's
    indices (`probe.maps.select_layers` / `select_heads` check them against the model). Not `--heads`: that name
    means head names (L16H0,L18H6) wherever it appears."""
    return _together(
        _option("--layers", "layers", default=None, metavar="N,...", callback=parsed(_indices, "--layers"),
                     help="Only these layers (model indices from 0, e.g. 0,5); default: every attention layer."),
        _option("--head-indices", "heads", default=None, metavar="N,...",
                     callback=parsed(_indices, "--head-indices"),
                     help="Only these heads of each layer (indices from 0, e.g. 0,3); default: all."))


def force() -> Decorator:
    """--force: replace an output that exists. Read first (eager), so the checks of --out and --report know it
    (`common.outputs.forced`)."""
    return _option("--force", is_flag=True, is_eager=True, expose_value=False, callback=remember_force,
                   help="Replace an existing --out file or --report folder (atomically: the old one stays until the "
                        "new one is complete); a report folder or attention file only when headscope wrote it.")


_OUT_HELP = ("The file to write, its format by the suffix: a table (.csv, .parquet, .json), or extract's attention "
             "maps (.safetensors, .npz, .pt, .parquet); missing folders are created.")


def maps_out() -> Decorator:
    """--out FILE (required): attention maps, as .safetensors, .npz, .pt or .parquet by the suffix
    (`probe.mapfiles.MAP_FORMATS`), and --force to replace a maps file headscope wrote (never another file).
    Checked before any model loads."""
    return _together(force(), _option("--out", "out_path", type=click.Path(dir_okay=False, path_type=Path),
                                      required=True, default=None, callback=check_maps_path, metavar="FILE",
                                      help=_OUT_HELP))


def out() -> Decorator:
    """--out FILE: the command's full table, as .csv, .parquet or .json, and --force to replace one.

    Checked before any compute; `--force` is read first (eager), so the check of --out knows it.
    """
    return _together(force(), _option("--out", "out_path", type=click.Path(dir_okay=False, path_type=Path),
                                      default=None, callback=check_table_path, metavar="FILE", help=_OUT_HELP))


def report(*, required: bool = False) -> Decorator:
    """--report DIR: the HTML report folder (run, compare), checked before any model loads, and --force. Not `--out`:
    that name is a file wherever it appears. `required` is checked by the command (`common.outputs.report_or_fail`),
    so that run's old spelling `--out DIR` (`renamed`) can still give it for one release."""
    return _together(force(), _option("--report", "report_dir", type=click.Path(file_okay=False, path_type=Path),
                                      default=None, metavar="DIR", callback=check_report_dir,
                                      help="Write the HTML report (index.html, figures, CSV tables, run.json) into "
                                           "this folder (created; an existing one only with --force, and only when "
                                           "headscope wrote it)."))


def figure() -> Decorator:
    """--figure FILE: a figure beside the text output; an existing file is refused."""
    return _option("--figure", "figure_path", type=click.Path(dir_okay=False), default=None,
                   help="Also write the command's figure (.png, .svg or .pdf; never over an existing file).",
                   callback=new_figure_or_fail)


def json() -> Decorator:
    """--json: one JSON object on stdout instead of text."""
    return _option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")


def quiet() -> Decorator:
    """--quiet: no progress on stderr (--no-progress is kept as a hidden alias)."""
    return _together(_option("--quiet", "quiet", is_flag=True, help="No progress on stderr."),
                     _option("--no-progress", "quiet", is_flag=True, hidden=True))


def verify() -> Decorator:
    """--no-verify."""
    return _option("--no-verify", is_flag=True, help="Skip recomputing the attention from scratch before the analysis.")


def image() -> Decorator:
    """`--image FILE` (repeatable): the images a vision transformer reads instead of texts, or a vision–language
    decoder reads with them (one per image slot)."""
    return _option("--image", "images", multiple=True, type=click.Path(dir_okay=False, path_type=str),
                        help="Image file (PNG, JPEG) for a vision transformer (ViT, DeiT, DINOv2, CLIP/SigLIP "
                             "vision tower), or for a vision–language decoder (LLaVA, Gemma 3, PaliGemma) one per "
                             "image slot of the text; repeatable; its image processor resizes and normalises it.")


def attention() -> Decorator:
    """--attention eager|recompute|auto and --memory-budget: how attention is obtained (`probe.recompute`)."""
    return _together(
        _option("--attention", type=click.Choice(choices(Attention)), default=DEFAULT_ATTENTION, show_default=True,
                     help="The model's eager attention weights, or recomputed from scratch in blocks of query rows "
                          "(long texts: no layers × heads × T² tensor), or recomputed only where eager would "
                          "exceed --memory-budget. Recomputation is checked against eager on a short prefix."),
        _option("--memory-budget", "memory_budget", default=None, metavar="SIZE",
                     callback=parsed(parse_size, "--memory-budget"),
                     help="Bytes that eager attention may take before --attention auto recomputes it and "
                          "--attention eager refuses the text (8GB, 512MiB; default: a quarter of RAM)."))


def _placed(fn: Callable) -> Callable:
    """The command `fn` given one `placement` (`hs.Placement`) instead of the four values of `device`'s options."""
    @functools.wraps(fn)
    def command(*args, device: str, dtype: str, max_memory: dict | None, offload_folder: Path | None, **kwargs):
        from headscope.probe.device_placement import Placement

        return fn(*args, placement=Placement(device=device, dtype=dtype, max_memory=max_memory,
                                             offload_folder=offload_folder), **kwargs)

    return command


def device() -> Decorator:
    """--device, --dtype, --max-memory and --offload-folder: where a model's weights go, given to the command as one
    `placement` (`hs.Placement`), the value `hs.load(name, placement=...)` takes (`common.loading.load_or_fail`)."""
    return _together(
        _option("--device", default="cpu", show_default=True, metavar="auto|cpu|cuda|cuda:N|mps",
                callback=parsed(device_spec, "--device"),
                help="Where to run; 'auto' spreads a model too large for one GPU via accelerate's device_map."),
        _option("--dtype", type=click.Choice(choices(DType)), default="float32", show_default=True,
                help="Weights and compute dtype."),
        _option("--max-memory", "max_memory", default=None, metavar="DEV=SIZE,...",
                callback=parsed(parse_max_memory, "--max-memory"),
                help="The most each device may hold (cpu=300MB, or 0=20GiB,1=20GiB,cpu=60GiB); accelerate "
                     "places the layers that do not fit on the next device, then in --offload-folder."),
        _option("--offload-folder", "offload_folder", default=None, metavar="DIR",
                type=click.Path(path_type=Path),
                help="Folder for the layers that fit on no device: read from disk one layer at a time."),
        _placed)


# Every group by name, with its defaults: what `options("corpus", ...)` looks up.
GROUPS: dict[str, Callable[[], Decorator]] = {
    "model": model, "models": models, "corpus": corpus, "limit": limit, "level": level, "special": special,
    "batching": batching, "seed": seed, "top": top, "truncate": truncate, "head": head, "heads": heads,
    "select": select, "out": out, "maps_out": maps_out, "report": report, "force": force, "figure": figure,
    "json": json, "quiet": quiet, "verify": verify, "image": image, "attention": attention, "device": device,
    "permutations": permutations, "method": method, "ablation_texts": ablation_texts, "random": random_sets,
    "occurrence": occurrence, "texts": texts, "prompt": prompt, "treebank": treebank, "induction": induction,
}
