"""Vision–language decoders (issue 36): texts with images, image tokens on their pictures, both stacks verified."""

import copy
import dataclasses

import numpy as np
import pytest
import torch

from conftest import _tiny, _tiny_type
from headscope.probe.extract import extract
from headscope.probe.families import FAMILIES, SUPPORTED_TYPES, Stack
from headscope.probe.forward import base_model
from headscope.probe.types import ImagePatch
from headscope.probe.tiny import tiny_model
from headscope.probe.verify import verify

# Families whose image tokens stand in the text (Mllama reads its image by cross-attention: tests/test_mllama.py)
READING = sorted(name for name, f in FAMILIES.items() if f.vision_language is not None and f.vision_language.cross is None)


def _picture(seed: int = 0, shape=(40, 52, 3)) -> np.ndarray:
    return np.random.default_rng(seed).random(shape)


@pytest.fixture(params=READING)
def reading(request):
    """A tiny random vision–language model of each family (built once per session)."""
    return _tiny(request.param)


def _slot(lm) -> str:
    from headscope.probe.vision_language import image_slot

    return image_slot(lm)


def test_every_family_verifies_both_stacks_and_names_them(reading):
    v = verify(reading)
    assert v.passed, v.to_frame()
    kinds = [c.kind for c in v.layers]
    assert set(kinds) == {"vision", "decoder"}
    assert kinds.count("vision") == reading.model.config.vision_config.num_hidden_layers
    assert kinds.count("decoder") == reading.config.num_hidden_layers
    assert "vision" in v.summary() and "decoder" in v.summary()


def test_two_images_in_one_text_and_a_text_of_its_own(reading):
    slot = _slot(reading)
    texts = [f"First {slot} then {slot} compared.", f"Only {slot} here."]
    v = verify(reading, texts, images=[_picture(0), _picture(1), _picture(2)])
    assert v.passed and v.n_texts == 2


@pytest.mark.parametrize("part", ["decoder weight", "vision weight", "mask"])
def test_break_it_a_perturbed_weight_or_mask_fails(reading, part):
    family = FAMILIES[reading.model_type] if reading.model_type in FAMILIES else None
    from headscope.probe.families import family_for

    family = family_for(reading.config)
    vl = family.vision_language

    def bent(spec_fn):
        def spec(base, i, cfg):
            s = spec_fn(base, i, cfg)
            return dataclasses.replace(s, wk=s.wk.flip(0)) if i == 0 else s  # (a QK norm undoes a plain scale)
        return spec

    if part == "decoder weight":
        broken = dataclasses.replace(family, layer_spec=bent(family.layer_spec))
    elif part == "vision weight":
        broken = dataclasses.replace(family, vision_language=dataclasses.replace(
            vl, vision=dataclasses.replace(vl.vision, layer_spec=bent(vl.vision.layer_spec))))
    else:  # a causal model's mask made bidirectional, a model's own bidirectional blocks dropped
        broken = dataclasses.replace(family, vision_language=dataclasses.replace(
            vl, blocks=lambda cfg, types, ids, layer: torch.zeros_like(ids) if types is None else None))
    v = verify(reading, family=broken)
    assert not v.passed
    kind = "vision" if part == "vision weight" else "decoder"
    assert any(not c.passed for c in v.layers if c.kind == kind)


def test_image_tokens_carry_their_cell_and_pictures(reading):
    slot = _slot(reading)
    [m] = extract(reading, f"Look {slot} and {slot} now", images=[_picture(0), _picture(1, (30, 30, 3))])
    patches = [p for p in m.patches if p is not None]
    assert len(m.patches) == len(m) and len(m.pictures) == 2
    for k in (0, 1):
        for view in {p.view for p in patches if p.image == k}:
            mine = [p for p in patches if p.image == k and p.view == view]
            rows, cols = mine[0].rows, mine[0].cols
            assert [(p.row, p.col) for p in mine] == [(r, c) for r in range(rows) for c in range(cols)]  # row by row
        assert m.pictures[k].ndim == 3 and m.pictures[k].shape[-1] == 3
        assert 0.0 <= m.pictures[k].min() and m.pictures[k].max() <= 1.0
    for i, p in enumerate(m.patches):
        if p is not None:
            view = "" if p.view == "base" else f"{p.view}:"
            assert m.special[i] and m.labels[i] == f"img{p.image}:{view}r{p.row}c{p.col}"
    [w] = extract(reading, f"Look {slot} and {slot} now", images=[_picture(0), _picture(1, (30, 30, 3))], level="word")
    words = [w.labels[i] for i, p in enumerate(w.patches) if p is None and not w.special[i]]
    assert words == ["Look", "and", "now"]  # each text token keeps its span in the text
    assert sorted((p.image, p.row, p.col) for p in w.patches if p) == sorted((p.image, p.row, p.col) for p in patches)


def test_a_text_without_a_slot_takes_its_image_first(reading):
    [m] = extract(reading, "What is this?", images=[_picture()], level="word")
    assert "What" in m.labels and m.text.count(_slot(reading)) == 1 and sum(p is not None for p in m.patches) > 1
    assert m.text.index(_slot(reading)) < m.text.index("What is this?")


def test_mismatched_images_and_slots_are_one_clear_error(reading):
    slot = _slot(reading)
    with pytest.raises(ValueError, match="slot"):
        extract(reading, f"a {slot} b {slot}", images=[_picture()])
    with pytest.raises(ValueError, match="one image per text"):
        extract(reading, ["a", "b"], images=[_picture()] * 3)


def test_an_image_on_a_text_model_is_refused():
    with pytest.raises(ValueError, match="text model"):
        extract(_tiny("llama"), "a", images=[_picture()])


def test_texts_alone_still_extract(reading):
    [m] = extract(reading, "no picture at all")
    assert not m.patches and m.attention.shape[-1] == len(m)


def _layer_input(lm, enc_text, images, family, layer):
    """The normed input of the decoder's layer `layer` (the attention module's input) for this text."""
    caught = {}

    def grab(module, args, kwargs):
        caught["x"] = (args[0] if args else kwargs["hidden_states"]).detach()

    h = family.attention(base_model(lm), layer).register_forward_pre_hook(grab, with_kwargs=True)
    try:
        extract(lm, enc_text, images=images, layers=[layer])
    finally:
        h.remove()
    return caught["x"][0]  # (T, D)


# Each family's grid of image tokens for one picture, by hand from its tiny config (not from headscope's layout).
# (rows, columns, view) of the first grid of image tokens. LLaVA-NeXT's first grid is the thumbnail's.
def _qwen_grid(lm, images):
    """Qwen-VL: the processor's patch grid (t, h, w) of the picture, 2 x 2 patches merged into one token."""
    _, h, w = lm.processor.image_processor(images, return_tensors="pt")["image_grid_thw"][0].tolist()
    merge = lm.model.config.vision_config.spatial_merge_size
    return h // merge, w // merge, "base"


HAND_GRID = {
    "llava": lambda cfg: (cfg.vision_config.image_size // cfg.vision_config.patch_size,) * 2 + ("base",),
    "llava_next": lambda cfg: (cfg.vision_config.image_size // cfg.vision_config.patch_size,) * 2 + ("thumbnail",),
    "llava_onevision": lambda cfg: (cfg.vision_config.image_size // cfg.vision_config.patch_size,) * 2 + ("thumbnail",),
    "gemma3": lambda cfg: (int(round(cfg.mm_tokens_per_image ** 0.5)),) * 2 + ("base",),
    # Idefics3 / SmolVLM: the 40 x 52 picture is resized to 49 x 64 (longest edge 64), then to whole 32-pixel
    # tiles, 64 x 64: 2 x 2 tiles; the first grid is tile (0, 0), its 4 x 4 patches shuffled 2 x 2 into 2 x 2
    # tokens, each cell a quarter of the tile's quarter of the picture
    "idefics3": lambda cfg: (2, 2, "tile 0,0", lambda i, j: (i / 4, j / 4, (i + 1) / 4, (j + 1) / 4)),
    "smolvlm": lambda cfg: (2, 2, "tile 0,0", lambda i, j: (i / 4, j / 4, (i + 1) / 4, (j + 1) / 4)),
    "paligemma": lambda cfg: (cfg.vision_config.image_size // cfg.vision_config.patch_size,) * 2 + ("base",),
    # DeepSeek-VL: the picture padded to a square, one token per patch of it
    "deepseek_vl": lambda cfg: (cfg.vision_config.image_size // cfg.vision_config.patch_size,) * 2 + ("base",),
    # InternVL: the 40 x 52 picture's closest grid of at most 4 tiles is 2 x 2 (aspect 1.3: 1 x 1 and 2 x 2 tie at
    # 0.3, and 40 x 52 pixels > half of four 32 x 32 tiles); tile (0, 0)'s 8 x 8 patches shuffle into 4 x 4 tokens
    "internvl": lambda cfg: (4, 4, "tile 0,0", lambda i, j: (i / 8, j / 8, (i + 1) / 8, (j + 1) / 8)),
    # Aya Vision: InternVL's 2 x 2 tiles of the 40 x 52 picture; each tile's 4 x 4 patches shuffle into 2 x 2 tokens
    "aya_vision": lambda cfg: (2, 2, "tile 0,0", lambda i, j: (i / 4, j / 4, (i + 1) / 4, (j + 1) / 4)),
    # LightOnOCR: the 40 x 52 picture resized to fit 32 (24 x 32, whole 8-pixel cells), 4 x 4 patches merged 2 x 2
    "lighton_ocr": lambda cfg: (3, 4, "base"),
    "vipllava": lambda cfg: (cfg.vision_config.image_size // cfg.vision_config.patch_size,) * 2 + ("base",),
    "janus": lambda cfg: (cfg.vision_config.image_size // cfg.vision_config.patch_size,) * 2 + ("base",),
}
HAND_GRID_OF_INPUT = {"qwen2_vl": _qwen_grid, "qwen2_5_vl": _qwen_grid, "qwen3_vl": _qwen_grid, "qwen3_vl_moe": _qwen_grid,
                      "qwen3_5": _qwen_grid, "qwen3_5_moe": _qwen_grid}
HAND_GRID_OF_INPUT.update(dict.fromkeys(["glm4v", "glm4v_moe", "glm46v", "glm_ocr"], _qwen_grid))  # GLM-4V: Qwen-VL's merge


def test_a_head_built_to_read_one_patch_lands_on_it(reading):
    _one_patch(reading)


# the Qwen-VL types beside READING's qwen_vl (qwen2_vl). Not qianfan_ocr (beside internvl): its picture makes ~90 tokens
# for a 32-wide decoder whose keys are RMS-normed per head, so no key weight singles one token out; its layout is
# InternVL's (tested there), its decoder verified
@pytest.mark.parametrize("model_type", ["qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe"])
def test_a_head_built_to_read_one_patch_lands_on_it_in_every_qwen_vl(model_type):
    _one_patch(_tiny_type(model_type))


# the GLM-4V types beside READING's glm4v
@pytest.mark.parametrize("model_type", ["glm4v_moe", "glm46v", "glm_ocr"])
def test_a_head_built_to_read_one_patch_lands_on_it_in_every_glm4v(model_type):
    _one_patch(_tiny_type(model_type))


def _one_patch(reading):
    """Head 0 of the last layer (full attention: no sliding window hides the image) is set so that the last token's query matches one image token's key alone: the image
    token of cell (1, 2) (or (1, 1) of a 2 x 2 grid), found by hand: the image-token id at place row x columns + column
    among the processor's ids, with the rows and columns of the family's grid. Its row's argmax must land there and carry that ImagePatch."""
    from headscope.probe.families import family_for

    lm = dataclasses.replace(reading, model=copy.deepcopy(reading.model))
    family = family_for(lm.config)
    slot = _slot(lm)
    text, images = f"Here {slot} is a cat", [_picture(3)]
    cfg = lm.model.config
    if lm.model_type in HAND_GRID_OF_INPUT:
        rows, cols, view, *box = HAND_GRID_OF_INPUT[lm.model_type](lm, images)
    else:
        rows, cols, view, *box = HAND_GRID[lm.model_type](cfg)
    image_id = cfg.image_token_id if getattr(cfg, "image_token_id", None) is not None else cfg.image_token_index
    last = lm.config.num_hidden_layers - 1
    [before] = extract(lm, text, images=images, layers=[last])
    cell = (1, min(2, cols - 1))
    # the cell's place among the image-token ids (a family may put a learned token that is not one between rows)
    target = [t for t, i in enumerate(before.token_ids) if i == image_id][cell[0] * cols + cell[1]]
    x = _layer_input(lm, text, images, family, last).double()  # a layer's input does not depend on its attention
    one_hot = torch.zeros(x.shape[0], dtype=torch.float64)
    one_hot[target] = 1.0
    w = torch.linalg.lstsq(x, one_hot[:, None]).solution[:, 0]  # x_j · w = 1 at the patch, 0 elsewhere
    attn = family.attention(base_model(lm), last)
    hs = attn.head_dim
    row = hs // 2 - 1  # the slowest rotary pair: positions barely turn it over a few dozen tokens
    query = len(before) - 1
    with torch.no_grad():
        attn.q_proj.weight[:hs] = 0.0
        attn.k_proj.weight[:hs] = 0.0
        attn.q_proj.weight[row] = (x[query] / x[query].square().sum() * 400.0).float()  # q[row] = 400
        attn.k_proj.weight[row] = w.float()
        for proj in (attn.q_proj, attn.k_proj):
            if proj.bias is not None:
                proj.bias[:hs] = 0.0
        for norm in (getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)):  # Gemma 3: q, k normed
            if norm is not None:
                norm.weight[row] = 30.0  # the norm keeps the direction only: its weight gives the size back
    [m] = extract(lm, text, images=images, layers=[last])
    got = int(m.attention[0, 0, query].argmax())
    assert got == target and m.attention[0, 0, query, target] > 0.9
    assert m.patches[got] == ImagePatch(0, *cell, rows, cols, view=view, box=box[0](*cell) if box else None)


# issue 49, more types (branch i49-more): their grids by hand, as above
HAND_GRID.update({
    "shieldgemma2": lambda cfg: (int(round(cfg.mm_tokens_per_image ** 0.5)),) * 2 + ("base",),  # Gemma 3's pooled grid
    # Granite Docling: the 40 x 52 page fits one 64-pixel tile, read alone (no global image): its 16 x 16 patches
    # shuffled 4 x 4 into 4 x 4 tokens
    "granite_docling": lambda cfg: (cfg.vision_config.image_size // cfg.vision_config.patch_size
                                    // cfg.vision_config.scale_factor,) * 2 + ("base",),
    # Ovis2: the 40 x 52 picture takes 2 x 2 tiles of 32 pixels (fewer cover under 90% of it); the first grid is the
    # global image's, 32 / 8 = 4 patches a side grouped 2 x 2 (hidden_stride) into 2 x 2 tokens
    "ovis2": lambda cfg: (cfg.vision_config.image_size // cfg.vision_config.patch_size
                          // cfg.vision_config.hidden_stride,) * 2 + ("thumbnail",),
})
HAND_GRID_OF_INPUT.update({"exaone4_5": _qwen_grid, "llava_onevision1_5": _qwen_grid})  # the processor's grid, 2 x 2 merged


def _video_llama_3_grid(lm, images):
    """VideoLLaMA 3: the processor's patch grid (t, h, w) of the picture, merged by the image's own merge size."""
    out = lm.processor.image_processor(images, return_tensors="pt")
    _, h, w = out["image_grid_thw"][0].tolist()
    merge = int(out["image_merge_sizes"][0])
    return h // merge, w // merge, "base"


HAND_GRID_OF_INPUT["video_llama_3"] = _video_llama_3_grid


# Every vision–language type, verified by path on a hub-fidelity folder (tests/hub_fixtures.py), as a checkpoint and
# as an unseen one of another seed and other sizes
VL_TYPES = sorted(t for t, f in SUPPORTED_TYPES.items() if f.vision_language is not None)
HUB_PROCESSOR = {"glm_ocr": "Glm46VProcessor"}  # types transformers maps no processor to: their checkpoints' class


@pytest.mark.parametrize("variant", ["hub", "hidden"])
@pytest.mark.parametrize("model_type", VL_TYPES)
def test_a_hub_folder_of_every_type_verifies_by_path_with_its_relations(model_type, variant, hub_folder):
    import headscope as hs
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES
    import transformers

    folder, fixture = hub_folder(model_type, variant)
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "generation_config.json", "preprocessor_config.json", "processor_config.json",
            "tokenizer.json", "tokenizer_config.json"} <= names, names
    kind = PROCESSOR_MAPPING_NAMES.get(model_type) or HUB_PROCESSOR[model_type]  # GLM-OCR: named by its checkpoint
    assert ("video_preprocessor_config.json" in names) == ("video_processor" in getattr(transformers, kind).get_attributes())
    lm = hs.load(str(folder))
    if variant == "hidden":  # an unseen checkpoint's sizes, not the tiny default's
        default = _tiny_type(model_type).model.config
        assert lm.config.text_config.num_attention_heads == default.text_config.num_attention_heads // 2
        size = getattr(default.vision_config, "image_size", None)
        assert getattr(lm.model.config.vision_config, "image_size", None) == (size if size is None else
                                                            [2 * s for s in size] if isinstance(size, list) else 2 * size)
    assert lm.reads_images and type(lm.processor).__name__ == kind
    assert ("chat_template.json" in names) == bool(lm.processor.chat_template)  # PaliGemma's pretrained one has none
    broken = [name for name, holds in fixture.relations.items() if not holds(lm)]
    assert not broken, f"{model_type} lost {fixture.mirrors}'s relations: {broken}"
    picture = _picture(3)
    v = verify(lm, images=[picture])
    assert v.passed and v.max_abs_err <= 1e-5, v.to_frame()
    if SUPPORTED_TYPES[model_type].vision_language.cross is not None:
        return  # Mllama reads its image by cross-attention: no image tokens in the text
    [m] = extract(lm, "What is here?", images=[picture])
    cfg = lm.model.config
    image_id = cfg.image_token_id if getattr(cfg, "image_token_id", None) is not None else cfg.image_token_index
    ours = [i for i, t in enumerate(m.token_ids) if t == image_id]
    theirs = lm.processor(text=[m.text], images=[picture], return_tensors="pt")["input_ids"][0]
    assert len(ours) == int((theirs == image_id).sum()) > 0  # the processor's own count of image tokens
    assert all(m.patches[i] is not None or m.special[i] for i in ours)
    assert {i for i, p in enumerate(m.patches) if p is not None} <= set(ours)  # every patch on an image token


def test_the_decoder_mask_of_each_family_in_the_maps():
    """LLaVA: causal over text and image tokens. Gemma 3: the tokens of one image see each other both ways, text
    stays causal. PaliGemma: the image and prompt prefix sees itself both ways."""
    slot = "<image>"
    [llava] = extract(_tiny("llava"), f"A {slot} cat", images=[_picture()])
    upper = torch.triu(torch.ones(len(llava), len(llava), dtype=torch.bool), diagonal=1)
    assert llava.causal and llava.attention[..., upper].abs().max() == 0

    [gemma] = extract(_tiny("gemma3_vl"), "A <start_of_image> cat", images=[_picture()])
    assert not gemma.causal
    image = [i for i, p in enumerate(gemma.patches) if p is not None]
    first, last = image[0], image[-1]
    full = gemma.attention[-1]  # the last layer is a full-attention layer
    assert (full[:, first, last] > 0).all()  # an image token sees a later token of its image
    assert full[:, first, last + 1:].abs().max() == 0  # but no later text
    assert full[:, : first, first:].abs().max() == 0  # and text before the image does not see it

    [pali] = extract(_tiny("paligemma"), "A cat", images=[_picture()])
    assert not pali.causal and (pali.attention[:, :, 0, -1] > 0).all()  # the first image token sees the last prompt token



def test_a_sliding_layer_lets_paligemmas_prefix_see_itself_past_the_window_and_gemma3s_images_only_within_it():
    """transformers' masks: PaliGemma's sliding layers are (causal and window) or prefix, so a prefix longer than
    the window sees itself whole (PaliGemma 2 at 896 px: 4,096 image tokens, a 4,096-token window); Gemma 3's are
    window and (causal or image), so the window bounds an image too. Both verified, and the maps say so."""
    from headscope.probe.families import family_of_type

    pali = _tiny("paligemma")
    text = family_of_type("gemma2").tiny_config(pali.config.text_config.vocab_size, "gemma2")
    text.pad_token_id, text.sliding_window = pali.config.text_config.pad_token_id, 4
    pali2 = tiny_model("paligemma", text_config=text)
    assert pali2.config.text_config.layer_types[0] == "sliding_attention"
    v = verify(pali2, images=[_picture()])
    assert v.passed, v.to_frame()
    [m] = extract(pali2, "A cat", images=[_picture()])
    prefix = int((m.attention[0, 0, 0] > 0).sum())  # the first image token sees the whole prefix, ahead of it
    assert prefix > 16 and (m.attention[0, :, prefix - 1, 0] > 0).all()  # its last token sees back past 4 keys

    gemma = tiny_model("gemma3", as_type=True)
    text = type(gemma.config.text_config)(**{**gemma.config.text_config.to_dict(), "sliding_window": 2})
    gemma2w = tiny_model("gemma3", as_type=True, text_config=text)
    assert verify(gemma2w, images=[_picture()], texts=["A <start_of_image> cat"]).passed
    [g] = extract(gemma2w, "A <start_of_image> cat", images=[_picture()])
    image = [i for i, p in enumerate(g.patches) if p is not None]
    assert len(image) > 2 and (g.attention[0, :, image[0], image[2]] > 0).all()  # an image sees ahead in itself
    assert g.attention[0, :, image[2], image[0]].abs().max() == 0  # but not back past the window of 2

# --- the command line: --image on a vision–language decoder ---------------------------------------------------


def _cli(*args):
    from click.testing import CliRunner

    from headscope.cli import cli

    return CliRunner().invoke(cli, list(args))



def test_cli_verify_reads_an_image_with_a_text_or_alone(picture_file):
    import json

    result = _cli("verify", "--model", "tiny:llava", "--image", picture_file, "--json")
    record = json.loads(result.stdout)
    assert result.exit_code == 0 and record["passed"] and {r["kind"] for r in record["layers"]} == {"vision", "decoder"}
    result = _cli("verify", "--model", "tiny:gemma3", "--image", picture_file, "--text", "A <start_of_image> cat")
    assert result.exit_code == 0 and "2 vision + 3 decoder layers" in result.output


def test_cli_refuses_slots_without_images_and_images_on_a_text_model(picture_file):
    from conftest import one_line

    result = _cli("verify", "--model", "tiny:llava", "--image", picture_file, "--text", "a <image> b <image>")
    assert result.exit_code == 2 and "2 <image> slot(s) but 1 image(s)" in one_line(result)
    result = _cli("verify", "--model", "tiny:llama", "--image", picture_file, "--text", "hi")
    assert result.exit_code == 2 and "text model" in one_line(result)


def test_cli_run_with_an_image_passes_the_maps_to_the_report(picture_file, tmp_path):
    import json

    result = _cli("run", "--model", "tiny:llava", "--image", picture_file, "--report", str(tmp_path / "report"), "--quiet")
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "report" / "run.json").read_text())
    model = record["models"][0] if "models" in record else record
    assert "verified" in json.dumps(model) and (tmp_path / "report" / "index.html").exists()


def test_llava_next_tiles_unpadded_with_a_newline_per_row():
    """A 30 x 100 picture: the best of the tiny pinpoints is 32 x 64 (two 32 x 32 tiles side by side: 4 x 8
    patches); fitted at 64 wide it is 19 high, so one padded patch row is removed above and below (4 - 2 * 1 = 2
    rows), each followed by <image_newline>; the 4 x 4 thumbnail comes first."""
    lm = _tiny("llava_next")
    [m] = extract(lm, "A <image> wide one", images=[_picture(4, (30, 100, 3))])
    views = [(p.view, p.rows, p.cols) for p in m.patches if p is not None]
    assert views.count(("thumbnail", 4, 4)) == 16 and views.count(("tiles", 2, 8)) == 16 and len(views) == 32
    newlines = [i for i, label in enumerate(m.labels) if label == "<image_newline>"]
    assert len(newlines) == 2 and all(m.patches[i] is None and m.special[i] for i in newlines)
    tiles = [i for i, p in enumerate(m.patches) if p is not None and p.view == "tiles"]
    assert newlines == [tiles[7] + 1, tiles[15] + 1]  # after each row of 8
    assert m.patches[tiles[8]].box == (0.5, 0.0, 1.0, 0.125)  # row 1, column 0 of 2 x 8 over the whole picture


def test_llava_onevision_base_view_then_unpadded_tiles_shrunk_past_its_limit():
    """The tiny model reads at most two tiles' worth of patches (`anyres_max_2`, 2 x 16) before it shrinks the tiles'
    grid. A 30 x 100 picture: two 32 x 32 tiles side by side (4 x 8 patches), one padded row removed above and
    below: 2 x 8 = 16 <= 32, kept. A 40 x 52 picture: the 64 x 64 pinpoint, four tiles (8 x 8); fitted at 8 columns
    it is round(40 * 8 / 52) = 6 rows high, so 6 x 8 = 48 > 1.1^2 x 32: ratio sqrt(48 / 32) = 1.2247, the grid
    shrinks to 6 // 1.2247 = 4 rows and 8 // 1.2247 = 6 columns. Each grid after the base view's 4 x 4, each
    tiles row followed by <image_newline>."""
    lm = _tiny("llava_onevision")
    for shape, (rows, cols) in (((30, 100, 3), (2, 8)), ((40, 52, 3), (4, 6))):
        [m] = extract(lm, "A <image> one", images=[_picture(4, shape)])
        image = [i for i, t in enumerate(m.token_ids) if t == lm.model.config.image_token_id]
        assert len(image) == 16 + rows * (cols + 1)  # the processor's count, which the forward pass also checked
        views = [(m.patches[i].view, m.patches[i].rows, m.patches[i].cols) if m.patches[i] else m.labels[i]
                 for i in image]
        assert views[:16] == [("thumbnail", 4, 4)] * 16
        assert views[16:] == ([("tiles", rows, cols)] * cols + ["<image_newline>"]) * rows
        last = m.patches[image[-2]]
        assert (last.row, last.col) == (rows - 1, cols - 1) and last.box[2:] == (1.0, 1.0)


@pytest.mark.parametrize("name", ["idefics3", "smolvlm"])
def test_pixel_shuffle_tiles_with_markers_then_the_global_image(name):
    """A 30 x 100 picture: resized to 19 x 64 (longest edge 64), then to whole 32-pixel tiles: 32 x 64, one row of
    two tiles. Each frame's 4 x 4 patches are shuffled 2 x 2 into 2 x 2 tokens. In order: <fake><row_1_col_1>
    and tile (0, 0)'s 4 tokens, <fake><row_1_col_2> and tile (0, 1)'s, a newline, then a newline, <fake>,
    <global-img>, the global image's 4 tokens (view thumbnail) and <fake>."""
    lm = _tiny(name)
    [m] = extract(lm, "A <image> wide one", images=[_picture(4, (30, 100, 3))])
    first = m.labels.index("<row_1_col_1>")
    f, t0, t1, g = "<fake_token_around_image>", "img0:tile 0,0:", "img0:tile 0,1:", "img0:thumbnail:"
    cells = ("r0c0", "r0c1", "r1c0", "r1c1")
    assert m.labels[first - 1 : first + 20] == (f, "<row_1_col_1>", *(t0 + c for c in cells), f, "<row_1_col_2>",
                                                 *(t1 + c for c in cells), "Ċ", "Ċ", f, "<global-img>",
                                                 *(g + c for c in cells), f)
    p = m.patches[first + 1 + 4 + 2 + 3]  # tile (0, 1), cell (1, 1): the right half's bottom-right quarter
    assert (p.view, p.row, p.col, p.rows, p.cols, p.box) == ("tile 0,1", 1, 1, 2, 2, (0.5, 0.75, 1.0, 1.0))
    assert m.pictures[0].shape == (32, 32, 3)  # the global image: the whole picture as one tile


def test_smolvlm_prompt_for_an_image_is_idefics3s():
    """tiny:smolvlm reads pictures with Idefics3's processor: its prompt for an image of rows x cols tiles is the
    string transformers' SmolVLM processor builds."""
    from transformers.models.smolvlm.processing_smolvlm import get_image_prompt_string

    proc = _tiny("smolvlm").processor
    for rows, cols in ((0, 0), (1, 2), (2, 3)):
        assert (proc.replace_image_token({"rows": [[rows]], "cols": [[cols]]}, 0)
                == get_image_prompt_string(rows, cols, 4, "<fake_token_around_image>", "<image>", "<global-img>"))


@pytest.mark.parametrize("name, overrides", [("llava_onevision", {"vision_aspect_ratio": "anyres_max_9"}),
                                             ("idefics3", {"scale_factor": 4}), ("smolvlm", {"scale_factor": 4})])
def test_other_configs_and_seeds_verify_with_their_layout(name, overrides):
    """Checkpoints built with another seed and config: LLaVA-OneVision allowed 9 tiles' worth of patches (the
    40 x 52 picture's 6 x 8 tiles grid is kept: 16 + 6 x 9 image tokens); Idefics3 / SmolVLM shuffling 4 x 4
    patches into one token (each 32 x 32 frame one token: 2 x 2 tiles and the global image, 5 tokens)."""
    from headscope.probe.tiny import tiny_model

    lm = tiny_model(name, seed=7, **overrides)
    [m] = extract(lm, "A <image> one", images=[_picture(4)])
    patches = [p for p in m.patches if p is not None]
    if name == "llava_onevision":
        assert m.labels.count("<image_newline>") == 6 and len(patches) == 16 + 6 * 8
        assert {(p.view, p.rows, p.cols) for p in patches} == {("thumbnail", 4, 4), ("tiles", 6, 8)}
    else:
        assert [(p.view, p.box) for p in patches] == [("tile 0,0", (0, 0, 0.5, 0.5)), ("tile 0,1", (0, 0.5, 0.5, 1)),
                                                      ("tile 1,0", (0.5, 0, 1, 0.5)), ("tile 1,1", (0.5, 0.5, 1, 1)),
                                                      ("thumbnail", (0, 0, 1, 1))]
    assert verify(lm, ["A <image> one"], images=[_picture(4)]).passed


@pytest.mark.parametrize("name", ["idefics3", "smolvlm"])
def test_a_picture_read_whole_is_one_base_grid(name):
    """Without image splitting the processor reads each picture as its global image alone: one 2 x 2 grid over
    the whole picture (view base), after <global-img>."""
    lm = _tiny(name)
    proc = copy.deepcopy(lm.processor)
    proc.image_processor.do_image_splitting = False
    whole = dataclasses.replace(lm, processor=proc)
    [m] = extract(whole, "A <image> one", images=[_picture(4, (30, 100, 3))])
    patches = [p for p in m.patches if p is not None]
    assert patches == [ImagePatch(0, i, j, 2, 2) for i in range(2) for j in range(2)]
    assert "<row_1_col_1>" not in m.labels and m.labels[m.labels.index("<global-img>") + 1] == "img0:r0c0"
    assert verify(whole, ["A <image> one"], images=[_picture(4, (30, 100, 3))]).passed


def test_the_hub_relations_are_checks_the_tiny_defaults_can_fail():
    """Where a fixture sets a relation the tiny default lacks, the default fails that relation's check (Gemma 3's
    window no wider than its image, SmolVLM shuffling 2 x 2 not 4 x 4, PaliGemma's Gemma decoder uncapped)."""
    from hub_fixtures import HUB

    for model_type in ("gemma3", "smolvlm", "paligemma", "llava_onevision", "llava"):
        relations = HUB[model_type].relations
        assert not all(holds(_tiny_type(model_type)) for holds in relations.values()), model_type
