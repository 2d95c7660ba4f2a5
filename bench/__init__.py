"""Benchmarks of a real local cluster: `python -m bench <name> [--quick]` from the repo root.

Each bench starts its own controller and brokers (bench/harness.py), prints a table,
shows a progress bar on stderr and writes bench/results/<name>.json.
"""
