"""The CPU engine's entry point: ``python -m llmgw_runtime.engines.run_cpu_engine --model
PATH --host H --port P --alias NAME [FLAGS]`` runs :func:`xllamacpp_launcher.main`.

A module of its own, imported by nobody: the package imports the launcher (drivers.py
checks a catalog's args with it), so ``python -m`` of the launcher itself would run a
module already imported, and runpy prints a RuntimeWarning ("found in sys.modules after
import of package ...") into every engine log, in front of the error that matters."""

import sys

from .xllamacpp_launcher import main

if __name__ == "__main__":
    sys.exit(main())
