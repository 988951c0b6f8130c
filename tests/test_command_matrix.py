"""Every command on every kind of `tiny:` model (issue 45): a text decoder, a hybrid stack, an encoder, an
encoder–decoder, an image encoder, a two-tower model, every vision–language family and Mllama's cross-attention
decoder. Each run ends in exit 0 or a one-line refusal (2: a bad input, 3: a model the command cannot take
apart, `headscope.common.exits`), never "unexpected" (exit 1); a command that takes the model (`WORKS`) exits 0,
so a crash dressed as a refusal (a pandas error passed on as a ValueError) fails too; and a table written with
exit 0 holds no infinite score.

The models are loaded once and shared by every command (`headscope.load` cached for the module); the inputs
are tiny (two texts, an 8 × 8 picture, two treebank sentences). All 17 × 17 (model, command) cases are listed;
one run takes a share of them (15-22 cases), chosen by a hash of the case and `HEADSCOPE_MATRIX` (default: the day of the
year, so each day runs another share of `SHARES`; `HEADSCOPE_MATRIX=all` runs every case, `run` included,
which alone takes 35-160 s a model; any other value picks the share of that name)."""

from __future__ import annotations

import datetime
import os
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

TEXT_DECODER, HYBRID, ENCODER, SEQ2SEQ, IMAGE, TOWERS = "llama", "jamba", "bert", "t5", "vit", "clip"
VLMS = ("llava", "llava_next", "llava_onevision", "gemma3", "paligemma", "qwen2_vl", "qwen2_5_vl", "qwen3_vl",
        "idefics3", "smolvlm", "mllama")
MODELS = (TEXT_DECODER, HYBRID, ENCODER, SEQ2SEQ, IMAGE, TOWERS, *VLMS)
SHARES = 12  # a day's run takes one case in twelve (about 20), `run` only with HEADSCOPE_MATRIX=all

# The commands each model must run to exit 0 (the others may refuse in one line).
_TEXT_READERS = {"verify", "explain", "extract", "heads", "coref", "syntax", "compare"}
_VLM = _TEXT_READERS | {"extract", "generate", "ablate", "importance", "dla", "qk", "patch", "composition", "sinks", "run"}
WORKS = {TEXT_DECODER: "all", HYBRID: {"verify", "heads", "coref", "syntax", "compare", "generate", "importance", "run"},
         ENCODER: _TEXT_READERS | {"ablate", "importance", "sinks", "run"}, SEQ2SEQ: _TEXT_READERS | {"run"},
         IMAGE: {"verify", "extract", "heads", "run"}, TOWERS: _TEXT_READERS | {"importance", "run"},
         "mllama": {"verify", "ablate", "importance", "extract", "heads", "run"},
         **{m: _VLM for m in VLMS if m != "mllama"}}

CONLLU = """# text = The cat sat .
1	The	the	DET	DT	_	2	det	_	_
2	cat	cat	NOUN	NN	_	3	nsubj	_	_
3	sat	sit	VERB	VBD	_	0	root	_	_
4	.	.	PUNCT	.	_	3	punct	_	_

# text = A dog ran .
1	A	a	DET	DT	_	2	det	_	_
2	dog	dog	NOUN	NN	_	3	nsubj	_	_
3	ran	run	VERB	VBD	_	0	root	_	_
4	.	.	PUNCT	.	_	3	punct	_	_
"""


def _commands(kind: str, files: dict) -> dict[str, list[str]]:
    """Each command's tiny arguments for a model of `kind` ("text", "image", "vlm"), tables to `files["out"]`."""
    corpus, out = files["corpus"], files["out"]
    image = ["--image", files["image"]] if kind in ("image", "vlm") else []
    return {
        "verify": ["verify", *image, "--json"],
        "explain": ["explain", "The cat sat on the mat.", "--token", "cat", "--head", "L0H0", "--json"],
        "heads": ["heads", "--corpus", corpus, "--limit", "2", "--induction-seqs", "1", "--induction-length", "8",
                  "--no-verify", "--out", f"{out}/heads.csv", "--force", *image],
        "coref": ["coref", "--limit", "6", "--folds", "2", "--permutations", "100", "--no-verify", "--out",
                  f"{out}/coref.csv", "--force"],
        "syntax": ["syntax", "--conllu", files["conllu"], "--permutations", "100", "--no-trees", "--no-verify",
                   "--out", f"{out}/syntax.csv", "--force"],
        "compare": ["compare", None, None, "--corpus", corpus, "--limit", "2", "--no-verify", "--json"],
        "generate": ["generate", "--prompt", "The cat", "--max-new-tokens", "2", *image, "--json"],
        "ablate": ["ablate", "--heads", "L0H0", "--corpus", corpus, "--limit", "2", "--random", "2", "--json"],
        "importance": ["importance", "--corpus", corpus, "--limit", "2", "--out", f"{out}/importance.csv", "--force"],
        "dla": ["dla", "--prompt", "The cat sat on the", "--answer", " mat", "--out", f"{out}/dla.csv", "--force"],
        "qk": ["qk", "The cat sat on the mat.", "--head", "L0H0", "--query", "sat", "--key", "cat", "--out",
               f"{out}/qk.csv", "--force"],
        "patch": ["patch", "--pairs", "ioi", "--random", "2", "--out", f"{out}/patch.csv", "--force"],
        "composition": ["composition", "--out", f"{out}/composition.csv", "--force"],
        "sinks": ["sinks", "--corpus", corpus, "--limit", "2", "--sequences", "2", "--random-sequences", "2",
                  "--sequence-length", "12", "--out", f"{out}/sinks.csv", "--force"],
        "extract": ["extract", *(["The cat sat on the mat."] if kind == "text" else []), *image, "--quiet", "--out",
                    f"{out}/maps.npz", "--force"],
        "retrieval": ["retrieval", "--needles", "2", "--length", "120", "--depth", "0.5", "--random", "2", "--quiet",
                      "--out", f"{out}/retrieval.csv", "--force"],
        "run": ["run", "--corpus", corpus, "--limit", "2", "--induction-seqs", "1", "--permutations", "100",
                "--report", f"{out}/report", "--force", *image],
    }


def _kind(model: str) -> str:
    return "image" if model in (IMAGE, TOWERS) else "vlm" if model in VLMS else "text"


CASES = [(model, command) for model in MODELS for command in _commands(_kind(model), {"corpus": "", "out": "",
                                                                                      "image": "", "conllu": ""})]


def _share() -> str:
    return os.environ.get("HEADSCOPE_MATRIX") or str(datetime.date.today().timetuple().tm_yday)


def _chosen(model: str, command: str) -> bool:
    share = _share()
    if share == "all":
        return True
    if command == "run":
        return False
    mark = f"{model}/{command}".encode()
    return zlib.crc32(mark) % SHARES == zlib.crc32(share.encode()) % SHARES


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from PIL import Image

    root = tmp_path_factory.mktemp("matrix")
    (root / "corpus.txt").write_text("The cat sat on the mat, and the dog sat too.\nMary told John that she would "
                                     "call him tomorrow.\n")
    (root / "tree.conllu").write_text(CONLLU)
    Image.fromarray((np.random.default_rng(0).random((8, 8, 3)) * 255).astype("uint8")).save(root / "pic.png")
    (root / "out").mkdir()
    return {"corpus": str(root / "corpus.txt"), "conllu": str(root / "tree.conllu"), "image": str(root / "pic.png"),
            "out": str(root / "out")}


@pytest.fixture(scope="module")
def shared_models():
    """`headscope.load` returning one model per name for the whole module (commands never change a model)."""
    import headscope
    from headscope.probe.loading import load_model

    made: dict = {}

    def load(name, **kw):
        key = (name, *sorted(kw.items()))
        if key not in made:
            made[key] = load_model(name, **kw)
        return made[key]

    mp = pytest.MonkeyPatch()
    mp.setattr(headscope, "load", load, raising=False)
    yield made
    mp.undo()


def _infinite(table: Path) -> list[str]:
    """The numeric columns of a CSV table that hold an infinite value."""
    frame = pd.read_csv(table)
    numeric = frame.select_dtypes("number")
    return [c for c in numeric.columns if np.isinf(numeric[c].to_numpy(dtype=float)).any()]


CHOSEN = [case for case in CASES if _chosen(*case)]  # collected only: the day's share, not 240 skips in the summary


@pytest.mark.parametrize(("model", "command"), CHOSEN, ids=[f"{m}-{c}" for m, c in CHOSEN])
def test_every_command_on_every_kind_of_model_ends_in_a_result_or_one_line(model, command, files, shared_models):
    from headscope.cli import cli

    name = f"tiny:{model}"
    args = _commands(_kind(model), files)[command]
    args = [name if a is None else a for a in args] if command == "compare" else [*args, "--model", name]
    for old in Path(files["out"]).glob("*.csv"):
        old.unlink()
    result = CliRunner().invoke(cli, args)
    said = [line for line in result.output.splitlines() if line.startswith("headscope:")]
    assert result.exit_code in (0, 2, 3), f"exit {result.exit_code}: {said or result.output[-2000:]}"
    assert not any("unexpected" in line for line in said), said
    works = WORKS[model]
    if works == "all" or command in works:
        assert result.exit_code == 0, said
    if result.exit_code:
        assert len(said) == 1, result.output[-2000:]  # one line says why
        return
    for table in Path(files["out"]).rglob("*.csv"):
        assert not _infinite(table), f"{table.name}: infinite values in {_infinite(table)}"
