"""TransformerLens beside headscope on circuits: composition scores and head-output patching.

A child process for `tests/test_circuits_peer.py` (and anyone comparing by hand), run in the
interpreter that has transformer-lens (`.venv-bench`, made by `benchmarks/setup_peer.sh`). It

1. loads the model with `hs.load` and wraps a deep copy in a `TransformerBridge` with
   `enable_compatibility_mode(fold_ln=True, center_writing_weights=False, center_unembed=False,
   fold_value_biases=False)`: the norms' weights folded into the weights that read the stream,
   nothing centred — headscope's convention for composition scores (`probe.composition`);
2. compares `all_composition_scores("Q" | "K" | "V")` with `hs.composition` on the first `--layers`
   layers (TransformerLens builds every [L, nh, L, nh] product at once in memory: 30 layers of smollm2
   need > 16 GB, so the peer is restricted to its first attention blocks);
3. patches each head's output (`blocks.L.attn.hook_z`, denoising: the corrupt prompt with the clean
   run's z of one head) of the `--patch-layers` (default the first, a middle and the last layer) on
   the first `--pairs` built-in ioi pairs of one token length, the same token ids for both tools, and
   compares the logit difference with `probe.patching.patch_metrics`.

Prints one JSON line: the largest |Δ| of each comparison.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import child_output  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--patch-layers", default="0,14,29",
                    help="Layers whose heads are patched, comma-separated ('all': every layer).")
    args = ap.parse_args(argv)

    import numpy as np
    import torch
    from importlib import metadata

    import headscope as hs
    from headscope.analyses.patching import builtin_pairs
    from headscope.probe.patching import patch_metrics, prepare_pairs
    from transformer_lens.model_bridge import TransformerBridge

    import time

    t0 = time.perf_counter()

    def say(what):
        print(f"[{time.perf_counter() - t0:.0f} s] {what}", file=sys.stderr, flush=True)

    torch.manual_seed(0)
    lm = hs.load(args.model)
    name = getattr(lm.model.config, "_name_or_path", "") or lm.name
    bridge = TransformerBridge.boot_transformers(name, hf_model=copy.deepcopy(lm.model),
                                                 tokenizer=copy.deepcopy(lm.tokenizer), device="cpu")
    bridge.enable_compatibility_mode(disable_warnings=True, fold_ln=True, center_writing_weights=False,
                                     center_unembed=False, fold_value_biases=False)
    out = {"model": lm.name, "tl_version": metadata.version("transformer-lens"), "layers": args.layers}

    say("bridge ready")
    # 2. composition scores on the first layers
    ours = hs.composition(lm, n_random=1, layers=args.layers)
    say("ours: composition")
    blocks_with = bridge.blocks_with
    bridge.blocks_with = lambda kind: blocks_with(kind)[: args.layers]
    diffs = {}
    for kind in ("q", "k", "v"):
        peer = bridge.all_composition_scores(kind.upper()).scores.detach().double().numpy()  # [La, ha, Lb, hb]
        mine = ours.scores[kind]
        finite = np.isfinite(mine)
        diffs[kind] = float(np.abs(peer[finite] - mine[finite]).max())
        out[f"example_{kind}"] = [float(mine[0, 0, 1, 0]), float(peer[0, 0, 1, 0])]
    bridge.blocks_with = blocks_with
    say("peer: composition")
    out["composition_max_abs_diff"] = diffs

    # 3. head-output patching (denoise) on ioi pairs of one length
    pairs = builtin_pairs("ioi")
    tok = lm.tokenizer
    lengths = [len(tok(p.clean)["input_ids"]) for p in pairs]
    keep = [p for p, n in zip(pairs, lengths) if n == lengths[0] and len(tok(p.corrupt)["input_ids"]) == n]
    keep = keep[: args.pairs]
    p = prepare_pairs(lm, [x.clean for x in keep], [x.corrupt for x in keep], [x.right for x in keep],
                      [x.wrong for x in keep])
    L, nh = lm.config.num_hidden_layers, lm.config.num_attention_heads
    chosen = range(L) if args.patch_layers == "all" else [int(x) for x in args.patch_layers.split(",")]
    sites = [("head", l, h) for l in chosen for h in range(nh)]
    say(f"ours: patching {len(sites)} heads")
    mine = patch_metrics(lm, p, [frozenset([s]) for s in sites], direction="denoise").numpy()  # [site, pair]
    idx = torch.arange(p.n)

    def metric(logits):
        last = logits[idx, p.last].double()
        return (last[idx, p.right] - last[idx, p.wrong]).numpy()

    with torch.no_grad():
        _, cache = bridge.run_with_cache(p.clean, names_filter=lambda n: n.endswith("attn.hook_z"))
        peer = np.zeros_like(mine)
        for i, (_, l, h) in enumerate(sites):
            def patch_z(z, hook, l=l, h=h):
                z = z.clone()
                z[:, :, h] = cache[f"blocks.{l}.attn.hook_z"][:, :, h]
                return z
            peer[i] = metric(bridge.run_with_hooks(p.corrupt, fwd_hooks=[(f"blocks.{l}.attn.hook_z", patch_z)]))
        clean_peer = metric(bridge(p.clean))
    say("peer: patching")
    clean = patch_metrics(lm, p, [frozenset()], direction="noise")[0].numpy()
    out["n_pairs"], out["tokens"] = p.n, int(p.clean.shape[1])
    out["patching_max_abs_diff"] = float(np.abs(peer - mine).max())
    out["clean_max_abs_diff"] = float(np.abs(clean_peer - clean).max())
    out["n_heads_patched"] = len(sites)
    best = sites[int(np.abs(mine - mine.mean()).mean(1).argmax())]
    out["largest_patch"] = f"L{best[1]}H{best[2]}"
    child_output(out)


if __name__ == "__main__":
    main()
