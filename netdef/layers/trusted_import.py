"""Importing a Python layer's module only from places the user chose, whichever entry point builds the net.

Importing a module runs it, so a prototxt from elsewhere must not pick what runs. Python's own
``import`` also searches the entry it puts first on ``sys.path`` by itself: the working directory
(``python -c``, the interactive prompt, ``python -m``) or the folder of the running script. The
command line removes that entry at start, but a script calling ``netdef.Net(...)`` keeps it; so the
rule is applied here, where every net imports a layer's module:

- the folders the user named (``python_path``, ``NETDEF_PYTHON_PATH``, ``--python_path``) first;
- then ``sys.path`` without the working directory (``""`` or the current folder) and without the
  running script's folder; installed packages (including editable installs, found by their own
  finders) stay importable;
- a module the program has already imported is used as it is: importing it again runs nothing.

Some modules cannot hold a user's layer and only run a program when imported (``venv.__main__``
creates a virtualenv in the working directory): the standard library and any ``<package>.__main__``.
They are refused by name, before anything is searched or imported.
"""
from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys


class RefusedModuleError(ImportError):
    """A module name that cannot hold a user's layer; nothing was imported. The message says why."""


def refuse_non_layer_module(module_name: str) -> None:
    """Raise RefusedModuleError for the standard library and ``__main__`` modules of packages."""
    top = module_name.partition(".")[0]
    if top in sys.stdlib_module_names:
        raise RefusedModuleError(f"refused to import module {module_name!r}: it is part of Python's standard "
                                 f"library, which holds no user's layer (and may run a program when imported)")
    if module_name.endswith(".__main__"):
        raise RefusedModuleError(f"refused to import module {module_name!r}: a __main__ module is a program that "
                                 f"runs when imported, not a layer")


def import_layer_module(module_name: str, folders: tuple[str, ...]):
    """The module ``module_name``, its top-level package found only in ``folders`` and the trusted part
    of ``sys.path`` (see the module's doc). Raises RefusedModuleError or ModuleNotFoundError before
    running anything when it is refused or not found there."""
    refuse_non_layer_module(module_name)
    # The named folders go in front of sys.path, exactly as PYTHONPATH would put them, so that a
    # module can import its siblings; the user named them, so they are trusted for the process.
    for folder in reversed(folders):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    top = module_name.partition(".")[0]
    if top not in sys.modules:
        _load_top_level(top, folders)
    # Submodules are found through their package's own __path__: the package was trusted.
    return importlib.import_module(module_name)


def trusted_search_path(folders: tuple[str, ...]) -> list[str]:
    """``folders``, then the entries of sys.path that Python did not add on its own for the working
    directory or the running script."""
    untrusted = _implicit_entries()
    kept = [entry for entry in sys.path if entry and os.path.realpath(entry) not in untrusted]
    return [*folders, *(entry for entry in kept if entry not in folders)]


def _implicit_entries() -> set[str]:
    """Real paths of the folders Python's import would search without the user naming them."""
    entries = {os.path.realpath(os.getcwd())}
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    safe_path = sys.version_info >= (3, 11) and sys.flags.safe_path
    if main_file and not safe_path:
        entries.add(os.path.dirname(os.path.realpath(main_file)))
    return entries


def _load_top_level(top: str, folders: tuple[str, ...]) -> None:
    spec = _find_spec(top, trusted_search_path(folders))
    if spec is None:
        raise ModuleNotFoundError(f"No module named {top!r}", name=top)
    module = importlib.util.module_from_spec(spec)
    sys.modules[top] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        # As import does: a module that failed to run is not left half-made for the next lookup.
        sys.modules.pop(top, None)
        raise


def _find_spec(top: str, search_path: list[str]):
    """What ``import top`` would find, with the path-based search limited to ``search_path``; the
    other finders (installed editable packages, zip imports) are asked as import asks them."""
    for finder in sys.meta_path:
        if finder is importlib.machinery.PathFinder:
            spec = finder.find_spec(top, search_path)
        else:
            spec = finder.find_spec(top, None)
        if spec is not None:
            return spec
    return None
