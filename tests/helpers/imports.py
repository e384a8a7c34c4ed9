"""The imports of our own modules, read from their source (``if TYPE_CHECKING`` ones too): for the tests of
the packages' layering (tests/test_architecture.py, tests/harness/report/test_run_data.py)."""
from __future__ import annotations

import ast
from pathlib import Path

from helpers.checkout_env import ROOT

OURS = ("registry", "metrics", "kernels", "adapters", "harness")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, typing: bool = True) -> list[tuple[int, str]]:
    """(line, absolute module) of every import of ours in ``path``; ``typing`` False leaves out those under
    ``if TYPE_CHECKING`` (names for annotations only)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    mod = module_name(path)
    package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    skip = set() if typing else {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                                 and getattr(node.test, "id", None) == "TYPE_CHECKING" for n in ast.walk(node)}
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            name = ".".join([*base, *(node.module.split(".") if node.module else [])])
            if node.module is None or node.level:  # from . import x: x may be a module
                found += [(node.lineno, f"{name}.{a.name}") for a in node.names]
            else:
                found += [(node.lineno, name)]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
    return [(line, name) for line, name in found if name.split(".")[0] in OURS]


