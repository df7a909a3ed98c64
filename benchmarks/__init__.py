"""Side-by-side benchmarks of shardcat against tfd-utils and the physical limits.

Run them all with ``python -m benchmarks`` (``--help`` for options).
"""
