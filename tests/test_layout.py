"""The host frameworks in third_party/ know nothing of VIA-SD: imports run from the adapters to them only."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

THIRD_PARTY = Path(__file__).resolve().parents[1] / "third_party"
VIA_SD = ("viasd_adapters.verify", "viasd_adapters.routing", "viasd_adapters.search", "viasd_adapters.hosts")


def imported_modules(source: str, package: str) -> set[str]:
    """Absolute names of the modules `source` (a module of `package`) imports, relative imports resolved."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            names.update([base] + [f"{base}.{alias.name}" for alias in node.names])
    return names


def via_sd_imports(root: Path) -> list[str]:
    found = []
    for module in sorted(root.rglob("*.py")):
        package = ".".join(["viasd_adapters", *module.parent.relative_to(root.parent).parts])
        found += [
            f"{module.relative_to(root.parent)}: {name}"
            for name in imported_modules(module.read_text(), package)
            if name.startswith(VIA_SD)
        ]
    return found


def test_third_party_imports_nothing_of_via_sd():
    assert via_sd_imports(THIRD_PARTY) == []


@pytest.mark.parametrize(
    "line",
    [
        "from ...verify import TieredVerifier",
        "import viasd_adapters.routing.slim",
        "from viasd_adapters.search import dimr",
        "from ... import hosts",
    ],
)
def test_the_check_finds_a_reverse_import(tmp_path, line):
    host = tmp_path / "third_party" / "pearl"
    host.mkdir(parents=True)
    (host / "engine.py").write_text(f"{line}\n")
    assert len(via_sd_imports(tmp_path / "third_party")) >= 1
