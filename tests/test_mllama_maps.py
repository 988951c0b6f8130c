"""Mllama's maps through the attention source: hs.extract with images gives each text's self-attention map and its
cross-attention map (text queries over the image keys, each key on its image, tile, row and column), written by
`headscope extract` and read back by hs.load_maps."""

import numpy as np
import pytest
import torch

from conftest import _tiny
from headscope.probe.types import ImageCrossAttention

IMAGE = "<|image|>"


def _picture(seed: int = 0, shape=(16, 30, 3)) -> np.ndarray:
    return np.random.default_rng(seed).random(shape)


@pytest.fixture(scope="module")
def mllama():
    return _tiny("mllama")


@pytest.fixture(scope="module")
def pair(mllama):
    from headscope.probe.inputs import AttentionInput
    from headscope.probe.sources import source_for

    [reading] = source_for(mllama, "auto").read(AttentionInput.of([f"before {IMAGE} after"], images=[_picture(3)]))
    [p] = reading.maps()
    return p


def test_the_source_reads_both_maps_with_the_models_own_layer_numbers(mllama, pair):
    cfg = mllama.config.text_config
    cross = tuple(cfg.cross_attention_layers)
    assert isinstance(pair, ImageCrossAttention)
    assert pair.cross.layers == cross
    assert pair.decoder.layers == tuple(i for i in range(cfg.num_hidden_layers) if i not in cross)
    n = len(pair.decoder)
    assert pair.decoder.attention.shape == (cfg.num_hidden_layers - len(cross), cfg.num_attention_heads, n, n)
    assert pair.cross.attention.shape[:3] == (len(cross), cfg.num_attention_heads, n)
    assert len(pair.cross.keys) == pair.cross.attention.shape[-1]
    rows = pair.cross.attention.sum(-1)  # every text row is a softmax over the image keys (the model's mask)
    assert torch.allclose(rows, torch.ones_like(rows), atol=1e-5)
    tiles = {p.view for p in pair.cross.keys.patches if p is not None}
    assert tiles == {"tile 0,0", "tile 0,1"}  # a wide picture: two tiles side by side


def test_the_cross_map_is_the_models_own_output_attentions(mllama, pair):
    """The reference is the model's own forward pass asked for its attentions (every layer, cross ones included),
    run here apart from headscope's hooks."""
    from headscope.probe.vision_language import encode_with_images

    [enc] = encode_with_images(mllama, [f"before {IMAGE} after"], [_picture(3)])
    with torch.no_grad():
        out = mllama.model(input_ids=torch.tensor([enc.ids]), **enc.inputs, output_attentions=True)
    want_cross = torch.stack([out.attentions[i][0] for i in pair.cross.layers])
    want_self = torch.stack([out.attentions[i][0] for i in pair.decoder.layers])
    assert torch.allclose(pair.cross.attention, want_cross, atol=1e-6)
    assert torch.allclose(pair.decoder.attention, want_self, atol=1e-6)


def test_hs_extract_with_images_gives_the_pairs_at_either_level(mllama):
    import headscope as hs

    pairs = hs.extract(mllama, [f"{IMAGE} a cat", f"{IMAGE} two dogs"], images=[_picture(1), _picture(2)])
    assert [type(p) for p in pairs] == [ImageCrossAttention] * 2
    assert not torch.equal(pairs[0].cross.attention, pairs[1].cross.attention)  # each text with its own picture
    [words] = hs.extract(mllama, f"{IMAGE} a cat", images=[_picture(1)], level="word")
    assert words.decoder.level == words.cross.level == "word"
    assert words.cross.attention.shape[-2:] == (len(words.decoder), len(pairs[0].cross.keys))
    rows = words.cross.attention.sum(-1)
    assert torch.allclose(rows, torch.ones_like(rows), atol=1e-5)
    with pytest.raises(ValueError, match="layers= and heads="):
        hs.extract(mllama, f"{IMAGE} a cat", images=[_picture(1)], layers=[0])


def test_extract_out_writes_both_maps_and_load_maps_reads_them_back(mllama, tmp_path, suffix=".safetensors"):
    from click.testing import CliRunner
    from PIL import Image

    import headscope as hs
    from headscope.cli import cli

    path = tmp_path / "p.png"
    Image.fromarray((_picture(1) * 255).astype("uint8")).save(path)
    out = tmp_path / f"maps{suffix}"
    result = CliRunner().invoke(cli, ["extract", "--model", "tiny:mllama", "--image", str(path), "--level", "token",
                                      "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    [back] = hs.load_maps(out)
    [want] = hs.extract(mllama, images=[str(path)])
    assert isinstance(back, ImageCrossAttention)
    assert torch.equal(back.cross.attention, want.cross.attention)
    assert torch.equal(back.decoder.attention, want.decoder.attention)
    assert back.cross.layers == want.cross.layers and back.decoder.layers == want.decoder.layers
    assert back.cross.keys.patches == want.cross.keys.patches and back.cross.keys.labels == want.cross.keys.labels
    assert back.gates == want.gates


def test_save_maps_round_trips_a_pair_and_refuses_what_is_no_map(pair, tmp_path):
    import headscope as hs

    path = hs.save_maps([pair], tmp_path / "a.parquet")  # long format: the cross rows' key labels are the image's
    [back] = hs.load_maps(path)
    assert torch.equal(back.cross.attention, pair.cross.attention)
    assert back.cross.queries.labels == pair.decoder.labels
    import pyarrow.parquet as pq

    rows = pq.read_table(path).to_pandas()
    assert set(rows[rows["map"] == 1]["key_label"]) == set(pair.cross.keys.labels)
    with pytest.raises(TypeError, match="ImageCrossAttention"):
        hs.save_maps([pair.cross], tmp_path / "b.npz")
    assert not (tmp_path / "b.npz").exists()


def test_the_rows_that_read_the_image_are_the_marker_and_after(pair):
    marker = pair.decoder.labels.index(IMAGE)
    assert pair.cross.meta["reads_image"] == [q >= marker for q in range(len(pair.decoder))]


def _by_hand(pair, layer_pos: int, head: int) -> tuple[float, float]:
    """Mean normalised entropy and max weight of one cross head over the rows at or after the marker, by a loop."""
    marker = pair.decoder.labels.index(IMAGE)
    a = pair.cross.attention[layer_pos, head].double().numpy()
    ents, tops = [], []
    for q in range(marker, a.shape[0]):
        row = a[q][a[q] > 0]
        ents.append(float(-(row * np.log(row)).sum() / np.log(len(row))))
        tops.append(float(row.max()))
    return sum(ents) / len(ents), sum(tops) / len(tops)


def test_heads_scores_the_self_attention_heads_and_the_cross_heads_apart(mllama, pair):
    import headscope as hs

    scores = hs.heads(mllama, [f"before {IMAGE} after"], images=[_picture(3)], level="token")
    assert set(scores.table["layer"]) == set(pair.decoder.layers)  # the self-attention layers, model numbers
    cross = scores.meta["cross_attention"]
    assert {(r["layer"], r["head"]) for r in cross} == {(1, h) for h in range(mllama.config.text_config.num_attention_heads)}
    for r in cross:
        entropy, top = _by_hand(pair, 0, r["head"])
        assert r["image_entropy"] == pytest.approx(entropy, abs=1e-6)
        assert r["max_weight"] == pytest.approx(top, abs=1e-6)
        assert 0 < r["patch_share"] < 1  # the tiles' CLS tokens take the rest
    from headscope.analyses.heads import HeadScoreAccumulator

    acc = HeadScoreAccumulator(model="m", level="token", include_special=scores.include_special)
    acc.update(pair.decoder)  # the self-attention map alone, scored as any text's
    want = acc.result().table
    for metric in ("previous_token", "entropy"):
        got = scores.table[scores.table["metric"] == metric]["value"].to_numpy()
        assert np.allclose(got, want[want["metric"] == metric]["value"].to_numpy())


def test_run_with_an_image_writes_the_cross_attention_section(tmp_path, draw_only):
    draw_only("cross_overlay")  # the section's own figure; the others are other sections' and tested there
    from click.testing import CliRunner
    from PIL import Image

    from headscope.cli import cli

    path = tmp_path / "p.png"
    Image.fromarray((_picture(1) * 255).astype("uint8")).save(path)
    out = tmp_path / "report"
    result = CliRunner().invoke(cli, ["run", "--model", "tiny:mllama", "--image", str(path), "--report", str(out),
                                      "--quiet"])
    assert result.exit_code == 0, result.output
    page = (out / "index.html").read_text()
    assert 'id="vision_language"' in page and "Cross-attention heads" in page
    assert "Which text token reads which image cell" in page
    import pandas as pd

    heads = pd.read_csv(out / "cross_attention_heads.csv")
    assert set(heads["layer"]) == {1} and heads["image_entropy"].between(0, 1).all()
    reads = pd.read_csv(out / "cross_attention_reads.csv")
    assert len(reads) and reads["view"].str.startswith("tile ").all()
    assert any(p.name.startswith("tiny-mllama-vision-language-cross-") for p in (out / "figures").iterdir())


def test_explain_a_self_attention_head_with_the_image_is_the_extracted_row(mllama, pair):
    import headscope as hs

    e = hs.explain(mllama, f"before {IMAGE} after", token="after", layer=2, head=1, images=[_picture(3)])
    q = e.query_index
    assert q > pair.decoder.labels.index(IMAGE) and pair.decoder.labels[q] in e.query
    got = torch.tensor(e.table["weight"].to_numpy(), dtype=torch.float32)  # recomputed from scratch by explain
    assert torch.allclose(got, pair.decoder.attention[pair.decoder.layers.index(2), 1, q], atol=1e-6)
    assert e.model_weight_max_abs_err < 1e-5


def test_explain_a_cross_attention_layer_says_what_it_reads(mllama, tmp_path):
    from click.testing import CliRunner
    from PIL import Image

    import headscope as hs
    from headscope.cli import cli

    with pytest.raises(ValueError, match=r"layer 1 of .* is a cross-attention layer: its text queries read the "
                                         r"image's 34 tile tokens .* self-attention layers \(0, 2\)"):
        hs.explain(mllama, f"{IMAGE} a cat", token="cat", layer=1, head=0, images=[_picture(1)])
    path = tmp_path / "p.png"
    Image.fromarray((_picture(1) * 255).astype("uint8")).save(path)
    result = CliRunner().invoke(cli, ["explain", "--model", "tiny:mllama", f"{IMAGE} a cat", "--token", "cat",
                                      "--head", "L1H0", "--image", str(path)])
    assert result.exit_code == 2 and "is a cross-attention layer" in result.output
    assert len(result.output.strip().splitlines()) == 1
