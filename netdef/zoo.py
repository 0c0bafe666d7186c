"""The model zoo (``models/`` in the source tree) as an installed package sees it: list and copy out.

The zoo's folders are installed as the package ``netdef.models`` (pyproject.toml maps it onto
``models/``), so a user who installed netdef with pip reaches them too::

    netdef zoo list                       # each model and the first line of its README
    netdef zoo copy resnet50 my_resnet    # the model's prototxts and README into my_resnet/

A model is a folder with a README.md and at least one ``.prototxt``. Copying never replaces a file
that exists unless asked (``overwrite``).
"""
from __future__ import annotations

import dataclasses
import importlib.resources
import os
import shutil


class ZooError(ValueError):
    """An unknown model, or a copy that would replace files."""


@dataclasses.dataclass(frozen=True)
class ZooModel:
    name: str
    title: str          # the README's first heading
    files: tuple        # file names in the model's folder


def zoo_root():
    """The zoo's folder (a Traversable: a directory of the installed package or of the checkout)."""
    return importlib.resources.files("netdef.models")


def _model(folder) -> ZooModel | None:
    names = sorted(entry.name for entry in folder.iterdir() if entry.is_file())
    if "README.md" not in names or not any(n.endswith(".prototxt") for n in names):
        return None
    title = ""
    for line in folder.joinpath("README.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip()
            break
    shipped = tuple(n for n in names if n.endswith((".prototxt", ".md")))
    return ZooModel(folder.name, title, shipped)


def list_models() -> list[ZooModel]:
    """The zoo's models, by name."""
    models = []
    for entry in zoo_root().iterdir():
        if entry.is_dir():
            model = _model(entry)
            if model is not None:
                models.append(model)
    return sorted(models, key=lambda m: m.name)


def find_model(name: str) -> ZooModel:
    models = {m.name: m for m in list_models()}
    if name not in models:
        raise ZooError(f"no model {name!r} in the zoo (there are: {', '.join(models)})")
    return models[name]


def copy_model(name: str, destination, overwrite: bool = False) -> list[str]:
    """Copy model ``name``'s prototxts and README into the folder ``destination`` (made if needed);
    returns the paths written. Refuses, writing nothing, when a file would be replaced and not
    ``overwrite``."""
    model = find_model(name)
    destination = os.fspath(destination)
    targets = [os.path.join(destination, f) for f in model.files]
    existing = [t for t in targets if os.path.lexists(t)]
    if existing and not overwrite:
        raise ZooError(f"not copying {name}: {', '.join(existing)} exist(s) (pass --overwrite to replace)")
    os.makedirs(destination, exist_ok=True)
    folder = zoo_root().joinpath(name)
    for file_name, target in zip(model.files, targets):
        with importlib.resources.as_file(folder.joinpath(file_name)) as source:
            shutil.copyfile(source, target)
    return targets
