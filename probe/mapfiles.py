"""Attention maps in a file, and back: one registry of file formats keyed by the file's suffix.

    save_maps(maps, "attention.safetensors")   # AttentionMaps held in memory, written whole
    maps = load_maps("attention.safetensors")  # the same AttentionMaps, labels and image positions included
    MAP_FORMATS[".npz"].write(path, entries, layers)   # the streaming form `headscope extract` uses

The file formats (every one self-describing: no sidecar file):

    .safetensors  one float32 tensor per map, named `map0`, `map1`, ...: [layer, head, query, key]. The file's
                  `__metadata__` holds one key, `headscope`: the JSON described below.
                  `safetensors.torch.load_file(path)["map0"]` reads a map with torch alone.
    .npz          one float32 array per map, `map0.npy`, ... ([layer, head, query, key]), and `headscope.npy`, a
                  0-d unicode array holding the JSON: `np.load(path)["map0"]`, `json.loads(str(np.load(path)
                  ["headscope"]))` with numpy alone (no pickle).
    .pt           `torch.save` of a dict: `"map0"`, ... float32 tensors and `"headscope"`, the JSON's dict;
                  `torch.load(path, weights_only=True)` reads it. Written from memory, so its maps must fit there.
    .parquet      long format, one row per (map, layer, head, query, key), in that order: columns `map` (int),
                  `text`, `layer`, `head` (model ids), `query`, `query_label`, `key`, `key_label`, `weight`
                  (float32, masked cells included as 0); the JSON in the schema's metadata under `headscope`.
                  One row group per layer of a map. Needs pyarrow.

The JSON (`FILE_KIND`, version `VERSION`):

    {"format": "headscope-attention", "version": 1, "order": ["layer", "head", "query", "key"],
     "dtype": "float32", "headscope": "<version>",
     "maps": [{"name": "map0", "shape": [L, H, Q, K], "text": ..., "level": "token" | "word",
               "labels": [...], "spans": [[start, end], ...], "special": [true, false, ...], "causal": false,
               "layer_ids": [...], "head_ids": [...],             # the model's layer and head of each row/column
               "layers": [...], "heads": [...],                   # the map's own fields (empty: all of them)
               "word_index": [...], "word_spans": [...], "token_ids": [...],
               "grid": [rows, cols] | null,                       # an image's patch grid
               "positions": [[row, col] | null, ...],             # each unit's cell on the grid (null: special)
               "patches": [{"image", "row", "col", "rows", "cols", "view", "box"} | null, ...],
                                                                  # a vision-language text's image tokens
               "meta": {...}, "sinks": false, "no_attention": [...]}, ...]}

A decoder that reads its images through cross-attention layers (Mllama: `ImageCrossAttention`) is two entries:
its self-attention map as above, then its cross-attention map, shape [L, H, Q, K] (the text's Q tokens over the
image's K keys), with `"kind": "cross"`, `"of": "<its self-attention entry's name>"`, the queries' `labels` and
the keys' `"keys": {"labels", "special", "patches"}` (each key's image, tile, row and column), and
`"gates"`: the tanh of each cross-attention layer's gates. `load_maps` gives the pair back as one
`ImageCrossAttention`.

`special` marks the special units ([CLS], [SEP], <bos>, an image's [CLS] and registers). The pictures themselves
are not stored (`image`, `pictures` come back as None / empty). A file is recognised as headscope's own by that
JSON: `is_map_file`; `check_target` refuses to replace any other file.
"""

from __future__ import annotations

import json
import math
import os
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, get_args

import torch

from .names import Level
from .types import AttentionMap, CrossAttentionMap, ImageCrossAttention, ImagePatch, Units, json_safe

__all__ = ["MapFormat", "MapEntry", "MAP_FORMATS", "FILE_KIND", "VERSION", "save_maps", "load_maps", "read_header",
           "is_map_file", "check_target", "entry_of", "entries_of", "file_bytes", "map_format", "write_entries"]

FILE_KIND = "headscope-attention"
VERSION = 1
_KEY = "headscope"
_ITEMSIZE = 4  # float32


@dataclass(frozen=True)
class MapEntry:
    """One map of a file without its attention: its tensor's name and shape, and everything else as JSON."""

    name: str
    shape: tuple[int, int, int, int]
    info: dict

    def to_dict(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), **self.info}

    @property
    def layer_size(self) -> int:
        """Bytes of one layer of this map: heads × query × key × 4."""
        return math.prod(self.shape[1:]) * _ITEMSIZE


def entry_of(amap: AttentionMap, index: int, *, layer_ids: Sequence[int] | None = None,
             head_ids: Sequence[int] | None = None, n_layers: int | None = None) -> MapEntry:
    """What a file says about `amap` (its attention is not read): map `index` of the file. `layer_ids` /
    `head_ids` / `n_layers` describe the tensor the file will hold when `amap` is only a template of it."""
    layer_ids = tuple(amap.layer_ids if layer_ids is None else layer_ids)
    head_ids = tuple(amap.head_ids if head_ids is None else head_ids)
    n = len(amap)
    info = {
        "text": amap.text, "level": amap.level, "labels": list(amap.labels), "spans": [list(s) for s in amap.spans],
        "special": [bool(s) for s in amap.special], "causal": bool(amap.causal),
        "layer_ids": list(layer_ids), "head_ids": list(head_ids), "layers": list(amap.layers),
        "heads": list(amap.heads), "word_index": list(amap.word_index),
        "word_spans": [list(s) for s in amap.word_spans], "token_ids": list(amap.token_ids),
        "grid": None if amap.grid is None else list(amap.grid),
        "positions": [None if p is None else list(p) for p in amap.positions],
        "patches": [_patch_json(p) for p in amap.patches],
        "meta": json_safe(amap.meta), "sinks": bool(amap.sinks), "no_attention": list(amap.no_attention),
    }
    shape = (len(layer_ids) if n_layers is None else n_layers, len(head_ids), n, n)
    return MapEntry(f"map{index}", shape, info)


def _patch_json(p: ImagePatch | None) -> dict | None:
    return None if p is None else {"image": p.image, "row": p.row, "col": p.col, "rows": p.rows, "cols": p.cols,
                                   "view": p.view, "box": list(p.box)}


def _patch_of(p: dict | None) -> ImagePatch | None:
    return None if p is None else ImagePatch(image=p["image"], row=p["row"], col=p["col"], rows=p["rows"],
                                             cols=p["cols"], view=p["view"], box=tuple(p["box"]))


def _cross_entry(pair: ImageCrossAttention, index: int, of: str) -> MapEntry:
    """The cross-attention map of `pair` as map `index` of a file, read together with its self-attention entry `of`."""
    cross = pair.cross
    info = {"kind": "cross", "of": of, "text": cross.queries.text, "level": cross.level,
            "labels": list(cross.queries.labels), "layer_ids": list(cross.layer_ids), "head_ids": list(cross.head_ids),
            "keys": {"labels": list(cross.keys.labels), "special": [bool(x) for x in cross.keys.special],
                     "patches": [_patch_json(p) for p in cross.keys.patches]},
            "gates": json_safe({kind: {str(k): v for k, v in by.items()} for kind, by in pair.gates.items()}),
            "meta": json_safe(cross.meta)}
    return MapEntry(f"map{index}", tuple(cross.attention.shape), info)


def entries_of(maps: Sequence[AttentionMap | ImageCrossAttention]) -> tuple[list[MapEntry], Layers]:
    """The entries of a file holding `maps` and their layers in file order: an `AttentionMap` is one entry, an
    `ImageCrossAttention` two (its self-attention map, then its cross-attention map)."""
    entries, tensors = [], []
    for i, m in enumerate(maps):
        if isinstance(m, ImageCrossAttention):
            entries.append(entry_of(m.decoder, len(entries)))
            entries.append(_cross_entry(m, len(entries), entries[-1].name))
            tensors += [m.decoder.attention, m.cross.attention]
        elif isinstance(m, AttentionMap):
            entries.append(entry_of(m, len(entries)))
            tensors.append(m.attention)
        else:
            raise TypeError(f"maps[{i}] is a {type(m).__name__}; a map file holds AttentionMaps and "
                            "ImageCrossAttentions (hs.extract's)")
    return entries, (layer for a in tensors for layer in a)


def _cross_of(info: dict, attention: torch.Tensor, decoder: AttentionMap) -> ImageCrossAttention:
    """The `ImageCrossAttention` of a cross entry and its self-attention map."""
    keys = info["keys"]
    patches = tuple(_patch_of(p) for p in keys["patches"])
    n = len(keys["labels"])
    units = Units(text="", level=info["level"], labels=tuple(keys["labels"]), spans=((0, 0),) * n,
                  special=tuple(keys["special"]), patches=patches,
                  word_index=tuple(range(n)) if info["level"] == "word" else ())  # each image key a word of its own
    layers = tuple(info["layer_ids"])
    cross = CrossAttentionMap(queries=Units.of(decoder), keys=units, attention=attention, layers=layers,
                              meta=dict(info["meta"]))
    gates = {kind: {int(k): v for k, v in by.items()} for kind, by in info.get("gates", {}).items()}
    return ImageCrossAttention(decoder=decoder, cross=cross, gates=gates)


def _header(entries: Sequence[MapEntry]) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    try:
        written_by = version("headscope")
    except PackageNotFoundError:  # a checkout on sys.path, not installed
        written_by = None
    return {"format": FILE_KIND, "version": VERSION, "order": ["layer", "head", "query", "key"], "dtype": "float32",
            "headscope": written_by, "maps": [e.to_dict() for e in entries]}


def _map_of(info: dict, attention: torch.Tensor) -> AttentionMap:
    """The `AttentionMap` a file's JSON entry and tensor describe."""
    if info["level"] not in get_args(Level):
        raise ValueError(f"level {info['level']!r}, neither of {', '.join(map(repr, get_args(Level)))}")
    pairs = lambda xs: tuple(tuple(x) for x in xs)  # noqa: E731
    patches = tuple(_patch_of(p) for p in info.get("patches", ()))
    return AttentionMap(
        text=info["text"], level=info["level"], labels=tuple(info["labels"]), spans=pairs(info["spans"]),
        special=tuple(info["special"]), attention=attention, causal=info["causal"],
        word_index=tuple(info["word_index"]), word_spans=pairs(info["word_spans"]), token_ids=tuple(info["token_ids"]),
        layers=tuple(info["layers"]), heads=tuple(info["heads"]), meta=dict(info["meta"]), sinks=info["sinks"],
        no_attention=tuple(info["no_attention"]), grid=None if info["grid"] is None else tuple(info["grid"]),
        patches=patches)


Layers = Iterable[torch.Tensor]  # every map's layers in file order: map0's [head, query, key] layer 0, 1, ..., map1's


def _checked(entries: Sequence[MapEntry], layers: Layers) -> Iterator[tuple[MapEntry, int, torch.Tensor]]:
    """(entry, layer, contiguous float32 [head, query, key]) in file order; a tensor of the wrong shape, or too
    few or too many of them, raise (a writer never writes a file its header does not describe)."""
    stream = iter(layers)
    for entry in entries:
        for layer in range(entry.shape[0]):
            a = next(stream, None)
            if a is None:
                raise RuntimeError(f"{entry.name}: layer {layer} of {entry.shape[0]} never came")
            if tuple(a.shape) != entry.shape[1:]:
                raise RuntimeError(f"{entry.name} layer {layer} is {tuple(a.shape)}, the file says {entry.shape[1:]}")
            yield entry, layer, a.detach().to("cpu", torch.float32).contiguous()
    if next(stream, None) is not None:
        raise RuntimeError("more layers came than the file's maps hold")


def _bytes(a: torch.Tensor) -> memoryview:
    return memoryview(a.numpy()).cast("B")  # little-endian on every platform torch runs on


# ---------------------------------------------------------------- .safetensors


def _write_safetensors(path: Path, entries: Sequence[MapEntry], layers: Layers) -> None:
    """The safetensors layout (8-byte little-endian header size, JSON header, data) written layer by layer: the
    header is known before any attention is, since it holds only names, shapes and offsets."""
    header: dict[str, Any] = {"__metadata__": {_KEY: json.dumps(_header(entries), ensure_ascii=False)}}
    offset = 0
    for e in entries:
        size = math.prod(e.shape) * _ITEMSIZE
        header[e.name] = {"dtype": "F32", "shape": list(e.shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for _, _, a in _checked(entries, layers):
            f.write(_bytes(a))


def _read_safetensors(path: Path, *, header_only: bool = False):
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        header = json.loads((f.metadata() or {}).get(_KEY, "null"))
        if header_only or not _ours(header):
            return header, {}
        return header, {e["name"]: f.get_tensor(e["name"]) for e in header["maps"]}


# ---------------------------------------------------------------- .npz


def _write_npz(path: Path, entries: Sequence[MapEntry], layers: Layers) -> None:
    """`numpy.savez`'s layout (a zip of .npy files, stored, ZIP64) with each array's data written layer by layer."""
    import numpy as np

    meta = np.array(json.dumps(_header(entries), ensure_ascii=False))
    stream = _checked(entries, layers)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as z:
        with z.open(f"{_KEY}.npy", "w", force_zip64=True) as f:
            np.lib.format.write_array(f, meta, allow_pickle=False)
        for e in entries:
            with z.open(f"{e.name}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array_header_2_0(f, {"descr": "<f4", "fortran_order": False, "shape": e.shape})
                for _ in range(e.shape[0]):
                    f.write(_bytes(next(stream)[2]))
    if next(stream, None) is not None:
        raise RuntimeError("more layers came than the file's maps hold")


def _read_npz(path: Path, *, header_only: bool = False):
    import numpy as np

    with np.load(path, allow_pickle=False) as z:
        if _KEY not in z.files:
            return None, {}
        header = json.loads(str(z[_KEY]))
        if header_only or not _ours(header):
            return header, {}
        return header, {e["name"]: torch.from_numpy(z[e["name"]]) for e in header["maps"]}


# ---------------------------------------------------------------- .pt


def _write_pt(path: Path, entries: Sequence[MapEntry], layers: Layers) -> None:
    """One `torch.save` of every map: the maps are gathered in memory first (`MapFormat.streams` is False)."""
    gathered: dict[str, list[torch.Tensor]] = {e.name: [] for e in entries}
    for e, _, a in _checked(entries, layers):
        gathered[e.name].append(a)
    tensors = {name: torch.stack(ls) if ls else torch.empty(0, *e.shape[1:])
               for (name, ls), e in zip(gathered.items(), entries)}
    torch.save({_KEY: _header(entries), **tensors}, path)


def _read_pt(path: Path, *, header_only: bool = False):
    data = torch.load(path, map_location="cpu", weights_only=True)
    header = data.get(_KEY) if isinstance(data, dict) else None
    return header, ({} if header_only or not _ours(header) else {e["name"]: data[e["name"]] for e in header["maps"]})


# ---------------------------------------------------------------- .parquet

_LONG = ("map", "text", "layer", "head", "query", "query_label", "key", "key_label", "weight")


def _write_parquet(path: Path, entries: Sequence[MapEntry], layers: Layers) -> None:
    """Long format, one row group per layer of a map (never more than one layer's rows in memory)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("map", pa.int32()), ("text", pa.string()), ("layer", pa.int32()), ("head", pa.int32()),
                        ("query", pa.int32()), ("query_label", pa.string()), ("key", pa.int32()),
                        ("key_label", pa.string()), ("weight", pa.float32())],
                       metadata={_KEY: json.dumps(_header(entries), ensure_ascii=False)})
    with pq.ParquetWriter(path, schema) as writer:
        for e, layer, a in _checked(entries, layers):
            n_h, t, k = a.shape
            head, query, key = (g.reshape(-1) for g in np.indices((n_h, t, k), dtype=np.int32))
            labels = pa.array(e.info["labels"], pa.string())
            key_labels = pa.array(e.info["keys"]["labels"], pa.string()) if "keys" in e.info else labels
            index = int(e.name.removeprefix("map"))
            writer.write_table(pa.table({
                "map": pa.array(np.full(head.size, index, np.int32)),
                "text": pa.DictionaryArray.from_arrays(np.zeros(head.size, np.int32), [e.info["text"]]).cast(pa.string()),
                "layer": pa.array(np.full(head.size, e.info["layer_ids"][layer], np.int32)),
                "head": pa.array(np.asarray(e.info["head_ids"], np.int32)[head]),
                "query": pa.array(query), "query_label": labels.take(pa.array(query)),
                "key": pa.array(key), "key_label": key_labels.take(pa.array(key)),
                "weight": pa.array(a.numpy().reshape(-1)),
            }, schema=schema))


def _read_parquet(path: Path, *, header_only: bool = False):
    import pyarrow.parquet as pq

    meta = pq.read_schema(path).metadata or {}
    header = json.loads(meta[_KEY.encode()]) if _KEY.encode() in meta else None
    if header_only or not _ours(header):
        return header, {}
    table = pq.read_table(path, columns=["map", "weight"])
    weights = table.column("weight").to_numpy()
    maps = table.column("map").to_numpy()
    tensors, start = {}, 0
    for e in header["maps"]:  # rows are in file order: each map's cells, C order of its tensor
        size = math.prod(e["shape"])
        if size and (maps[start] != int(e["name"].removeprefix("map")) or maps[start + size - 1] != maps[start]):
            raise ValueError(f"{path}: the rows of {e['name']} are not where the file's header puts them")
        tensors[e["name"]] = torch.from_numpy(weights[start : start + size].copy()).reshape(e["shape"])
        start += size
    return header, tensors


# ---------------------------------------------------------------- the registry


@dataclass(frozen=True)
class MapFormat:
    """A file format for attention maps: `write(path, entries, layers)` writes every map's layers as they come
    (`layers`: each map's [head, query, key] tensors in file order), `read(path, header_only=)` gives the JSON
    header and the tensors by name. `streams`: written one layer at a time (else gathered in memory first);
    `needs`: a module it imports, checked before any work."""

    suffix: str
    write: Callable[[Path, Sequence[MapEntry], Layers], None]
    read: Callable[..., tuple[dict | None, dict[str, torch.Tensor]]]
    streams: bool = True
    needs: str | None = None


MAP_FORMATS: Mapping[str, MapFormat] = MappingProxyType({f.suffix: f for f in (
    MapFormat(".safetensors", _write_safetensors, _read_safetensors),
    MapFormat(".npz", _write_npz, _read_npz),
    MapFormat(".pt", _write_pt, _read_pt, streams=False),
    MapFormat(".parquet", _write_parquet, _read_parquet, needs="pyarrow"),
)})


def map_format(path: str | Path) -> MapFormat:
    """The format `path`'s suffix names; a ValueError lists the suffixes."""
    fmt = MAP_FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise ValueError(f"{path}: attention maps are written as {', '.join(MAP_FORMATS)}; give a name ending "
                         "in one of them")
    return fmt


def _ours(header: object) -> bool:
    return isinstance(header, dict) and header.get("format") == FILE_KIND and isinstance(header.get("maps"), list)


def read_header(path: str | Path) -> dict | None:
    """The headscope JSON of a maps file, or None when the file is not one of headscope's (or unreadable)."""
    try:
        header, _ = map_format(path).read(Path(path), header_only=True)
    except Exception:  # noqa: BLE001 - any file at all may be asked about: what is not ours is None
        return None
    return header if _ours(header) else None


def is_map_file(path: str | Path) -> bool:
    """True when `path` is an attention-maps file that headscope wrote (its JSON header says so)."""
    return read_header(path) is not None


def check_target(path: str | Path, *, force: bool = False) -> MapFormat:
    """The format of a new maps file at `path`, refused (ValueError, one line) when the suffix is no map format,
    the name is a folder or a symbolic link, or a file is there and `force` is not given or headscope did not
    write it: a file headscope did not write is never replaced."""
    path = Path(path)
    fmt = map_format(path)
    if len(os.fsencode(path.name)) > 255:  # first: such a name cannot even be looked at (ENAMETOOLONG)
        raise ValueError(f"{path.name[:40]}...: a file name of {len(os.fsencode(path.name))} bytes is longer than "
                         "file systems allow (255); give a shorter name")
    if path.is_symlink():
        raise ValueError(f"{path} is a symbolic link (to {os.readlink(path)}); headscope does not write through "
                         "links: give the file itself or a new name")
    if path.is_dir():
        raise ValueError(f"{path} is a folder; give a file name ending in {', '.join(MAP_FORMATS)}")
    folder = next(p for p in path.absolute().parents if p.exists())
    if not folder.is_dir():
        raise ValueError(f"{path}: {folder} is a file, not a folder; give a path inside a folder")
    if path.exists() and not force:
        raise ValueError(f"{path} already exists; pass --force to replace it, or choose another file")
    if path.exists() and not is_map_file(path):
        raise ValueError(f"{path} exists and is not an attention file headscope wrote; --force replaces only those: "
                         "choose another file")
    return fmt


def file_bytes(entries: Sequence[MapEntry]) -> int:
    """The attention's bytes in a file of `entries` (float32), what its size is made of."""
    return sum(math.prod(e.shape) for e in entries) * _ITEMSIZE


def write_entries(path: str | Path, entries: Sequence[MapEntry], layers: Layers) -> Path:
    """The file of `entries` with their `layers` (each map's [head, query, key] tensors in file order), in
    the format `path`'s suffix names, written beside its name and renamed over it when complete: an
    interrupted or failed write leaves nothing (the caller has checked `path` with `check_target`)."""
    path = Path(path)
    fmt = map_format(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial-{os.getpid()}-{os.urandom(4).hex()}{path.suffix}")
    try:
        fmt.write(tmp, entries, layers)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def save_maps(maps: AttentionMap | Sequence[AttentionMap], path: str | Path, *, force: bool = False) -> Path:
    """Write `maps` (`hs.extract`'s) to `path` in the format its suffix names (`MAP_FORMATS`: .safetensors,
    .npz, .pt, .parquet), with their labels, special marks and image positions; `load_maps` reads them back.

    An existing file is replaced only with `force` and only when headscope wrote it. The file is written
    beside its name and renamed over it when complete.

    >>> import tempfile, torch
    >>> m = AttentionMap(text="hi you", level="word", labels=("hi", "you"), spans=((0, 2), (3, 6)),
    ...                  special=(False, False), attention=torch.full((1, 1, 2, 2), 0.5), causal=False)
    >>> path = save_maps([m], Path(tempfile.mkdtemp()) / "a.safetensors")
    >>> [back] = load_maps(path)
    >>> back.labels, torch.equal(back.attention, m.attention)
    (('hi', 'you'), True)
    """
    maps = [maps] if isinstance(maps, (AttentionMap, ImageCrossAttention)) else list(maps)
    entries, layers = entries_of(maps)  # a TypeError for anything else, before any file is touched
    path = Path(path)
    check_target(path, force=force)
    return write_entries(path, entries, layers)


def load_maps(path: str | Path) -> list[AttentionMap | ImageCrossAttention]:
    """The `AttentionMap`s (and `ImageCrossAttention`s: a cross-attention reader's pairs) of a file `headscope extract` or `save_maps` wrote (.safetensors, .npz, .pt,
    .parquet), each with its labels, spans, special marks, layer and head ids and image positions; a
    file headscope did not write is a ValueError. The format of each file is described in `headscope.probe.mapfiles`.
    """
    path = Path(path)
    fmt = map_format(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        header, tensors = fmt.read(path)
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - each format's library has its own errors for a damaged file
        raise ValueError(f"{path} cannot be read as a {fmt.suffix} file ({_why(exc)}): it is damaged, cut short, or "
                         f"not a {fmt.suffix} file; write it again (headscope extract, hs.save_maps)") from None
    if not _ours(header):
        raise ValueError(f"{path} is not an attention file headscope wrote (no '{_KEY}' header in it)")
    version = header.get("version", 0)
    if not isinstance(version, int) or isinstance(version, bool):
        raise ValueError(f"{path}: its header is damaged (file version {version!r}, not a number); write it again "
                         "(headscope extract, hs.save_maps)")
    if version > VERSION:
        raise ValueError(f"{path} was written by a newer headscope (file version {version}); upgrade "
                         "headscope to read it")
    maps: list = []
    at: dict[str, int] = {}  # each self-attention entry's place in `maps`
    for i, e in enumerate(header["maps"]):
        try:
            if e.get("kind") == "cross":  # the cross-attention map of the self-attention map just read
                j = at[e["of"]]
                maps[j] = _cross_of(e, tensors[e["name"]], maps[j])
                continue
            maps.append(_map_of(e, tensors[e["name"]]))
            at[e["name"]] = len(maps) - 1
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise ValueError(f"{path}: map {i} of its header is damaged ({_why(exc)}); write the file again "
                             "(headscope extract, hs.save_maps)") from None
    return maps


def _why(exc: BaseException) -> str:
    """An exception as a short part of one line: its kind and the first line of its message."""
    text = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text[:160]}" if text else type(exc).__name__
