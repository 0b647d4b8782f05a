"""Finding the MPI launcher (mpiexec, or mpirun) that starts the ranks: the one installed beside this Python (the
mpich wheel puts it in the environment's bin folder) or the first on PATH; and what `python -m ember info` says about
ember.distributed."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import sys
from typing import Any

from ember.distributed.process_group import INSTALL_HINT, is_available

LAUNCHERS = ("mpiexec", "mpirun")


def find_mpiexec() -> str | None:
    """The path of mpiexec (or mpirun): first the one in this Python's environment (`pip install mpich` puts it in
    sys.prefix/bin, which is not on PATH when the environment is not activated), then PATH; None when neither."""
    for name in LAUNCHERS:
        candidate = os.path.join(sys.prefix, "bin", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    for name in LAUNCHERS:
        found = shutil.which(name)
        if found is not None:
            return found
    return None


def describe() -> dict[str, Any]:
    """Whether ember.distributed can run here, mpi4py's version and the launcher's path, or why not (MPI itself is
    not initialized to find out)."""
    if not is_available():
        return {"available": False, "reason": f"mpi4py is not installed: {INSTALL_HINT}"}
    launcher = find_mpiexec()
    found = {"available": True, "mpi4py": importlib.metadata.version("mpi4py"), "mpiexec": launcher}
    if launcher is None:
        found["reason"] = "no mpiexec or mpirun beside this Python or on PATH: pip install mpich"
    return found
