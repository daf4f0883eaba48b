"""Helpers the tests and the benchmarks (bench/) both use, so that neither
imports the other: crafting frames (``frames``), the stored results' record
of the machine (``results``). Not part of the package (the wheel ships only
``pystream``)."""
