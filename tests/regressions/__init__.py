"""Regression tests: each failure the fuzzer found, kept as a test."""
