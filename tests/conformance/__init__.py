"""Conformance harness (issue 23): every combination an implemented kernel declares, run against a float64 oracle.

``space``: the declared space of each kernel (its ``Caps`` product), the validity filter (``Scheme`` refusing input
no checkpoint can have) and a deterministic covering sample. ``builders``: one builder per format family that makes
a random layer of a given kernel through the public constructors, and the float64 reference weight from an oracle
under ``tests/oracle`` (or the producer's own decoder) that shares no code with ``src``. ``run``: build, forward,
compare, and the per-kernel tallies that ``test_cpu_conformance.py`` asserts and ``benchmarks/conformance_report.py``
publishes. Nothing here writes to the repository.
"""
