"""`ember.memory_budget`: the bytes a realize may hold per pool (memory_budget.py) and the plan that frees and
recomputes intermediates to keep to them (plan.py)."""
