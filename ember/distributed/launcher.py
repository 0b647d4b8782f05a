"""Finding the MPI launcher (mpiexec, or mpirun) that starts the ranks: the one installed beside this Python (the
mpich wheel puts it in the environment's bin folder) or the first on PATH."""

from __future__ import annotations

import os
import shutil
import sys

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
