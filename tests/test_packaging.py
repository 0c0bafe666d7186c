"""What an installed netdef holds: every subpackage, the zoo (``netdef zoo``), the licence."""
from __future__ import annotations

import subprocess
import sys
import tomllib

from tests.helpers import REPO

NETDEF = [sys.executable, "-m", "netdef.cli"]


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_every_subpackage_is_installed():
    """pyproject.toml lists the packages (the zoo is mapped in from models/): a new subpackage
    missing from the list would be left out of a wheel."""
    listed = set(pyproject()["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "netdef").rglob("__init__.py")}
    assert on_disk - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert "netdef.models" in listed
    assert pyproject()["tool"]["setuptools"]["package-dir"]["netdef.models"] == "models"


def test_every_zoo_folder_is_a_listed_package_of_data_files():
    """A zoo folder's files are package data of its own package: setuptools warns at every install
    about a folder of data it could import but was not told of (and may drop it one day)."""
    listed = set(pyproject()["tool"]["setuptools"]["packages"])
    folders = {f"netdef.models.{p.parent.name}" for p in (REPO / "models").glob("*/*.prototxt")}
    assert folders and folders - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"


def test_the_distribution_name_is_free_and_the_licence_is_there():
    project = pyproject()["project"]
    assert project["name"] == "netdef-trainer"  # "netdef" on PyPI is another project
    assert project["license"] == "BSD-2-Clause"
    assert "BSD 2-Clause License" in (REPO / "LICENSE").read_text()


def test_install_advice_names_the_distribution_not_the_unrelated_netdef():
    """An extra is installed as netdef-trainer[...]; `pip install netdef[...]` would fetch another project."""
    sources = [*(REPO / "netdef").rglob("*.py"), REPO / "README.md", *(REPO / "models").rglob("*.md")]
    advising = [str(p.relative_to(REPO)) for p in sources if "netdef[" in p.read_text(encoding="utf-8")]
    assert advising == []


def test_advice_to_install_an_extras_package_names_the_extra():
    """A message that says `pip install cupy...` (or plyvel, scikit-learn, onnx, matplotlib,
    tensorboardX) names the extra that brings it, `pip install "netdef-trainer[gpu]"`, so that the
    versions pyproject.toml pins come with it; mpi4py's names the [mpi] extra."""
    import re

    extras = {extra: [re.split(r"[<>=\[; ]", requirement)[0] for requirement in requirements]
              for extra, requirements in pyproject()["project"]["optional-dependencies"].items()
              if extra not in ("test", "bench")}
    missing = []
    for path in (REPO / "netdef").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        for extra, packages in extras.items():
            for package in packages:
                for found in re.finditer(rf"pip install {re.escape(package)}\b", text):
                    # The message around the advice (it may span a few source lines).
                    around = text[max(0, found.start() - 300): found.end() + 300]
                    if f"netdef-trainer[{extra}]" not in around:
                        missing.append(f"{path.relative_to(REPO)}: {found.group(0)} without netdef-trainer[{extra}]")
    assert missing == []


def run(args, cwd):
    return subprocess.run(NETDEF + args, cwd=cwd, capture_output=True, text=True, timeout=60)


def test_zoo_help_says_what_list_and_copy_do(tmp_path):
    done = run(["zoo", "--help"], tmp_path)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())   # argparse wraps to the terminal's width
    assert "list: print each model of the zoo" in text and "with its title" in text
    assert "copy NAME [DIR]: write that model's train_val, deploy and solver prototxts and its README into DIR" in text
    assert "replaced only with --overwrite" in text


def test_zoo_lists_every_model_folder(tmp_path):
    done = run(["zoo", "list"], tmp_path)
    assert done.returncode == 0, done.stderr
    listed = {line.split()[0] for line in done.stdout.splitlines()}
    folders = {p.parent.name for p in (REPO / "models").glob("*/README.md")}
    assert listed == folders and "lenet" in listed
    assert any(line.startswith("lenet") and "LeNet on MNIST" in line for line in done.stdout.splitlines())


def test_zoo_copy_writes_the_model_and_never_replaces_a_file(tmp_path):
    done = run(["zoo", "copy", "resnet50", "mine"], tmp_path)
    assert done.returncode == 0, done.stderr
    for name in ("train_val.prototxt", "deploy.prototxt", "solver.prototxt", "README.md"):
        assert (tmp_path / "mine" / name).read_bytes() == (REPO / "models" / "resnet50" / name).read_bytes()
    (tmp_path / "mine" / "deploy.prototxt").write_text("mine")
    again = run(["zoo", "copy", "resnet50", "mine"], tmp_path)
    assert again.returncode != 0 and "--overwrite" in again.stderr and len(again.stderr.strip().splitlines()) == 1
    assert (tmp_path / "mine" / "deploy.prototxt").read_text() == "mine"
    forced = run(["zoo", "copy", "resnet50", "mine", "--overwrite"], tmp_path)
    assert forced.returncode == 0
    assert (tmp_path / "mine" / "deploy.prototxt").read_bytes() == (REPO / "models" / "resnet50" / "deploy.prototxt").read_bytes()
    unknown = run(["zoo", "copy", "nonet"], tmp_path)
    assert unknown.returncode != 0 and "no model 'nonet'" in unknown.stderr
