"""Composition scores and head-output patching beside TransformerLens on smollm2 (where the peer is installed).

The peer runs in its own interpreter (`.venv-bench`, `bash benchmarks/setup_peer.sh`) as the child
`benchmarks/peer_circuits.py`, as the benchmarks run it; without it these tests are skipped, saying why.
"""

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import common  # noqa: E402
import peer_tl  # noqa: E402


@pytest.fixture(scope="module")
def peer_result():
    python = peer_tl.peer_python()
    if python is None:
        pytest.skip(f"transformer-lens is not installed (optional benchmark dependency): {peer_tl.SETUP_HINT}")
    from headscope.probe.registry import KNOWN_MODELS, is_available

    if not is_available(KNOWN_MODELS["smollm2"]):
        pytest.fail("packaged model smollm2 is not installed; run scripts/setup.sh")
    return common.run_child("peer_circuits.py", ["--model", "smollm2", "--layers", "3", "--pairs", "4",
                             "--patch-layers", "0,14,29"],
                            python=python, env={"PYTHONPATH": str(REPO)}, timeout=1800)


@pytest.mark.slow
def test_composition_scores_agree_with_transformerlens(peer_result):
    # TransformerLens: fold_ln=True, no centring, no value-bias folding — headscope's convention
    for kind, diff in peer_result["composition_max_abs_diff"].items():
        assert diff < 1e-4, (kind, diff)


@pytest.mark.slow
def test_head_output_patching_agrees_with_transformerlens(peer_result):
    assert peer_result["clean_max_abs_diff"] < 1e-4
    assert peer_result["patching_max_abs_diff"] < 1e-4 and peer_result["n_pairs"] == 4
