"""Counts and shares as a reader reads them: "1 image", not "1 texts"; a setting that says what happened."""

from __future__ import annotations

import pandas as pd
import pytest
from click.testing import CliRunner

from headscope.cli import cli
from headscope.probe.wording import counted


@pytest.mark.parametrize("n, noun, want", [(1, "text", "1 text"), (2, "text", "2 texts"), (0, "example", "0 examples"),
                                           (1.0, "role", "1 role"), (1500, "token", "1,500 tokens"),
                                           (2, "index", "2 indices"), (3, "pass", "3 passes")])
def test_counted_agrees_with_its_number(n, noun, want):
    assert counted(n, noun) == want


def test_heads_on_one_image_says_one_image_and_that_patches_were_scored(picture_file):
    # Was: "1 texts from --image" and "setting: words (tokens aggregated as in Clark et al. 2019) ..." on an image.
    res = CliRunner().invoke(cli, ["heads", "--model", "tiny:vit", "--image", picture_file, "--quiet", "--no-verify"])
    assert res.exit_code == 0, res.output
    assert "1 image from --image" in res.output and "texts" not in res.output.split("\n")[1]
    [setting] = [line for line in res.output.splitlines() if line.startswith("setting:")]
    assert "image patches" in setting and "aggregated" not in setting and "Clark" not in setting


def test_the_qk_summary_gives_its_largest_term_as_what_it_adds(monkeypatch):
    # Was: "-38% of the score from key-side ..." when the largest term pulled the score the other way.
    from dataclasses import replace

    import headscope as hs
    from headscope.probe.tiny import tiny_model

    r = hs.qk(tiny_model("gpt2"), "The cat sat on the mat and the dog", layer=1, head=0, query=5, key=2)
    terms = pd.DataFrame([[-0.7, 0.1], [0.2, 0.05]], index=["embed", "L0H0"], columns=["embed", "L0H1"])
    line = replace(r, terms=terms, score=-0.35).summary()
    assert "key-side embed × query-side embed, adds -0.7 (it lowers the score)" in line and "%" not in line
    line = replace(r, terms=-terms, score=0.35).summary()
    assert "adds +0.7 (it raises the score)" in line


@pytest.mark.parametrize("n_bytes, shown", [
    (999, "999 B"), (1000, "1.00 kB"), (999_499, "999 kB"),  # 999.499 kB to three digits
    (999_500, "1.00 MB"), (999_999, "1.00 MB"),  # 999.5 .. 999.999 kB round to 1,000 kB: a megabyte
    (999_999_999, "1.00 GB"), (999_999_999_999, "1.00 TB"), (float("nan"), "n/a")])
def test_a_size_never_reads_1000_of_a_unit(n_bytes, shown):
    from headscope.probe.wording import size

    assert size(n_bytes) == shown
