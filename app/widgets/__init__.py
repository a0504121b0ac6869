"""Reusable widgets: plots, the config form and raw JSON view, the samples grid, the bucket histogram,
the memory ledger view and the GPU status label."""
