"""Testing tools: the numpy reference tensor (reference.py) and the fuzzer (fuzz.py, gradient_fuzz.py)."""
