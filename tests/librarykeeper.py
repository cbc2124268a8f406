"""A pytest plugin of the suite's (loaded by conftest.py): the installed libraries a test imports stay
imported after it, pytester's cleanup notwithstanding.

pytester snapshots ``sys.modules`` when a test asks for it and restores the snapshot when the test ends,
so that the modules an in-process session imported are forgotten. For installed libraries that is
harmful: torch (and its submodules) cannot be imported twice in one interpreter. A second ``import
torch`` initialises ``torch._C`` again and corrupts the heap (CI saw an xdist worker raise
``SystemError: ... bad call flags`` importing torch and another die of SIGSEGV in the garbage collector,
in tests far from the one that caused it); a second ``import torch.distributed`` registers its operator
library again and fails. Whatever a test does, this worker keeps one copy of each: every module of a
package installed in site-packages that was imported when the test's teardown began is put back after
it. The project's own modules and the files pytester writes are not installed: pytester still forgets
those, as it means to."""

from __future__ import annotations

import sys
import sysconfig
from collections.abc import Generator
from pathlib import Path
from types import ModuleType

import pytest

_INSTALLED = tuple({str(Path(sysconfig.get_paths()[key]).resolve()) for key in ("purelib", "platlib")})


def _is_installed(module: ModuleType | None) -> bool:
    path = getattr(module, "__file__", None)
    return bool(path) and str(Path(path).resolve()).startswith(_INSTALLED)


def installed_modules() -> dict[str, ModuleType]:
    """The imported modules of installed packages (a submodule without a file, such as ``torch.ops``,
    counts when its top-level package is installed)."""
    modules = dict(sys.modules)
    installed_tops = {name for name, module in modules.items() if "." not in name and _is_installed(module)}
    return {name: module for name, module in modules.items() if name.split(".")[0] in installed_tops}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    kept = installed_modules()
    try:
        return (yield)
    finally:
        for name, module in kept.items():
            sys.modules.setdefault(name, module)
