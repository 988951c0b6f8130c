"""analyses"""
__all__: list[str] = []

# coreference / relation probes
from .coref import ProbeResult, ProbeScores, score_probe  # noqa: E402
from .relations import RelationExample, builtin_set, read_gap, read_jsonl, read_probe_file  # noqa: E402

__all__ += ["ProbeResult", "ProbeScores", "score_probe", "RelationExample", "builtin_set", "read_gap", "read_jsonl",
            "read_probe_file"]

# per-head pattern analyses
from .corpus import CorpusError, builtin_corpus, iter_corpus, read_corpus  # noqa: E402
from .heads import METRICS, THRESHOLDS, HeadScoreAccumulator, HeadScores, assign_roles, score_corpus  # noqa: E402
from .induction import detection_pattern, pattern_score, repeated_random_tokens  # noqa: E402

__all__ += ["CorpusError", "builtin_corpus", "iter_corpus", "read_corpus", "METRICS", "THRESHOLDS",
            "HeadScoreAccumulator", "HeadScores", "assign_roles", "score_corpus", "detection_pattern", "pattern_score",
            "repeated_random_tokens"]
