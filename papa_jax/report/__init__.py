"""The report over finished experiments: intervals, p-values, claims, controls, the per-head
section, markdown, figures, the README block."""
