"""ember's configuration: a TOML file in the user config directory, overridden by EMBER_* environment variables.

```toml
# ~/.config/ember/config.toml  (or the file named by EMBER_CONFIG)
[backends]
enabled = ["c", "opencl"]      # EMBER_BACKENDS=c,opencl      (default: every backend)
default_device = "c"           # EMBER_DEVICE=c               (default: the first available of c, opencl, wgpu, cuda)

[pools]                        # EMBER_POOL_LIMITS="c:0=2GB,opencl:0=512MB"
"c:0" = "2GB"

[c]
devices = 1                    # EMBER_C_DEVICES=2: split the CPU cores into that many c devices

[dummy]
devices = 8                    # EMBER_DUMMY_DEVICES: dummy:0 .. dummy:7 (compute nothing; for scheduler tests)

[sharding]
auto = "decide"                # EMBER_AUTO_SHARD unset / "decide": split a large output across devices when it
                               # does not fit its device's pool or when splitting pays; 1: always (by rows); 0: never

[graph]
rewrites = true                # EMBER_REWRITES=0: kernelize graphs as recorded (no graph rewrites)

[scheduler]
parallel_kernels = false       # EMBER_PARALLEL_KERNELS=1: independent small kernels run at once (graph-parallel)

[autograd]
backward_replay = true         # EMBER_BACKWARD_REPLAY=0: build and schedule every backward pass's graph anew
```
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ember.core.errors import EmberError

_UNITS = {"": 1, "B": 1, "KB": 1000, "MB": 1000**2, "GB": 1000**3, "KIB": 1024, "MIB": 1024**2, "GIB": 1024**3}


class ConfigError(EmberError, ValueError):
    """A configuration file or EMBER_* variable that ember cannot use; the message names it and what is valid."""


def parse_bytes(text: Any, where: str) -> int:
    """'2GB', '512MiB', '1000' or an int as a byte count."""
    if isinstance(text, int) and text >= 0:
        return text
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]I?B|B)?\s*", str(text), flags=re.IGNORECASE)
    if not match:
        raise ConfigError(f"{where}: {text!r} is not a byte size; use e.g. 1000, '512MB' or '2GiB'")
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "").upper()])


@dataclass
class Config:
    """The effective configuration (file, then environment)."""

    source: str = "defaults"
    enabled_backends: list[str] | None = None  # None: all
    default_device: str | None = None
    pool_limits: dict[str, int] = field(default_factory=dict)
    c_devices: int = 1
    dummy_devices: int = 8
    auto_shard: bool | None = None  # None: decided per output (sharding/decision.py); True: always; False: never
    rewrites: bool = True  # graph rewrites (scheduler/graph_rewrite.py) before kernelizing a new graph
    parallel_kernels: bool = False  # graph-parallel execution (backends/launch_group.py)
    backward_replay: bool = True  # a backward pass shaped like one before runs its program again (autograd/)

    def describe(self) -> list[str]:
        return [
            f"config source: {self.source}",
            f"enabled backends: {', '.join(self.enabled_backends) if self.enabled_backends else 'all'}",
            f"default device: {self.default_device or 'first available'}",
            "pool limits: " + (", ".join(f"{k}={v} bytes" for k, v in self.pool_limits.items()) or "none"),
            f"c devices: {self.c_devices}",
            f"dummy devices: {self.dummy_devices}",
            "automatic sharding: " + {None: "decided per large output (by memory and speed)",
                                      True: "every large output (EMBER_AUTO_SHARD=1)",
                                      False: "off (EMBER_AUTO_SHARD=0)"}[self.auto_shard],
            f"graph rewrites: {'on' if self.rewrites else 'off'}",
            f"parallel kernels: {'on' if self.parallel_kernels else 'off'}",
            f"backward replays: {'on' if self.backward_replay else 'off'}",
        ]


def _shard_mode(value: Any, where: str) -> bool | None:
    """sharding.auto / EMBER_AUTO_SHARD: True (always), False (never) or None (decided per output)."""
    text = str(value).strip().lower()
    if text in ("1", "true", "on", "yes"):
        return True
    if text in ("0", "false", "off", "no"):
        return False
    if text in ("", "decide", "auto"):
        return None
    raise ConfigError(f"{where}: {value!r} is not a sharding mode; use 1 (always), 0 (never) or 'decide' (default)")


def config_path() -> Path:
    if os.environ.get("EMBER_CONFIG"):
        return Path(os.environ["EMBER_CONFIG"])
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base, "ember", "config.toml")


def _read_file(path: Path) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise ConfigError(f"{path}: reading TOML on Python 3.10 needs the 'tomli' package") from None
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not valid TOML: {error}") from None


def load_config() -> Config:
    """Read the config file (if any) and apply the EMBER_* environment variables on top."""
    config = Config()
    path = config_path()
    if path.exists():
        data = _read_file(path)
        config.source = str(path)
        backends = data.get("backends", {})
        if "enabled" in backends:
            if not isinstance(backends["enabled"], list):
                raise ConfigError(f"{path}: backends.enabled must be a list of backend names")
            config.enabled_backends = [str(name) for name in backends["enabled"]]
        config.default_device = backends.get("default_device")
        for device, limit in data.get("pools", {}).items():
            config.pool_limits[str(device)] = parse_bytes(limit, f"{path}: pools.{device}")
        config.c_devices = int(data.get("c", {}).get("devices", 1))
        config.dummy_devices = int(data.get("dummy", {}).get("devices", 8))
        config.auto_shard = _shard_mode(data.get("sharding", {}).get("auto", "decide"), f"{path}: sharding.auto")
        config.rewrites = bool(data.get("graph", {}).get("rewrites", True))
        config.parallel_kernels = bool(data.get("scheduler", {}).get("parallel_kernels", False))
        config.backward_replay = bool(data.get("autograd", {}).get("backward_replay", True))
    environment = os.environ
    if environment.get("EMBER_BACKENDS"):
        config.enabled_backends = [name.strip() for name in environment["EMBER_BACKENDS"].split(",") if name.strip()]
        config.source += " + environment"
    if environment.get("EMBER_DEVICE"):
        config.default_device = environment["EMBER_DEVICE"]
    if environment.get("EMBER_POOL_LIMITS"):
        for item in environment["EMBER_POOL_LIMITS"].split(","):
            device, _, limit = item.partition("=")
            if not limit:
                raise ConfigError(f"EMBER_POOL_LIMITS: {item!r} is not device=size (e.g. c:0=2GB)")
            config.pool_limits[device.strip()] = parse_bytes(limit, f"EMBER_POOL_LIMITS ({device.strip()})")
    if environment.get("EMBER_C_DEVICES"):
        config.c_devices = int(environment["EMBER_C_DEVICES"])
    if environment.get("EMBER_DUMMY_DEVICES"):
        config.dummy_devices = int(environment["EMBER_DUMMY_DEVICES"])
    if environment.get("EMBER_AUTO_SHARD"):
        config.auto_shard = _shard_mode(environment["EMBER_AUTO_SHARD"], "EMBER_AUTO_SHARD")
    if environment.get("EMBER_REWRITES"):
        config.rewrites = environment["EMBER_REWRITES"] not in ("0", "false")
    if environment.get("EMBER_PARALLEL_KERNELS"):
        config.parallel_kernels = environment["EMBER_PARALLEL_KERNELS"] not in ("0", "", "false")
    if environment.get("EMBER_BACKWARD_REPLAY"):
        config.backward_replay = environment["EMBER_BACKWARD_REPLAY"] not in ("0", "", "false")
    if config.c_devices < 1:
        raise ConfigError(f"c devices must be at least 1, got {config.c_devices}")
    return config


CONFIG = load_config()
