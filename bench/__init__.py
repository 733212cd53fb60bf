"""Performance benchmarks of the turn engine: `python -m bench` runs them all.

Each benchmark module exposes functions that take their sizes as arguments and return a
`Section` of `Figure`s (value, unit, goal, met/missed), so the smoke test can run every one
with tiny sizes and the full run with the sizes of the issue. See BENCHMARKS.md.
"""
