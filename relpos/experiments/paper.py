"""Figures of Shaw, Uszkoreit & Vaswani (2018), to set beside relpos's own results.

All numbers are BLEU on WMT 2014 English-German, copied from the paper (see
`shared/reference/shaw2018.md`): Table 1 (newstest2014, base model), Table 2 (k
sweep) and Table 3 (a^K / a^V ablation), both on newstest2013 with the base
model, relative positions only.
"""

# Row name (as in relpos.experiments.tables) -> (paper BLEU, where it comes from).
# abs is in Table 1 alone (newstest2014), the relative rows' ablation in Table 3 (newstest2013):
# each label names its set, and abs's the relative model's figure beside it there.
ABLATION_FIGURES: dict[str, tuple[float, str]] = {
    "abs": (26.5, "Table 1, newstest2014; rel_kv 26.8 there"),
    "rel_kv": (25.8, "Table 3, newstest2013"),
    "rel_k": (25.8, "Table 3, newstest2013"),
    "rel_v": (25.3, "Table 3, newstest2013"),
    "none": (12.5, "Table 3, newstest2013"),
}

# Clipping distance k -> paper BLEU (Table 2).
K_SWEEP_FIGURES: dict[int, float] = {
    0: 12.5,
    1: 25.5,
    2: 25.8,
    4: 25.9,
    16: 25.8,
    64: 25.9,
    256: 25.8,
}

# The paper's relative drop in steps per second against the absolute baseline.
SPEED_DROP = 0.07
