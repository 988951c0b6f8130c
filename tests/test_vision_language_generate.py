"""Issue 36: generation over an image (`generate_attention(..., images=)`, `headscope generate --image`) and
`explain --image` on a vision–language decoder."""

import numpy as np
import pytest
import torch

from conftest import _tiny
from headscope.probe.families import FAMILIES
from headscope.probe.forward import extra_inputs
from headscope.probe.generate import generate_attention
from headscope.probe.vision_language import encode_with_images

# the families whose images are tokens of the text; a cross reader (Mllama) is refused in one line (below)
READING = sorted(name for name, f in FAMILIES.items() if f.vision_language is not None and f.vision_language.cross is None)
CROSS = sorted(name for name, f in FAMILIES.items() if f.vision_language is not None and f.vision_language.cross is not None)


def _picture(seed: int = 0, shape=(40, 52, 3)) -> np.ndarray:
    return np.random.default_rng(seed).random(shape)


@pytest.mark.parametrize("family", READING)
def test_greedy_steps_are_the_models_own_generate_and_the_prompt_knows_its_picture(family):
    lm = _tiny(family)
    result = generate_attention(lm, "Describe it.", images=[_picture()], max_new_tokens=4)
    [enc] = encode_with_images(lm, ["Describe it."], [_picture()])
    ids = torch.tensor([enc.ids])
    own = lm.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **extra_inputs(lm, [enc]),
                            max_new_tokens=4, do_sample=False)[0, len(enc.ids):].tolist()
    stop = lm.model.generation_config.eos_token_id
    stop = set(stop) if isinstance(stop, (list, tuple)) else {stop}
    ends = [t for t, i in enumerate(own) if i in stop]  # generate stops at an end-of-sequence token (kept) too
    assert list(result.generated_ids) == own[: ends[0] + 1 if ends else len(own)]
    image_keys = [p for p in result.prompt.patches if p is not None]
    assert len(result.prompt) == len(enc.ids) and image_keys and len(result.prompt.pictures) == 1
    assert all(row.shape[-1] == len(enc.ids) + t + 1 for t, row in enumerate(result.steps))


def test_each_step_is_the_last_row_of_a_full_forward_over_the_picture():
    lm = _tiny("llava")
    pic = _picture(3)
    result = generate_attention(lm, "What is it?", images=[pic], max_new_tokens=3)
    [enc] = encode_with_images(lm, ["What is it?"], [pic])
    for t, row in enumerate(result.steps):
        ids = torch.tensor([list(enc.ids) + list(result.generated_ids[: t + 1])])
        with torch.inference_mode():
            out = lm.model(input_ids=ids, attention_mask=torch.ones_like(ids), output_attentions=True,
                           **extra_inputs(lm, [enc]))
        full = torch.stack([a[0, :, -1] for a in out.attentions])  # [layer, head, key]: the last query's row
        assert torch.allclose(row, full.float(), atol=1e-6)


def test_images_on_a_text_model_and_slot_mismatches_are_one_clear_error():
    with pytest.raises(ValueError, match="text model"):
        generate_attention(_tiny("llama"), "hi", images=[_picture()], max_new_tokens=1)
    with pytest.raises(ValueError, match=r"2 <image> slot\(s\) but 1 image"):
        generate_attention(_tiny("llava"), "a <image> b <image>", images=[_picture()], max_new_tokens=1)


# --- the command line -------------------------------------------------------------------------------------------


def _cli(*args):
    from click.testing import CliRunner

    from headscope.cli import cli

    return CliRunner().invoke(cli, list(args))



def test_cli_generate_over_an_image(picture_file):
    import json

    result = _cli("generate", "--model", "tiny:llava", "--image", picture_file, "--prompt", "What is it?",
                  "--max-new-tokens", "2")
    assert result.exit_code == 0, result.output
    assert "attention on the 16 image tokens, per step" in result.output
    record = json.loads(_cli("generate", "--model", "tiny:llava", "--image", picture_file, "--prompt", "What is it?",
                             "--max-new-tokens", "2", "--json").stdout)
    assert sum(t.startswith("img0:") for t in record["prompt_tokens"]) == 16 and len(record["steps"]) == 2


def test_cli_generate_refuses_an_image_on_a_text_model_and_a_mismatch(picture_file):
    from conftest import one_line

    result = _cli("generate", "--model", "tiny:llama", "--image", picture_file, "--prompt", "hi")
    assert result.exit_code == 2 and "text model" in one_line(result)
    result = _cli("generate", "--model", "tiny:llava", "--image", picture_file, "--prompt", "a <image> b <image>")
    assert result.exit_code == 2 and "2 <image> slot(s) but 1 image(s)" in one_line(result)


# --- explain: a decoder head's row for a word or an image token ------------------------------------------------


@pytest.mark.parametrize("family", READING)
def test_explain_an_image_token_and_a_word_match_the_extracted_rows(family):
    from headscope.probe.explain import explain
    from headscope.probe.extract import extract

    lm = _tiny(family)
    text = f"Look {lm.processor.image_token} at the cat"
    [m] = extract(lm, text, images=[_picture(2)])
    cell = next(label for label, p in zip(m.labels, m.patches) if p is not None and (p.row, p.col) == (1, 1))
    for token in (cell, "cat"):
        e = explain(lm, text, images=[_picture(2)], token=token, layer=1, head=0)
        q = m.labels.index(token)
        assert e.query == token and e.query_index == q and e.text == m.text
        # the extracted map is the model's own eager weights: the from-scratch row (with the model's mask) is it
        assert np.allclose(e.table["weight"].to_numpy(), m.attention[1, 0, q].float().numpy(), atol=1e-6)
    if not m.causal:  # Gemma 3's image / PaliGemma's prefix: the first image token sees the later ones
        first = next(label for label, p in zip(m.labels, m.patches) if p is not None)
        e = explain(lm, text, images=[_picture(2)], token=first, layer=1, head=0)
        q = m.labels.index(first)
        assert e.table["weight"].to_numpy()[q + 1:].sum() > 0
        assert np.allclose(e.table["weight"].to_numpy(), m.attention[1, 0, q].float().numpy(), atol=1e-6)


def test_cli_explain_a_decoders_image_token_and_its_refusals(picture_file):
    import json

    from conftest import one_line

    result = _cli("explain", "--model", "tiny:llava", "--image", picture_file, "--token", "img0:r1c2", "--head", "L1H0",
                  "--json")
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["query"] == "img0:r1c2" and abs(sum(k["weight"] for k in record["keys"]) - 1) < 1e-5
    result = _cli("explain", "Look <image> at the cat", "--model", "tiny:llava", "--image", picture_file, "--token",
                  "cat", "--head", "L1H0")
    assert result.exit_code == 0 and "query 'cat'" in result.output
    for args, says in ((["hi", "--model", "tiny:llama"], "text model"),
                       (["a <image> b <image>", "--model", "tiny:llava"], "2 <image> slot(s) but 1 image(s)"),
                       (["a cat", "--model", "tiny:vit"], "not both")):
        result = _cli("explain", *args, "--image", picture_file, "--token", "a", "--head", "L0H0")
        assert result.exit_code == 2 and says in one_line(result), result.output


def test_cli_run_generates_over_each_image_into_the_report(picture_file, tmp_path):
    import json

    result = _cli("run", "--model", "tiny:llava", "--image", picture_file, "--generate", "2", "--report",
                  str(tmp_path / "report"), "--quiet")
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "report" / "run.json").read_text())
    [generated] = (record["models"][0] if "models" in record else record)["generated"]
    own = generate_attention(_tiny("llava"), "What is in this picture?", images=[picture_file], max_new_tokens=2)
    assert generated["prompt"] == own.prompt.text and generated["text"] == own.text
    assert "<image>" in generated["prompt"]  # the image went in through the chat template's slot


def test_run_on_an_image_encoder_says_it_did_not_generate(picture_file, tmp_path):
    result = _cli("run", "--model", "tiny:vit", "--image", picture_file, "--generate", "2", "--report",
                  str(tmp_path / "report"), "--quiet")
    assert result.exit_code == 0, result.output
    assert "generation was not run (2 tokens asked for)" in (tmp_path / "report" / "run.json").read_text()


@pytest.mark.parametrize("family", CROSS)
def test_generation_and_explain_refuse_a_cross_reader_in_words(family):
    """Mllama reads its images through cross-attention layers: generating over an image, or explaining a
    cross-attention layer (its self-attention layers are explained: tests/test_mllama_maps.py), is refused in words,
    naming what it reads or where its maps come from, before any step is taken."""
    from headscope.probe.explain import explain
    from headscope.probe.families import FAMILIES

    lm = _tiny(family)
    with pytest.raises(ValueError, match="cross-attention"):
        generate_attention(lm, "a cat", images=[_picture()], max_new_tokens=2)
    cross = FAMILIES[family].vision_language.cross.layer_numbers(lm.config)[0]
    with pytest.raises(ValueError, match="is a cross-attention layer"):
        explain(lm, "a cat", token="cat", layer=cross, head=0, images=[_picture()])
