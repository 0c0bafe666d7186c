"""The model zoo, installed as the package ``netdef.models`` (see netdef/zoo.py): prototxts and READMEs only."""
