"""What every command shares: model options, loading with a clear error, JSON output."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

__all__ = ["model_options", "load_or_fail", "echo_json", "fail"]


def fail(message: str, code: int = 2) -> None:
    """Print `message` to stderr and exit with `code` — no traceback wall."""
    click.echo(f"headscope: {message}", err=True)
    sys.exit(code)


def model_options(fn):
    """--model, --device, --dtype, the way every command takes them."""
    fn = click.option("--dtype", type=click.Choice(["float32", "float16", "bfloat16"]), default="float32",
                      show_default=True, help="Weights and compute dtype.")(fn)
    fn = click.option("--device", type=click.Choice(["cpu", "cuda", "mps", "auto"]), default="cpu", show_default=True,
                      help="Where to run; 'auto' spreads a model too large for one GPU via accelerate's device_map.")(fn)
    return fn


def load_or_fail(name: str, device: str = "cpu", dtype: str = "float32"):
    """Load a model; an unknown or missing one exits with the list of offline models."""
    from headscope.probe import ModelNotAvailable, load_model

    try:
        return load_model(name, device=device, dtype=dtype)
    except ModelNotAvailable as exc:
        fail(str(exc))
    except RuntimeError as exc:
        fail(str(exc))


def echo_json(obj: Any) -> None:
    """Strict JSON on stdout (NaN/inf as null), the same cleaning as the report's data block."""
    from headscope.probe.types import json_safe

    click.echo(json.dumps(json_safe(obj), indent=2, ensure_ascii=False))


def verify_step(lm, *, enabled: bool = True) -> dict:
    """Verify `lm`'s attention before an analysis, so every result says what it stands on.

    Returns {"summary", "passed", "max_abs_err"} for the output. A mismatch is reported on stderr
    and makes the command exit 1 after its output (`finish`); an architecture no family
    covers is stated, not hidden.
    """
    from headscope.probe.families import UnsupportedArchitecture, UnsupportedFeature
    from headscope.probe.verify import verify

    if not enabled:
        return {"summary": "attention not verified (--no-verify)", "passed": None, "max_abs_err": None}
    try:
        v = verify(lm)
    except (UnsupportedArchitecture, UnsupportedFeature) as exc:
        return {"summary": f"attention not verified: {exc}", "passed": None, "max_abs_err": None}
    if not v.passed:
        click.echo(f"headscope: {v.summary()} — run `headscope verify --model {lm.name}` for the per-layer table",
                   err=True)
    return {"summary": v.summary(), "passed": v.passed, "max_abs_err": v.max_abs_err}


def finish(verification: dict) -> None:
    """Exit 1 when the attention behind the output failed verification (the output is still printed)."""
    if verification.get("passed") is False:
        sys.exit(1)


def verify_option(fn):
    return click.option("--no-verify", is_flag=True,
                        help="Skip recomputing the attention from scratch before the analysis.")(fn)
