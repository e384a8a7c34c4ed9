"""The layering of the packages, read from the code's imports (``if TYPE_CHECKING`` ones too: a reader
follows them as well): packages import one way (registry <- metrics; registry <- kernels <- adapters <-
harness), and inside each package its wings import one way, as docs/architecture.md draws them. A new
module joins its folder's wing; an import that runs back up fails here, naming the file and the import."""
from __future__ import annotations

import ast

import pytest

from helpers.checkout_env import ROOT
from helpers.imports import imports, module_name

#: each package's wings, lowest first: a module may import its own wing and the wings before it, never one
#: after it (a module named by its dotted prefix; the longest prefix that matches places a module)
LAYERS = {
    "registry": [["registry"]],
    "metrics": [["metrics"]],
    "kernels": [["kernels.seeding", "kernels.encoded", "kernels.packing", "kernels.rotation", "kernels.octahedral",
                 "kernels.lloyd_max", "kernels.joint_rounding", "kernels.values", "kernels.split_k",
                 "kernels._lengths", "kernels.checks", "kernels.fused_layout", "kernels.token_layout",
                 "kernels.registry"],
                ["kernels.triton", "kernels.cuda"],
                ["kernels.backend", "kernels.config"],
                ["kernels.base", "kernels.attention"],
                ["kernels.codecs", "kernels.engines"],
                ["kernels"]],
    "adapters": [["adapters.loading", "adapters.registry", "adapters.byte_tokenizer", "adapters.model_store"],
                 ["adapters.cache"],
                 ["adapters.protocol"],
                 ["adapters.hf", "adapters.wan", "adapters.aar"],
                 ["adapters"]],
    "harness": [["harness.run", "harness.stats"],
                ["harness.tasks", "harness.scale", "harness.bench"],
                ["harness.report"],
                ["harness.runner", "harness.lm_eval"],
                ["harness.cli"],
                ["harness"]],
}
#: which packages each package may import (besides itself)
PACKAGES = {"registry": set(), "metrics": {"registry"}, "kernels": {"registry"},
            "adapters": {"registry", "kernels"}, "harness": {"registry", "kernels", "adapters", "metrics"}}
#: wings that must not import each other though they share a layer
APART = [("kernels.codecs", "kernels.engines"), ("kernels.triton", "kernels.cuda"),
         ("adapters.hf", "adapters.wan"), ("adapters.hf", "adapters.aar"), ("adapters.wan", "adapters.aar"),
         ("harness.tasks", "harness.scale"), ("harness.tasks", "harness.bench"), ("harness.scale", "harness.bench"),
         ("harness.runner", "harness.lm_eval")]


def wing(name: str) -> tuple[int, str] | None:
    """(layer, wing) of a dotted module name: the longest wing prefix that names it."""
    top = name.split(".")[0]
    best = None
    for i, layer in enumerate(LAYERS.get(top, [])):
        for w in layer:
            if (name == w or name.startswith(w + ".")) and (best is None or len(w) > len(best[1])):
                best = (i, w)
    return best


SOURCES = sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def test_every_module_has_a_wing():
    assert not [module_name(p) for p in SOURCES if wing(module_name(p)) is None]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_run_one_way(path):
    mod = module_name(path)
    here = wing(mod)
    bad = []
    for line, name in imports(path):
        top = name.split(".")[0]
        if name == top == mod.split(".")[0]:  # `import harness`: the package itself, for its __file__
            continue
        if top != mod.split(".")[0]:
            if top not in PACKAGES[mod.split(".")[0]]:
                bad.append(f"line {line}: {name} (package {mod.split('.')[0]} may not import {top})")
            continue
        there = wing(name)
        if there is None or there[1] == here[1]:
            continue
        if there[0] > here[0] or tuple(sorted((here[1], there[1]))) in {tuple(sorted(a)) for a in APART}:
            bad.append(f"line {line}: {name} ({here[1]} may not import {there[1]})")
    assert not bad, f"{path.relative_to(ROOT)}: " + "; ".join(bad)


def test_no_private_name_leaves_its_folder():
    """A name that starts with '_' is its folder's own (the Triton kernels share their ``_unpack`` helpers):
    no module of another folder imports it."""
    crossing = []
    for path in SOURCES:
        folder = module_name(path).rpartition(".")[0] if path.name != "__init__.py" else module_name(path)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] in PACKAGES:
                source_folder = node.module.rpartition(".")[0]
                crossing += [f"{path.relative_to(ROOT)}:{node.lineno} {node.module}.{a.name}" for a in node.names
                             if a.name.startswith("_") and source_folder != folder]
    assert not crossing
