"""`python -m client.cli` is the `minibroker` command."""

from client.cli import main

main()
