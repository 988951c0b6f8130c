"""Images to patch tokens: checked images, the checkpoint's image processor, and a map's patch units.

An image is read (a path, a PIL image or an array), resized and normalised by the model's own image
processor (`lm.processor`, the PIL path), and becomes one sequence of units: the tokens the model puts
before its patches (`[CLS]`, DeiT's `[DIST]`, registers `[REG0]`, …; special units) and then one unit
per patch, row by row, labelled `r{row}c{col}`. The map keeps the patch grid (rows, columns) and the
image as the model saw it (un-normalised, `[H, W, 3]` in 0..1) for the views.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Iterable, Literal, Sequence

import numpy as np

from .encoding import Encoded
from .families import SUPPORTED_TYPES, TOWERS, Towers, family_of_type
from .model import LoadedModel

__all__ = ["check_images", "load_image", "image_name", "processor_refusal", "encode_images", "patch_labels", "patchify", "unpatchify", "ImageInput", "require_modality",
           "modality_refusal",
           "Towers", "TOWERS", "TOWER_NAMES", "is_two_tower", "tower", "for_input",
           "models_for", "as_seen"]


# Composite model types (`TOWERS`, composite type -> `Towers`: declared by the family of their image tower, the
# `towers` of probe/families/clip_vision.py): an image tower and a text tower that never attend to each other,
# compared only by their pooled embeddings (probe.towers). Every command reaches a tower through `for_input` / `tower`.
TOWER_NAMES = {"image": "image tower", "text": "text tower"}  # how results name each tower


def is_two_tower(lm: LoadedModel) -> bool:
    """Whether `lm` is a composite image-text model (`TOWERS`): a CLIP, SigLIP or SigLIP 2 checkpoint."""
    return getattr(lm, "model_type", None) in TOWERS


def tower(lm: LoadedModel, which: Literal["image", "text"]) -> LoadedModel:
    """The image or text tower of a two-tower model as a `LoadedModel` of its own (the same weights, not a copy),
    named `NAME (image tower)` / `NAME (text tower)`; each is extracted and verified like any image or text model."""
    spec = TOWERS.get(getattr(lm, "model_type", None))
    if spec is None:
        raise ValueError(f"{lm.name} ({lm.model_type}) is not a two-tower image-text model; towers are read from "
                         f"{', '.join(TOWERS)}")
    if which == "image":
        if lm.processor is None:
            raise ValueError(f"{lm.name}: its image tower needs the checkpoint's image processor; save it beside the "
                             "model (image_processor.save_pretrained(folder))")
        return replace(lm, name=f"{lm.name} ({TOWER_NAMES['image']})", model=getattr(lm.model, spec.image), tokenizer=None)
    if lm.tokenizer is None:
        raise ValueError(f"{lm.name}: its text tower needs the checkpoint's tokenizer; save it beside the model")
    return replace(lm, name=f"{lm.name} ({TOWER_NAMES['text']})", model=getattr(lm.model, spec.text), processor=None)


def for_input(lm: LoadedModel, *, images: bool) -> LoadedModel:
    """The model that reads this input: a two-tower model's image tower for images and its text tower for texts;
    any other model itself, once `require_modality` has accepted the input."""
    if is_two_tower(lm):
        return tower(lm, "image" if images else "text")
    require_modality(lm, images=images)
    return lm


def models_for(lm: LoadedModel, *, images: bool, texts: bool) -> list[LoadedModel]:
    """The models a run analyses for what was given: a two-tower model's image tower when images are given and its
    text tower when texts are given or no image is (each analysed and reported apart); any other model itself."""
    if not is_two_tower(lm):
        return [lm]
    return [tower(lm, "image")] * images + [tower(lm, "text")] * (texts or not images)

ImageInput = object  # a path (str or os.PathLike), a PIL.Image.Image, or a numpy array [H, W] / [H, W, 3 or 4]


def require_modality(lm: LoadedModel, *, images: bool) -> None:
    """A clear error for an image on a text model, or a text on an image model (a two-tower model takes both,
    each in its tower; a vision–language decoder reads both together: `probe.vision_language`)."""
    if is_two_tower(lm) or getattr(lm, "reads_images", False):
        return
    why = _wrong_input(lm.name, lm.model_type, is_image=bool(getattr(lm, "is_image", False)), images=images)
    if why is not None:
        raise ValueError(why)


def modality_refusal(name: str, model_type: str | None, *, images: bool) -> str | None:
    """`require_modality`'s refusal for a model of `model_type`, known before it loads (`probe.loading.model_type_of`),
    or None: the input fits, or the type is not one of headscope's (loading tells)."""
    family = SUPPORTED_TYPES.get(model_type)
    if model_type in TOWERS or family is None or family.vision_language is not None:
        return None
    return _wrong_input(name, model_type, is_image=family.modality == "image", images=images)


def _wrong_input(name: str, model_type: str | None, *, is_image: bool, images: bool) -> str | None:
    if images and not is_image:
        return (f"{name} is a text model ({model_type}); it takes texts, not images. "
                "Give it text, or load a vision transformer (e.g. tiny:vit)")
    if not images and is_image:
        return (f"{name} is an image model ({model_type}); it takes images, not texts. "
                "Pass images=[...] (CLI: --image FILE)")
    return None


def check_images(images: object) -> list:
    """The images as a list; a clear error for a wrong container (a single image is a list of one)."""
    if isinstance(images, (str, os.PathLike, np.ndarray)) or _is_pil(images):
        return [images]
    if isinstance(images, (bytes, bytearray, dict, set, frozenset)) or not isinstance(images, Iterable):
        raise TypeError(f"images must be a path, a PIL image, a numpy array or a list of them, got "
                        f"{type(images).__name__}")
    out = list(images)
    if not out:
        raise ValueError("images is empty; pass at least one image (a path, a PIL image or an array)")
    return out


def _is_pil(obj) -> bool:
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - PIL comes with matplotlib
        return False
    return isinstance(obj, Image.Image)


def load_image(i: int, item: object):
    """Image `i` as an RGB PIL image (the caller's image is never changed); one clear error naming it when it
    cannot be read. Every image of every command comes through here, under one rule:

    - its EXIF orientation is applied (a phone photo's Orientation tag: the picture as it is shown, upright);
    - `RGB` stays; `L` and `1` (grey, black and white) and `CMYK` / `YCbCr` / `HSV` are converted by PIL;
    - a transparent image (`RGBA`, `LA`, `P` with transparency, a 4-channel array) is composited on white,
      as transformers' `convert_to_rgb` does;
    - more than 8 bits a channel is scaled to 8 by its bit depth: `I;16` (16-bit PNG) and `uint16` arrays by
      65535, `I` (32-bit integers) by 255 or 65535 where its values fit, else by its own range (min..max);
      `F` (32-bit float) and float arrays read as 0..1 where they fit, else as 0..255 or 0..65535 where they
      fit, else by their own range;
    - any other mode PIL cannot turn into RGB is refused, naming the mode.
    """
    from PIL import Image, UnidentifiedImageError

    if _is_pil(item):
        return _as_rgb(_upright(item, f"image {i}"), f"image {i}")
    if isinstance(item, (str, os.PathLike)):
        path = os.fspath(item)
        if not os.path.isfile(path):
            raise ValueError(f"image {i}: no file {path!r}; give the path of a PNG or JPEG image")
        try:
            with Image.open(path) as img:
                img.load()
                name = f"image {i} ({path!r})"
                return _as_rgb(_upright(img, name), name)
        except Image.DecompressionBombError as exc:  # not an OSError: it came out as "unexpected ..."
            raise ValueError(f"image {i}: {path!r} is too large to decode safely ({exc}); scale it down (the model "
                             "resizes every image to its own size anyway)") from None
        except (UnidentifiedImageError, OSError) as exc:
            raise ValueError(f"image {i}: {path!r} is not an image PIL can read ({exc}); give a PNG or JPEG") from None
    if isinstance(item, np.ndarray):
        return _array_as_rgb(item, f"image {i}")
    raise TypeError(f"image {i} is a {type(item).__name__}; pass a path, a PIL image or a numpy array")


def _upright(img, name: str):
    """`img` turned as its EXIF Orientation tag says (a copy; `img` itself where it has no such tag)."""
    from PIL import ImageOps

    try:
        turned = ImageOps.exif_transpose(img)
    except Exception as exc:  # noqa: BLE001 - PIL raises many kinds on a broken EXIF block
        raise ValueError(f"{name}: its EXIF data cannot be read ({type(exc).__name__}: {exc}), so its "
                         "orientation is unknown; save it again without EXIF (or upright) and pass that") from None
    return img if turned is None else turned


def _as_rgb(img, name: str):
    """A PIL image of any mode as RGB, by the rule of `load_image`."""
    mode = img.mode
    if mode == "RGB":
        return img.copy()
    if mode.startswith("I") or mode == "F":  # more than 8 bits a channel: scaled, never clipped to white
        return _array_as_rgb(np.asarray(img), name, mode=mode)
    try:
        if mode in ("RGBA", "LA", "La", "RGBa", "PA") or (mode == "P" and "transparency" in img.info):
            return _on_white((img.convert("LA") if mode == "La" else img).convert("RGBA"))  # La: only via LA
        return img.convert("RGB")
    except (ValueError, OSError) as exc:
        raise ValueError(f"{name}: PIL cannot convert its mode {mode!r} to RGB ({exc}); save it as an 8-bit RGB "
                         "PNG or JPEG") from None


def _on_white(rgba):
    from PIL import Image

    return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")


def _array_as_rgb(item: np.ndarray, name: str, *, mode: str | None = None):
    """A numpy image ([H, W] or [H, W, 3 or 4]; uint8, uint16, other integers or floats) as RGB, by the rule of
    `load_image`."""
    from PIL import Image

    a = item
    if a.ndim == 2:
        a = a[..., None]
    if a.ndim != 3 or a.shape[-1] not in (1, 3, 4) or min(a.shape[:2]) < 1:
        raise ValueError(f"{name}: an array must be [H, W] or [H, W, 3 or 4], got shape {item.shape}")
    if a.dtype == bool or a.dtype.kind not in "uif":
        raise TypeError(f"{name}: an array must be uint8 (0..255), uint16 (0..65535) or float (0..1), got {a.dtype}")
    if a.dtype.kind == "f" and not np.isfinite(a).all():
        raise ValueError(f"{name}: the array holds NaN or infinite values")
    scaled = _to_unit(a.astype(np.float64), a.dtype, mode)  # 0..1
    rgb = (scaled * 255).round().astype(np.uint8)
    if rgb.shape[-1] == 1:
        rgb = np.repeat(rgb, 3, axis=-1)
    picture = Image.fromarray(np.ascontiguousarray(rgb), mode="RGBA" if rgb.shape[-1] == 4 else "RGB")
    return _on_white(picture) if picture.mode == "RGBA" else picture


def _to_unit(a: np.ndarray, dtype: np.dtype, mode: str | None) -> np.ndarray:
    """Values in 0..1 by the bit depth where it is known (uint8: 255, uint16 / I;16: 65535), else by the first of
    0..1 (floats), 0..255, 0..65535 that holds them all, else by their own range."""
    lo, hi = float(a.min()), float(a.max())
    if dtype == np.uint8:
        return a / 255
    if dtype == np.uint16 or (mode or "").startswith("I;16"):
        return a / 65535
    for top in ((1.0,) if dtype.kind == "f" else ()) + (255.0, 65535.0):
        if lo >= 0 and hi <= top:
            return a / top
    return (a - lo) / (hi - lo) if hi > lo else np.zeros_like(a)


def patch_labels(rows: int, cols: int) -> tuple[str, ...]:
    """`r{row}c{col}` for each patch, row by row (the order of the model's patch tokens).

    >>> patch_labels(2, 2)
    ('r0c0', 'r0c1', 'r1c0', 'r1c1')
    """
    return tuple(f"r{r}c{c}" for r in range(rows) for c in range(cols))


def image_name(i: int, item: object) -> str:
    """What results and errors call image `i`: its file's name, else `image i`."""
    return os.path.basename(os.fspath(item)) if isinstance(item, (str, os.PathLike)) else f"image {i}"


def encode_images(lm: LoadedModel, images: Sequence[object], *, first_index: int = 0) -> list[Encoded]:
    """Each image resized and normalised by `lm.processor`, as an `Encoded` holding its pixels
    `[3, H, W]`, its patch grid and its units' labels (prefix tokens special, then the patches)."""
    if lm.processor is None:
        raise ValueError(f"{lm.name} has no image processor; load the checkpoint with its "
                         "preprocessor_config.json (save_pretrained of the model and its image processor)")
    pictures = [load_image(first_index + i, item) for i, item in enumerate(images)]
    cfg = lm.config
    patch = cfg.patch_size if isinstance(cfg.patch_size, int) else cfg.patch_size[0]
    try:
        out = lm.processor(images=pictures, return_tensors="pt")
    except ValueError as exc:
        raise ValueError(processor_refusal(lm, pictures, images, first_index, exc)) from None
    if "spatial_shapes" in out:  # SigLIP 2 (naflex): patches already cut, a grid of its own per image, padded
        pixels = [unpatchify(out["pixel_values"][i], tuple(out["spatial_shapes"][i].tolist()), patch)
                  for i in range(len(pictures))]  # each (3, rows*p, cols*p): its real patches only
    else:
        pixels = list(out["pixel_values"])  # each (3, H, W)
    prefix = family_of_type(lm.model_type).prefix_tokens(cfg)
    encoded = []
    for i, item in enumerate(images):
        rows, cols = pixels[i].shape[-2] // patch, pixels[i].shape[-1] // patch
        labels = prefix + patch_labels(rows, cols)
        special = (True,) * len(prefix) + (False,) * (rows * cols)
        encoded.append(Encoded(text=image_name(first_index + i, item), ids=(0,) * len(labels), spans=((0, 0),) * len(labels),
                               special=special, pixels=pixels[i], grid=(rows, cols), labels=labels,
                               picture=as_seen(lm.processor, pixels[i][None])[0]))
    return encoded


def processor_refusal(lm: LoadedModel, pictures: list, items: Sequence[object], first: int, exc: ValueError) -> str:
    """One line for a processor that refused images (`exc`): the first image its image processor refuses alone
    (named as the caller gave it, `items[k]` being image `first + k`, with its size and what to do), else the
    images (and their text) together."""
    images = getattr(lm.processor, "image_processor", lm.processor)
    reason = " ".join(str(exc).split())
    for k, picture in enumerate(pictures):
        try:
            if images is not None:
                images(images=[picture], return_tensors="pt")
        except ValueError as alone:
            w, h = picture.size
            named = image_name(first + k, items[k])
            name = f"image {first + k}" + ("" if named == f"image {first + k}" else f" ({named})")
            return (f"{name}, {w} × {h} pixels: {lm.name}'s image processor refuses it ({' '.join(str(alone).split())});"
                    " crop or pad it to a less extreme shape (or a larger size) and pass that")
    return f"{lm.name}'s processor refuses these {len(pictures)} image(s): {reason}"


def unpatchify(patches, grid: tuple[int, int], patch: int):
    """SigLIP 2's patch rows (N, p·p·C), each patch's pixels row by row with the channels last, back to the
    image (C, rows·p, cols·p) of the first rows·cols (the real ones; the rest are padding).

    >>> import torch
    >>> unpatchify(torch.arange(8.0).view(2, 4), (1, 2), 1)  # two 1 x 1 patches of 4 channels
    tensor([[[0., 4.]],
    <BLANKLINE>
            [[1., 5.]],
    <BLANKLINE>
            [[2., 6.]],
    <BLANKLINE>
            [[3., 7.]]])
    """
    rows, cols = grid
    x = patches[: rows * cols].reshape(rows, cols, patch, patch, -1)  # (rows, cols, p, p, C)
    return x.permute(4, 0, 2, 1, 3).reshape(x.shape[-1], rows * patch, cols * patch)  # (C, rows*p, cols*p)


def patchify(pixels, patch: int):
    """Images (B, C, H, W) as SigLIP 2's patch rows (B, rows·cols, p·p·C), the inverse of `unpatchify`."""
    B, C, H, W = pixels.shape
    x = pixels.reshape(B, C, H // patch, patch, W // patch, patch)  # (B, C, rows, p, cols, p)
    return x.permute(0, 2, 4, 3, 5, 1).reshape(B, (H // patch) * (W // patch), patch * patch * C)


def as_seen(processor, pixels) -> np.ndarray:
    """The images as the model saw them, normalisation undone: [B, H, W, 3] in 0..1."""
    x = pixels.float().numpy().transpose(0, 2, 3, 1)  # (B, H, W, 3)
    if getattr(processor, "do_normalize", False):
        x = x * np.asarray(processor.image_std, dtype=np.float32) + np.asarray(processor.image_mean, dtype=np.float32)
    return np.clip(x, 0.0, 1.0)
