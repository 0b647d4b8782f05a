"""Traces and plans: recording the schedules a program runs (trace.py), storing them with their kernels
(kernel_codec.py) and loading them ahead of a run (planner.py)."""
