"""What every command shares: one option set, loading with a clear error, table and JSON output.

The options are defined once here, as decorators, so that every command spells them the same:
`--model`, `--device`, `--dtype`, `--quiet`, `--json` and `--out FILE` (a table; its suffix picks
the format) with `--force`. Every `--out` is checked before any model loads: an existing file is
refused unless `--force`, and the folder it goes into must take a new file (missing parent folders
are created when the output is written, never before).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import click

from headscope.probe.names import DEFAULT_ATTENTION, Attention, Device, DType, choices

__all__ = [
    "fail", "model_option", "models_option", "device_options", "quiet_option", "json_option", "out_option",
    "TABLE_WRITERS", "write_table", "writable_or_fail", "load_or_fail", "echo_json", "verify_option", "verify_step",
    "finish", "say", "Interrupts", "committed", "too_long_or_fail", "attention_options", "parse_size", "attention_note", "parsed", "new_file_or_fail",
    "join_run", "check_out", "Corpus", "corpus_or_fail", "utf8_text", "flag_spelling", "models_or_fail", "refusals",
]


def fail(message: str, code: int = 2) -> None:
    """Print `message` to stderr as one line and exit with `code` — no traceback wall.

    The API's spelling of a choice in the message (`attention='eager'`) becomes the flag's (`--attention eager`).
    """
    line = "; ".join(part.strip() for part in str(message).splitlines() if part.strip())
    click.echo(f"headscope: {flag_spelling(line)}", err=True)
    sys.exit(code)


@contextmanager
def refusals(model_name: str, *bad: type[BaseException]):
    """Inside: a model headscope cannot take apart ends in one line and exit 3, a bad argument (TypeError,
    ValueError, and any of `bad`) in one line and exit 2 — the mapping every command that computes shares."""
    from headscope.probe.families import UnsupportedArchitecture, UnsupportedFeature

    try:
        yield
    except (UnsupportedArchitecture, UnsupportedFeature) as exc:
        fail(str(exc) if str(exc).startswith(model_name) else f"{model_name}: {exc}", code=3)
    except (TypeError, ValueError, *bad) as exc:
        fail(str(exc))


# Keyword arguments of the API whose CLI flag has the same name and takes the same values.
_FLAG_KEYWORDS = ("attention",)


def flag_spelling(message: str) -> str:
    """`message` with each API keyword choice (`attention='eager'`) written as its flag (`--attention eager`).

    >>> flag_spelling("recomputed attention covers encoders only, use attention='eager'")
    'recomputed attention covers encoders only, use --attention eager'
    """
    import re

    return re.sub(rf"\b({'|'.join(_FLAG_KEYWORDS)})=(['\"])([\w-]+)\2", r"--\1 \3", message)


# ---------------------------------------------------------------- options


_MODEL_HELP = "Packaged name, folder or hub id."


def model_option(fn):
    """--model NAME (default minilm)."""
    return click.option("--model", "model_name", default="minilm", show_default=True, help=_MODEL_HELP)(fn)


def models_option(fn):
    """--model NAME, repeatable (or comma-separated): the commands that compare models side by side."""
    return click.option("--model", "models", multiple=True, default=("minilm",), show_default=True,
                        help=f"{_MODEL_HELP} Repeat (or separate with commas) to compare models side by side.")(fn)


def device_options(fn):
    """--device and --dtype, the way every command takes them."""
    fn = click.option("--dtype", type=click.Choice(choices(DType)), default="float32",
                      show_default=True, help="Weights and compute dtype.")(fn)
    fn = click.option("--device", type=click.Choice(choices(Device)), default="cpu", show_default=True,
                      help="Where to run; 'auto' spreads a model too large for one GPU via accelerate's device_map.")(fn)
    return fn


def quiet_option(fn):
    """--quiet: no progress on stderr (--no-progress is kept as a hidden alias)."""
    fn = click.option("--no-progress", "quiet", is_flag=True, hidden=True)(fn)
    return click.option("--quiet", "quiet", is_flag=True, help="No progress on stderr.")(fn)


def json_option(fn):
    """--json: one JSON object on stdout instead of text."""
    return click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")(fn)


_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(text: str) -> int:
    """Bytes from `8GB`, `512MiB`, `1.5 GB` or a plain number of bytes.

    >>> parse_size("8GB"), parse_size("512MiB"), parse_size("1000")
    (8000000000, 536870912, 1000)
    """
    import re

    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = m and m.group(2).lower()
    if not m or unit not in _SIZE_UNITS or int(float(m.group(1)) * _SIZE_UNITS[unit]) < 1:
        raise ValueError(f"{text!r} is not a size; give bytes such as 8GB, 512MiB or 1000000")
    return int(float(m.group(1)) * _SIZE_UNITS[unit])


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


def image_option(fn):
    """`--image FILE` (repeatable): the images a vision transformer reads instead of texts."""
    return click.option("--image", "images", multiple=True, type=click.Path(dir_okay=False, path_type=str),
                        help="Image file (PNG, JPEG) for a vision transformer (ViT, DeiT, DINOv2, CLIP/SigLIP "
                             "vision tower), repeatable; its image processor resizes and normalises it.")(fn)


def attention_options(fn):
    """--attention eager|recompute|auto and --memory-budget: how attention is obtained (`probe.recompute`)."""
    fn = click.option("--memory-budget", "memory_budget", default=None, metavar="SIZE", callback=parsed(parse_size, "--memory-budget"),
                      help="Bytes that eager attention may take before --attention auto recomputes it and "
                           "--attention eager refuses the text (8GB, 512MiB; default: a quarter of RAM).")(fn)
    return click.option("--attention", type=click.Choice(choices(Attention)), default=DEFAULT_ATTENTION,
                        show_default=True,
                        help="The model's eager attention weights, or recomputed from scratch in blocks of query rows "
                             "(long texts: no layers × heads × T² tensor), or recomputed only where eager would "
                             "exceed --memory-budget. Recomputation is checked against eager on a short prefix.")(fn)


def attention_note(meta: dict) -> str | None:
    """One line on how attention was obtained, for text output; None for a plain eager run."""
    how = meta.get("attention")
    if not how:
        return None
    line = (f"attention: {how['recompute']} of {how['eager'] + how['recompute']} texts recomputed in blocks "
            f"(--attention {how['asked']}, budget {how['budget'] / 1e9:.2f} GB)")
    check = meta.get("check")
    return f"{line}; {check['summary']}" if check else line


def verify_option(fn):
    return click.option("--no-verify", is_flag=True,
                        help="Skip recomputing the attention from scratch before the analysis.")(fn)


# ---------------------------------------------------------------- tables


def _write_csv(table, path: Path) -> None:
    table.to_csv(path, index=False)


def _write_parquet(table, path: Path) -> None:
    table.to_parquet(path, index=False)


def _write_json(table, path: Path) -> None:
    from headscope.probe.types import json_safe

    rows = json_safe(table.to_dict(orient="records"))
    path.write_text(json.dumps(rows, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# A table's file format, by the suffix of --out.
TABLE_WRITERS: dict[str, Callable[[Any, Path], None]] = {
    ".csv": _write_csv,
    ".parquet": _write_parquet,
    ".json": _write_json,
}


_FORCE = "headscope.force"  # ctx.meta key: --force, read by --out's check


def _remember_force(ctx, param, value: bool) -> bool:
    ctx.meta[_FORCE] = value
    return value


def _check_table_path(ctx, param, value: Path | None) -> Path | None:
    if value is None:
        return None
    if value.suffix not in TABLE_WRITERS:
        fail(f"--out {value}: use a {', '.join(TABLE_WRITERS)} file name")
    writable_or_fail(value, "--out")  # first: a name too long for the file system cannot even be looked at
    if value.is_dir():
        fail(f"--out {value} is a folder; give a file name ending in {', '.join(TABLE_WRITERS)}")
    new_file_or_fail(value, "--out")
    return value


def new_file_or_fail(path: Path, option: str) -> None:
    """Refuse, before any compute, an output file that exists (unless --force was given), cannot be written,
    is a symbolic link, or is another output of the same command."""
    writable_or_fail(path, option)  # first: a name too long for the file system cannot even be looked at
    if path.is_symlink():
        fail(f"{option} {path} is a symbolic link (to {os.readlink(path)}); headscope does not write through links: "
             "give the file itself or a new name")
    if path.is_dir():
        fail(f"{option} {path} is a folder; give a file name")
    _claim_output(path, option, folder=False)
    if path.exists() and not click.get_current_context().meta.get(_FORCE, False):
        fail(f"{option} {path} already exists; pass --force to replace it, or choose another file")


_OUTPUTS = "headscope.outputs"  # ctx.meta key: {resolved path: (option, is a folder)}, every output claimed so far


def _claim_output(path: Path, option: str, *, folder: bool) -> None:
    """Fail when `path` is (or, for a file, lies inside) an output that another option of this command writes."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return
    claimed = ctx.find_root().meta.setdefault(_OUTPUTS, {})
    here = Path(os.path.realpath(path))
    for other, (other_option, other_folder) in claimed.items():
        if other_option == option:
            continue
        if other == here or (other_folder and other in here.parents) or (folder and here in other.parents):
            fail(f"{option} {path} and {other_option} name the same {'folder' if folder or other_folder else 'file'}; "
                 "two outputs of one command may not overwrite each other: give each its own name")
    claimed[here] = (option, folder)


def out_option(fn):
    """--out FILE: the command's full table, as .csv, .parquet or .json, and --force to replace one.

    Checked before any compute; `--force` is read first (eager), so the check of --out knows it.
    """
    fn = click.option("--out", "out_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
                      callback=_check_table_path, expose_value=True,
                      help="Write the full table here: .csv, .parquet or .json by the suffix "
                           "(missing folders are created).")(fn)
    return click.option("--force", is_flag=True, is_eager=True, expose_value=False, callback=_remember_force,
                        help="Replace an existing output file (atomically: the old one stays until the new one "
                             "is complete).")(fn)


def writable_or_fail(target: Path, option: str) -> None:
    """Fail now, before any compute, when `target` could not be written.

    Its nearest existing folder must take a new file: an anonymous temporary file is made there and
    removed at once, so the check leaves nothing behind (missing folders are created later, by the
    writer).
    """
    from headscope.probe.folders import writable

    problem = writable(target)
    if problem:
        fail(f"{option} {target}: {problem}")


def write_table(table, path: Path) -> None:
    """Write a DataFrame to `path` in the format its suffix names; a failure is one error line.

    Missing folders are created. The table goes to a temporary file beside `path` that is renamed
    over it when complete, so a replaced file is never half written.
    """
    path = Path(path)
    tmp: Path | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Named here but created by the writer, so the file gets the user's umask (mkstemp would make it 0600).
        tmp = path.with_name(f".{path.name}.partial-{os.getpid()}-{os.urandom(4).hex()}{path.suffix}")
        TABLE_WRITERS[path.suffix](table, tmp)
        os.replace(tmp, path)
        tmp = None
        committed(str(path))()
    except (OSError, ImportError) as exc:
        fail(f"could not write {path}: {getattr(exc, 'strerror', None) or exc}")
    finally:
        if tmp is not None:
            with suppress(OSError):
                tmp.unlink()


# ---------------------------------------------------------------- inputs


def check_out(out: Path, force: bool, option: str = "--out") -> None:
    """Refuse, before any work, a report folder (`option`) that must not be replaced or cannot be written."""
    from headscope.reports.folder import ReportFolderError, check_report_folder

    try:
        check_report_folder(out, force=force, option=option)
    except ReportFolderError as exc:
        fail(str(exc))
    _claim_output(out, option, folder=True)


@dataclass(frozen=True)
class Corpus:
    """The texts of `--corpus` (or the built-in corpus), checked before any model loads.

    `texts` is a list, or (`stream=True`) an iterator over the file read again lazily; `lines` holds
    each text with its file and line (`analyses.corpus.CorpusLine`) when they were read into memory,
    so a text too long for a model can be named by its line.
    """

    texts: Any
    total: int
    source: str
    path: str | None
    lines: tuple = ()


def corpus_or_fail(path: str | None, limit: int | None = None, *, stream: bool = False) -> Corpus:
    """The corpus of `--corpus PATH` (the first `limit` texts), or the built-in one; a bad file is one line, exit 2.

    A file is read once through to check every line; with `stream` its texts are then read again as
    they are scored (a corpus larger than memory), else they are kept.
    """
    from itertools import islice

    from headscope.analyses.corpus import CorpusError, builtin_corpus, iter_corpus, iter_corpus_lines

    if path is None:
        texts = builtin_corpus()[:limit] if limit else builtin_corpus()
        return Corpus(texts=texts, total=len(texts), source="built-in corpus", path=None)
    try:
        if stream:
            total = sum(1 for _ in islice(iter_corpus(path), limit))  # the checking pass: a bad line fails here
            lines: tuple = ()
        else:
            lines = tuple(islice(iter_corpus_lines(path), limit))
            total = len(lines)
    except FileNotFoundError:
        fail(f"--corpus {path}: no such file; give a text file with one text per line (or JSONL with a 'text' "
             "field), or leave --corpus out for the built-in corpus")
    except (CorpusError, OSError, UnicodeError, ValueError) as exc:
        fail(f"--corpus {path}: {exc}")
    if not total:
        fail(f"--corpus {path}: the file holds no texts (only empty lines); give one text per line")
    texts = islice(iter_corpus(path), limit) if stream else [line.text for line in lines]
    return Corpus(texts=texts, total=total, source=str(path), path=str(path), lines=lines)


# ---------------------------------------------------------------- running


def say(message: str, *, quiet: bool) -> None:
    """A progress line on stderr, unless --quiet."""
    if not quiet:
        click.echo(message, err=True)


def load_or_fail(name: str, device: str = "cpu", dtype: str = "float32"):
    """Load a model; an unknown or missing one exits with the list of offline models."""
    from headscope import load
    from headscope.probe.registry import ModelNotAvailable

    try:
        return load(name, device=device, dtype=dtype)
    except (ModelNotAvailable, RuntimeError) as exc:
        first, *more = str(exc).splitlines() or [""]
        fail(first + ("; `headscope models` lists the models that work offline" if more else ""))


def models_or_fail(names, option: str = "--model") -> None:
    """Check every model name before any work (`probe.loading.check_name`): a bad second --model is
    reported before the first model is loaded and analysed."""
    from headscope.probe.loading import check_name
    from headscope.probe.registry import ModelNotAvailable

    for name in names:
        try:
            check_name(name)
        except ModelNotAvailable as exc:
            first, *more = str(exc).splitlines() or [""]
            fail(f"{option} {first}" + ("; `headscope models` lists the models that work offline" if more else ""))


def join_run(device: str):
    """This process's `headscope.distributed.World` in a torchrun / accelerate launch run, its group joined.

    One process (no RANK / WORLD_SIZE in the environment) gets `World()` and joins nothing. The
    processes talk over gloo with --device cpu and over NCCL with --device cuda, each on the GPU of
    its LOCAL_RANK; the group is left when the command ends.
    """
    from headscope.distributed import process_group, world_from_env

    try:
        world = world_from_env()
    except ValueError as exc:
        fail(str(exc))
    if world.size == 1:
        return world
    if device not in ("cpu", "cuda"):
        fail(f"--device {device}: a torchrun run takes --device cpu (gloo) or cuda (NCCL, one GPU per process)")
    if device == "cuda":
        import torch

        if torch.cuda.is_available():  # otherwise loading the model says that CUDA is missing
            torch.cuda.set_device(world.local_rank)
    try:
        click.get_current_context().with_resource(process_group(world, backend="nccl" if device == "cuda" else "gloo"))
    except (RuntimeError, ValueError) as exc:
        fail(f"rank {world.rank} of {world.size} could not join the torchrun process group: {exc}")
    return world


def too_long_or_fail(lm, lines, *, truncate: bool, batch: int = 256) -> None:
    """Fail with the file and line of the first corpus text longer than `lm`'s context (unless `truncate`).

    `lines` are `analyses.corpus.CorpusLine`s; counted with special tokens, as extraction counts them.
    """
    from itertools import islice

    from headscope.probe.encoding import bounded_text

    if truncate:
        return
    stream = iter(lines)
    while chunk := list(islice(stream, batch)):
        looked = [bounded_text(lm.tokenizer, c.text, lm.max_length) for c in chunk]  # a huge line only in part
        for line, (_, cut), ids in zip(chunk, looked, lm.tokenizer([shown for shown, _ in looked])["input_ids"]):
            if len(ids) > lm.max_length:
                count = f"more than {lm.max_length} tokens ({len(line.text):,} characters)" if cut else f"{len(ids)} tokens"
                fail(str(line.error(f"the text has {count}; {lm.name} takes at most {lm.max_length}. "
                                    "Split it, or pass --truncate to keep its first tokens")))


def echo_json(obj: Any) -> None:
    """Strict JSON on stdout (NaN/inf as null), the same cleaning as the report's data block."""
    from headscope.probe.types import json_safe

    click.echo(json.dumps(json_safe(obj), indent=2, ensure_ascii=False))


def verify_step(lm, *, enabled: bool = True, keep: list | None = None) -> dict:
    """Verify `lm`'s attention before an analysis, so every result says what it stands on.

    Returns {"summary", "passed", "max_abs_err"} for the output. A mismatch is reported on stderr
    and makes the command exit 1 after its output (`finish`); an architecture without a
    family is stated, not hidden. `keep`: a list that receives the `Verification` (for a report).
    """
    from headscope import verify
    from headscope.probe.families import UnsupportedArchitecture, UnsupportedFeature

    if not enabled:
        return {"summary": "attention not verified (--no-verify)", "passed": None, "max_abs_err": None}
    try:
        v = verify(lm)
    except (UnsupportedArchitecture, UnsupportedFeature) as exc:
        from headscope.probe.forward import hybrid_note

        hybrid = hybrid_note(lm)  # which layers of a hybrid stack have attention: every command's output says so
        return {"summary": f"attention not verified: {exc}" + (f"\n{hybrid}" if hybrid else ""), "passed": None,
                "max_abs_err": None}
    if keep is not None:
        keep.append(v)
    if not v.passed:
        click.echo(f"headscope: {v.summary()} — run `headscope verify --model {lm.name}` for the per-layer table",
                   err=True)
    return {"summary": v.summary(), "passed": v.passed, "max_abs_err": v.max_abs_err}


def finish(verification: dict) -> None:
    """Exit 1 when the attention behind the output failed verification (the output is still printed)."""
    if verification.get("passed") is False:
        sys.exit(1)


# ---------------------------------------------------------------- Ctrl-C


class Interrupts:
    """Ctrl-C that cannot be lost: SIGINT raises KeyboardInterrupt as usual and is also remembered.

    A KeyboardInterrupt raised while Python runs a finaliser (a `__del__`, a weakref callback) would
    be printed as "Exception ignored ... KeyboardInterrupt:" and dropped, and the run would go on;
    `check()` raises it again at the next safe point (and the dropped one is not printed). Used as a
    context manager in the main thread; the previous handler is restored on exit. Every command runs
    inside one (`headscope.cli`, which checks it when the command returns); a guard opened inside
    another (`run`'s, for its own safe points) marks the outer one too.

    `commit(what)` says the command's output is in place: from then on a Ctrl-C is too late to undo
    anything, so it is remembered as `late` (announced by `headscope.cli`, exit status unchanged)
    instead of raised. Never both: an interrupt either stops the command before its output replaces
    anything (130), or comes after and is only announced.
    """

    def __init__(self) -> None:
        self.received = False
        self.committed: str | None = None  # what is in place, once the output is
        self.late = False  # a Ctrl-C came after `commit`
        self._previous: Any = None
        self._hook: Any = None

    def __enter__(self) -> "Interrupts":
        import threading

        if threading.current_thread() is threading.main_thread():  # only there can Python take a signal
            self._previous = signal.signal(signal.SIGINT, self._handler)
            self._hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            sys.unraisablehook = self._hook

    def _outer(self) -> "Interrupts | None":
        outer = getattr(self._previous, "__self__", None)
        return outer if isinstance(outer, Interrupts) else None

    def _mark(self) -> None:
        self.received = True
        if (outer := self._outer()) is not None:
            outer._mark()

    def _mark_late(self) -> None:
        self.late = True
        if (outer := self._outer()) is not None:
            outer._mark_late()

    def _handler(self, signum, frame) -> None:
        if self.committed is not None:
            self._mark_late()  # the output is in place: nothing left to stop
            return
        self._mark()
        raise KeyboardInterrupt

    def _unraisable(self, unraisable) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and self.received:
            return  # remembered: check() raises it where it can stop the command
        self._hook(unraisable)

    def commit(self, what: str) -> None:
        """`what` (a path, say) is in place: later Ctrl-Cs are announced, not raised (here and outside)."""
        if self.committed is None:
            self.committed = what
        if (outer := self._outer()) is not None:
            outer.commit(what)

    def check(self) -> None:
        """Raise KeyboardInterrupt if a Ctrl-C came in, even one that a finaliser swallowed."""
        if self.received:
            raise KeyboardInterrupt


def committed(what: str) -> Callable[[], None]:
    """The cue a writer gives once `what` is in place: it commits the running command's `Interrupts`
    (`headscope.cli` keeps it as the click context's object), so a later Ctrl-C is announced, not
    turned into "nothing was written" (130). Outside a command, a cue that does nothing."""
    ctx = click.get_current_context(silent=True)
    guard = ctx.find_object(Interrupts) if ctx is not None else None
    return (lambda: guard.commit(what)) if guard is not None else (lambda: None)
