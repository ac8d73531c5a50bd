"""netrl's benchmarks: one module per family, one entry point (``python -m benchmarks``, run.py).

Outside the package on purpose: nothing here ships with netrl, and netrl never imports it.
"""
