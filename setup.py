"""The compiled relay loop: what pyproject.toml cannot say.

Cython compiles the relay loop's one source, ``llmgw_runtime/router/http/_relay.py`` (plain
Python in Cython's pure-Python mode), as the extension module
``llmgw_runtime.router.http._crelay``: a copy named ``_crelay.py`` in the build's temporary
directory is compiled, so the compiled and the interpreted module keep different names and
can both be imported in one process (``router/http/relay.py`` chooses between them).

A machine without a C compiler or Python's headers still installs llmgw: the build of the
extension warns and is skipped, and the router runs the interpreted relay (its start-up log
and ``llmgw doctor`` say which one runs). docs/architecture.md, "The compiled relay loop".
"""

from __future__ import annotations

import hashlib
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SOURCE = os.path.join("llmgw_runtime", "router", "http", "_relay.py")
MODULE = "llmgw_runtime.router.http._crelay"
# The compiled module's name for the sha256 of the source it was compiled from: a build
# older than its source is found (the router's start-up log, `llmgw doctor`, the tests).
DIGEST_NAME = "SOURCE_SHA256"
HINT = ("the router will run the interpreted relay. Install build-essential and "
        "python3-dev and reinstall")


class OptionalBuildExt(build_ext):
    """Cythonizes a renamed copy of the relay's source, then builds it; any failure (no
    Cython, no compiler, no Python.h) warns and leaves the package without it, and without
    an earlier build of it (a stale relay must not run in place of the source's)."""

    def run(self) -> None:
        self._failed: set[str] = set()
        try:
            for ext in self.extensions:  # type: ignore[has-type]
                self._cythonize(ext)
            super().run()
        except Exception as exc:       # never fail the install for it
            self._skip(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:       # never fail the install for it
            self._failed.add(ext.name)
            self._remove_earlier_build(ext)
            self._skip(exc)

    def copy_extensions_to_source(self) -> None:
        """Editable installs: copy only what was built."""
        every = self.extensions  # type: ignore[has-type]
        self.extensions = [ext for ext in every if ext.name not in self._failed]
        try:
            super().copy_extensions_to_source()
        finally:
            self.extensions = every

    def _remove_earlier_build(self, ext: Extension) -> None:
        paths = [self.get_ext_fullpath(ext.name)]
        if self.inplace or getattr(self, "editable_mode", False):
            name = os.path.basename(self.get_ext_filename(ext.name))
            paths.append(os.path.join(os.path.dirname(SOURCE), name))
        for path in paths:
            if os.path.exists(path):
                os.remove(path)

    def _cythonize(self, ext: Extension) -> None:
        """``ext``'s Python source becomes C, in place (setuptools' own attributes of
        ``ext`` stay: editable installs need them)."""
        if not any(src.endswith(".py") for src in ext.sources):
            return                     # cythonized already (run called twice)
        from Cython.Build import cythonize

        workdir = os.path.join(self.build_temp, "relay")
        os.makedirs(workdir, exist_ok=True)
        copy = os.path.join(workdir, ext.name.rpartition(".")[2] + ".py")
        with open(ext.sources[0], "rb") as fh:
            source = fh.read()
        with open(copy, "wb") as fh:
            fh.write(source + b"\n\n# Written by setup.py: the source this module was "
                     b"compiled from.\n%s = %r\n"
                     % (DIGEST_NAME.encode(), hashlib.sha256(source).hexdigest()))
        [compiled] = cythonize([Extension(ext.name, [copy])], language_level=3,
                               compiler_directives={"binding": True}, annotate=False,
                               quiet=True)
        ext.sources = compiled.sources

    @staticmethod
    def _skip(exc: BaseException) -> None:
        why = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
        sys.stderr.write(f"WARNING: the compiled relay was not built ({why}); {HINT}\n")


setup(ext_modules=[Extension(MODULE, sources=[SOURCE])],
      cmdclass={"build_ext": OptionalBuildExt})
