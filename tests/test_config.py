"""Configuration (TOML file + EMBER_* variables), pool limits and out-of-memory errors."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ember as em
from ember.settings import ConfigError, parse_bytes
from ember.scheduler.devices import get_device


def run_python(code: str, **environment: str) -> subprocess.CompletedProcess:
    import os

    env = {**os.environ, **environment}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=120)


def test_parse_bytes() -> None:
    assert parse_bytes("2GB", "test") == 2 * 1000**3
    assert parse_bytes("512MiB", "test") == 512 * 1024**2
    assert parse_bytes(1000, "test") == 1000
    with pytest.raises(ConfigError, match="not a byte size"):
        parse_bytes("lots", "test")


def test_config_file_and_environment(tmp_path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[backends]\nenabled = ["c"]\n[pools]\n"c:0" = "1MB"\n[c]\ndevices = 2\n')
    result = run_python(
        """
        import ember as em
        from ember.settings import CONFIG
        from ember.backends.registry import REGISTRY
        print([d.name for d in REGISTRY.probe("c")], REGISTRY.probe("c")[0].pool.limit_bytes)
        try:
            em.ones(10, device="opencl")
        except em.BackendUnavailable as error:
            print("unavailable:", error)
        """,
        EMBER_CONFIG=str(path), EMBER_POOL_LIMITS="c:1=2kB",
    )
    assert result.returncode == 0, result.stderr
    assert "['c:0', 'c:1'] 1000000" in result.stdout
    assert "disabled by the configuration" in result.stdout


def test_bad_config_file_is_named(tmp_path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("[backends\n")
    result = run_python("import ember; ember.ones(3).realize()", EMBER_CONFIG=str(path))
    assert result.returncode != 0
    assert "not valid TOML" in result.stderr and str(path) in result.stderr


def test_out_of_memory_is_clear_and_recoverable(device: str) -> None:
    pool = get_device(device).pool
    previous = pool.limit_bytes
    pool.limit_bytes = pool.used_bytes + 4096
    try:
        with pytest.raises(em.OutOfMemoryError, match=rf"memory pool {device}: cannot allocate 40000 bytes"):
            (em.ones(10_000, device=device) * 2).realize()
    finally:
        pool.limit_bytes = previous
    np.testing.assert_allclose((em.ones(10_000, device=device) * 2).numpy(), np.full(10_000, 2.0))
