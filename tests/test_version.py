"""`netdef --version`: the installed distribution's version, which is the source's own."""
import subprocess
import sys
import tomllib

import netdef
from netdef.version import version
from tests.helpers import REPO


def test_version_prints_the_distribution_version():
    done = subprocess.run([sys.executable, "-m", "netdef.cli", "--version"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert done.stdout.strip() == f"netdef {declared}"
    assert version() == declared == netdef.__version__
