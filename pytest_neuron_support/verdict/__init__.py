"""Pure evidence and the verdict rule: token parity and the teacher-forced check (``tokens``), cosines
(``embeddings``), per-step losses (``training``), the fluency judge's cheap checks (``fluency``), and
``decide``, the one home of the rule that turns evidence into (result, stage, basis, error).
"""
