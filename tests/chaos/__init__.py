"""Chaos tests in the manner of Jepsen: a workload and a nemesis against a real cluster
(docker compose or local processes), a history of every operation, and a checker.

    python -m tests.chaos --help        campaigns from the command line (see __main__.py)
    pytest tests/chaos                  the checker's tests and short runs
"""
