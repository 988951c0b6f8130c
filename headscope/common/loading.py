"""Loading the models a command names, with the list of offline models when one cannot be had."""

from __future__ import annotations

from .exits import fail

__all__ = ["load_or_fail", "models_or_fail", "inputs_or_fail"]


def load_or_fail(name: str, placement=None):
    """Load a model where `placement` (`hs.Placement`, from the one option group `common.options.device`) puts it;
    an unknown or missing one exits with the list of offline models, one that cannot be placed
    (`probe.loading.PlacementError`) with what to change."""
    from headscope import load
    from headscope.probe.loading import PlacementError
    from headscope.probe.registry import ModelNotAvailable

    try:
        return load(name, placement=placement)
    except (ModelNotAvailable, PlacementError, RuntimeError) as exc:
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


def inputs_or_fail(names, *, images: bool) -> None:
    """Before any model loads: each model takes the input given (images with --image, else texts), its type read
    without loading it (`probe.loading.model_type_of`); the refusal `probe.images.require_modality` would give
    after loading, for the first model that would meet it (a second --model is not found out after the first
    was analysed). A model whose type only loading tells is checked then, as before."""
    from headscope.probe.images import modality_refusal
    from headscope.probe.loading import model_type_of

    for name in names:
        why = modality_refusal(name, model_type_of(name), images=images)
        if why is not None:
            fail(why)
