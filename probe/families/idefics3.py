"""Idefics3: a SigLIP-like vision tower, a pixel-shuffle connector, and a Llama decoder. SmolVLM (smolvlm.py)
is the same layout with its own classes.

The processor resizes a picture to whole multiples of the tile size (`max_image_size`), cuts it into
rows × columns tiles and adds the whole picture resized to one tile (the global image); a small picture is read
as the global image alone. The tower reads every frame; the connector's pixel shuffle (space to depth) puts each
`scale_factor` × `scale_factor` block of patches into one token, so a frame is a g × g grid of image tokens,
g = image_size / patch_size / scale_factor, row by row.

An image's tokens, in the processor's order: for each tile (row by row) `<fake_token_around_image>`,
`<row_R_col_C>` and the tile's g × g tokens (view "tile r,c", each cell's box its place on the picture), a
newline after each row of tiles; then `<fake_token_around_image>`, `<global-img>` and the global image's tokens
(view "thumbnail"; "base" for a picture read whole), closed by `<fake_token_around_image>`. The row, column and
global markers are text tokens of their own (special units). The tiles of each picture are read from the
processor's ids: a frame's run of image tokens follows its marker, a picture's last run follows `<global-img>`,
and tiles of one row are parted by their two marker tokens alone (a new row adds the newline). The decoder is
causal, verified by its text family (llama); the tower by a projection spec (q, k, v, out_proj: SigLIP's
attention) on every frame.
"""

from __future__ import annotations

from ._reading import load_images_only, reading_family, text_config, text_family, tiny_chat_template
from ._vision import out_projection, projection_spec, tiny_vision_config
from ..family import Family, Refusal, Stack, VisionLanguage
from ..types import ImagePatch

FAKE, IMAGE, END, GLOBAL = "<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"
MARKERS = tuple(f"<row_{r + 1}_col_{c + 1}>" for r in range(6) for c in range(6))  # the processor's 6 x 6 ids
TOKENS = (FAKE, IMAGE, END, GLOBAL, *MARKERS)  # the tiny tokenizer's last tokens, in this order


def _language_model(base):
    return base.text_model


def _layer(base, i: int):
    return base.vision_model.encoder.layers[i].self_attn


VISION = Stack(kind="vision", layer_spec=lambda base, i, cfg: projection_spec(_layer(base, i)), attention=_layer,
               out_proj=lambda base, i: out_projection(_layer(base, i)),
               n_layers=lambda cfg: getattr(cfg, "composite", cfg).vision_config.num_hidden_layers)


def runs(ids: list[int], token: int) -> list[tuple[int, int]]:
    """The (start, end) of each run of `token` in `ids`."""
    runs: list = []
    for t, i in enumerate(ids):
        if i == token and (not runs or runs[-1][1] != t):
            runs.append((t, t + 1))
        elif i == token:
            runs[-1] = (runs[-1][0], t + 1)
    return runs


def frames(cfg, ids: list[int]) -> list[list[tuple[int, int]]]:
    """Each picture's frames (runs of image tokens) in a text's ids, tiles first, the global image last."""
    found = runs(ids, cfg.image_token_id)
    if not found:
        return []
    global_id = ids[found[-1][0] - 1]  # the last run is the last picture's global image, after <global-img>
    pictures: list = [[]]
    for run in found:
        pictures[-1].append(run)
        if ids[run[0] - 1] == global_id:
            pictures.append([])
    return pictures[:-1]


def _side(cfg) -> int:
    vision = cfg.vision_config
    return vision.image_size // vision.patch_size // cfg.scale_factor


def _image_units(cfg, inputs: dict, image: int) -> list:
    ids = [int(i) for i in inputs["input_ids"][0]]
    mine = frames(cfg, ids)[image]
    g = _side(cfg)
    if any(end - start != g * g for start, end in mine):
        raise ValueError(f"a frame of {mine[0][1] - mine[0][0]} image tokens, not {g} x {g}; this checkpoint's "
                         "image layout is not known")
    tiles = mine[:-1]
    if not tiles:
        return [ImagePatch(image, i, j, g, g) for i in range(g) for j in range(g)]
    parts = [b[0] - a[1] for a, b in zip(tiles, tiles[1:])]  # 2: <fake><row_r_col_c>; a new row adds the newline
    cols = next((k + 1 for k, n in enumerate(parts) if n != 2), len(tiles))
    rows = len(tiles) // cols
    if rows * cols != len(tiles):
        raise ValueError(f"{len(tiles)} tiles in rows of {cols}; this checkpoint's image layout is not known")
    return tile_units(image, rows, cols, g)


def tile_units(image: int, rows: int, cols: int, g: int) -> list:
    """A tiled picture's units: each tile's g × g grid row by row (view "tile r,c", each cell's box its place on the
    picture), tiles row by row, then the global image's grid (view "thumbnail")."""
    units: list = []
    for r in range(rows):
        for c in range(cols):
            units += [ImagePatch(image, i, j, g, g, view=f"tile {r},{c}",
                                 box=((r + i / g) / rows, (c + j / g) / cols, (r + (i + 1) / g) / rows,
                                      (c + (j + 1) / g) / cols)) for i in range(g) for j in range(g)]
    return units + [ImagePatch(image, i, j, g, g, view="thumbnail") for i in range(g) for j in range(g)]


def _picture(cfg, inputs: dict, image: int):
    """The picture's global image: its last frame among the text's frames (padding frames come after all)."""
    ids = [int(i) for i in inputs["input_ids"][0]]
    index = sum(len(f) for f in frames(cfg, ids)[: image + 1]) - 1
    return inputs["pixel_values"][0][index]


def _decoder_refusal(cfg) -> str | None:
    for refusal in text_family(cfg).refuses:
        reason = refusal.reason(text_config(cfg))
        if reason is not None:
            return reason
    return None


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    from . import family_of_type

    default = AutoConfig.for_model(model_type)
    text = default.text_config.model_type
    text_cfg = family_of_type(text).tiny_config(vocab, text).to_dict()
    text_cfg["max_position_embeddings"] = 512  # five frames of a tiled picture and a text: ~60 tokens each
    vision = tiny_vision_config(default.vision_config.model_type).to_dict()
    # the tokenizer's last tokens are TOKENS (added by tiny_model before the config is made)
    return AutoConfig.for_model(model_type, text_config=text_cfg, vision_config=vision, scale_factor=2,
                                image_token_id=vocab - len(TOKENS) + TOKENS.index(IMAGE))


def tiny_processor(processor_class: str, image_processor_class: str):
    """The tiny model's processor: pictures resized to at most 64 pixels, cut into 32 x 32 tiles (up to 2 x 2)."""
    def build(cfg, tokenizer):
        import transformers

        tile = cfg.vision_config.image_size
        images = getattr(transformers, image_processor_class)(
            size={"longest_edge": 2 * tile}, max_image_size={"longest_edge": tile}, do_image_splitting=True,
            image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
        return getattr(transformers, processor_class)(image_processor=images, tokenizer=tokenizer,
                                                      image_seq_len=_side(cfg) ** 2,
                                                      chat_template=tiny_chat_template(IMAGE))
    return build


def pixel_shuffle_family(name: str, processor_class: str, image_processor_class: str, *,
                         model_types: tuple[str, ...], takes_video: bool = False) -> Family:
    """An Idefics3-layout family (Idefics3, SmolVLM; `takes_video`: its hub processor class takes a video processor)."""
    return reading_family(
        name=name,
        model_types=model_types,
        features=("decoder: its text family (Llama), causal", "vision tower: SigLIP-like attention on every frame",
                  "pixel shuffle: one image token per scale_factor x scale_factor patches", "tiles with "
                  "<row_R_col_C> markers (view 'tile r,c' on the picture), then the global image ('thumbnail')"),
        decoder=_language_model,
        refuses=(Refusal("decoder", _decoder_refusal),),
        tiny_config=_tiny_config,
        vision_language=VisionLanguage(vision=VISION, vision_family="clip_vision", image_units=_image_units,
                                       tiny_processor=tiny_processor(processor_class, image_processor_class),
                                       image_tokens=lambda cfg: TOKENS, picture=_picture,
                                       # SmolVLM's processor class takes a video processor (Idefics3's does not)
                                       load_processor=load_images_only if takes_video else None),
    )


FAMILY = pixel_shuffle_family("idefics3", "Idefics3Processor", "Idefics3ImageProcessorPil", model_types=("idefics3",))
