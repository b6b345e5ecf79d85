"""Helpers only tests and benchmarks use (planted leaks, presidio baseline): kept out of the library."""
