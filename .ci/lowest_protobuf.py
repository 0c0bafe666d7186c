"""CI step: netdef works with the lowest protobuf that pyproject.toml claims (``protobuf>=X``).

That protobuf is installed, without dependencies, into a throwaway folder put first on PYTHONPATH, so
that it shadows the newer one in the environment while everything else (numpy, ...) is the
environment's. Then netdef is imported and a prototxt parsed and built. A few seconds.
"""
import pathlib
import re
import subprocess
import sys
import tempfile
import tomllib

REPO = pathlib.Path(__file__).resolve().parents[1]
CHECK = """
import google.protobuf, netdef
assert google.protobuf.__version__ == {version!r}, google.protobuf.__version__
net = netdef.Net('layer {{ name: "in" type: "Input" top: "x" input_param {{ shape {{ dim: 2 dim: 3 }} }} }}'
                 'layer {{ name: "ip" type: "InnerProduct" bottom: "x" top: "y" inner_product_param {{ num_output: 4 }} }}',
                 netdef.TEST)
assert net.blobs["y"].shape == (2, 4)
print("netdef", netdef.__version__, "imports and builds a net with protobuf", google.protobuf.__version__)
"""


def lowest_protobuf() -> str:
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    for requirement in dependencies:
        found = re.fullmatch(r"protobuf\s*>=\s*([\d.]+)\s*(,.*)?", requirement.strip())
        if found:
            return found.group(1)
    raise SystemExit("pyproject.toml has no protobuf>=X requirement")


def main() -> int:
    version = lowest_protobuf()
    with tempfile.TemporaryDirectory() as folder:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", folder,
                        f"protobuf=={version}"], check=True)
        env = {"PYTHONPATH": f"{folder}:{REPO}", "PATH": "/usr/bin:/bin"}
        return subprocess.run([sys.executable, "-c", CHECK.format(version=version)], env=env, cwd=folder).returncode


if __name__ == "__main__":
    sys.exit(main())
