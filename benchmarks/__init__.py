"""Benchmarks: each suite compares tryll_fast against the baseline a user
would otherwise pick, in the same run. `python -m benchmarks.gates` turns the
latest results into pass/fail gates (ratios, so noisy machines still agree)."""
