"""``python -m shardcat``: the ``catalog`` command line."""

from shardcat.cli import main

main()
