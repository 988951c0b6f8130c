"""The workflows: each composes extraction (`probe`) with analysis (`analyses`) for one question.

    heads.py       what every head does over a corpus (`hs.heads`), the repeated random sequences
    relations.py   which head points a source word at its target: relation and coreference probes
    syntax.py      which heads follow dependency relations on a treebank, and their clusters
    ablation.py    does the head matter: ablation, gradient importance, the report's ablation evidence
    compare.py     which heads changed between two checkpoints
    run.py         one model, everything (`headscope run`): the `ModelAnalysis` a report is made of

Each takes a loaded model (`hs.load`) and plain data and returns a result object; `headscope`
(the façade) re-exports them, and the CLI commands are thin wrappers over them. This package
imports nothing itself: `import headscope` does not import torch.
"""
