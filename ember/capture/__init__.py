"""`ember.jit`: capturing the commands a call runs (recording.py), planning their buffers in one arena (arena.py,
memory_plan.py) and replaying them (jit.py) through the scheduler's executor."""
