"""Stands in for an xdist worker's missing main script (see tests/conftest.py); runs nothing.

multiprocessing's spawn start method re-runs the parent's main script in each child, so the stand-in
must be a real, importable file that does nothing.
"""
