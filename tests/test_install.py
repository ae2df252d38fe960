"""The built wheel, installed outside the checkout, runs its console scripts from any directory.

The wheel is built from a copy of the package's files (nothing is written into the source tree)
and installed with `pip install --no-deps --target`; the commands run with that folder first on
PYTHONPATH (dependencies come from the running interpreter's environment) and a working
directory outside the repository.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml

import viasd_adapters

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
SCRIPTS = PYPROJECT["project"]["scripts"]
SOURCE_TREES = ("viasd_adapters", "conf", "third_party")  # what the wheel is built from
EXTRAS = PYPROJECT["project"]["optional-dependencies"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, src / name)
    for tree in SOURCE_TREES:
        shutil.copytree(REPO / tree, src / tree, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    if _setuptools_version() >= (77,):  # PEP 639 metadata: build with what is installed, offline and fast
        build = [sys.executable, "-c", "import setuptools.build_meta as b; b.build_wheel('../dist')"]
    else:  # e.g. a fresh Python 3.11 venv's setuptools 65: pip fetches pyproject's build requirements
        build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", "../dist", "."]
    subprocess.run(build, cwd=src, check=True, capture_output=True)
    (wheel,) = (tmp / "dist").glob("*.whl")
    site = tmp / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
    )
    work = tmp / "elsewhere"  # a working directory with nothing of the repository in it
    work.mkdir()
    return {"wheel": wheel, "site": site, "work": work, "user": tmp / "user-conf"}


def _setuptools_version() -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in importlib.metadata.version("setuptools").split(".")[:2])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return (0,)


def run_installed(installed, *argv: str, script: str | None = None, hidden: Path | None = None) -> str:
    """Run the installed command (or python with `argv`); `hidden`: a folder searched first."""
    path = os.pathsep.join(str(p) for p in (hidden, installed["site"]) if p)
    env = {
        **os.environ,
        "PYTHONPATH": path,
        "VIASD_CONFIG_DIR": str(installed["user"]),
        "VIASD_CACHE": str(installed["work"] / "cache"),
    }
    command = [str(installed["site"] / "bin" / script), *argv] if script else [sys.executable, *argv]
    done = subprocess.run(command, cwd=installed["work"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout


def tree_digest(folder: Path) -> str:
    files = sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return hashlib.sha256(b"".join(str(p.relative_to(folder)).encode() + p.read_bytes() for p in files)).hexdigest()


def test_the_wheel_holds_only_the_package_its_data_and_license(installed):
    names = zipfile.ZipFile(installed["wheel"]).namelist()
    assert {n.split("/")[0] for n in names} == {
        "viasd_adapters",
        f"viasd_adapters-{viasd_adapters.__version__}.dist-info",
    }
    for data in (
        "conf/bench.yaml",
        "conf/task/spec_bench.yaml",
        "conf/search/calibration/default.yaml",
        "conf/routing/tiny-random-1l.yaml",
        "prompts/default.jsonl",
        "third_party/pearl/engine.py",
        "third_party/eagle/README.md",
        "third_party/eagle/heads/smollm2-135m-instruct/head.safetensors",
    ):
        assert f"viasd_adapters/{data}" in names, data
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    metadata = (
        zipfile.ZipFile(installed["wheel"])
        .read(f"viasd_adapters-{viasd_adapters.__version__}.dist-info/METADATA")
        .decode()
    )
    assert f"Version: {viasd_adapters.__version__}\n" in metadata and "License-Expression: Apache-2.0" in metadata
    assert sorted(p.name for p in (installed["site"] / "bin").iterdir()) == sorted(SCRIPTS)


def _package_folders() -> dict[str, Path]:
    """Every folder of the source trees that holds Python code, by the import name it ships under."""
    mapping = {
        "viasd_adapters": REPO / "viasd_adapters",
        **{name: REPO / folder for name, folder in PYPROJECT["tool"]["setuptools"]["package-dir"].items()},
    }
    folders = {}
    for name, root in mapping.items():
        for module in root.rglob("*.py"):
            if "__pycache__" not in module.parts:
                folders[".".join([name, *module.parent.relative_to(root).parts])] = module.parent
    return folders


def test_pyproject_lists_every_package_of_the_source_trees():
    assert sorted(PYPROJECT["tool"]["setuptools"]["packages"]) == sorted(_package_folders())


def test_an_editable_install_reads_conf_and_third_party_from_the_checkout():
    """`make setup` installs the checkout editable: edits to conf/ and third_party/ apply as they are saved."""
    # With the package imported from this checkout, only the editable install's mapping can find these two.
    assert Path(viasd_adapters.__file__).parent == REPO / "viasd_adapters", "run the tests in a `make setup` checkout"
    from viasd_adapters.configs import CONFIG_DIR
    from viasd_adapters.third_party import pearl

    assert Path(CONFIG_DIR) == REPO / "conf"
    assert Path(pearl.__file__).parent == REPO / "third_party" / "pearl"


# Slow-marked for the 15-min default run: the search's install into the user config directory and
# every command's search path stay covered there (tests/search/test_cli.py,
# test_every_command_searches_the_user_config_dir below).
@pytest.mark.slow
def test_search_then_generate_with_its_mask_from_another_directory(installed):
    package = installed["site"] / "viasd_adapters"
    before = tree_digest(package)
    out = run_installed(
        installed,
        "model_pair=tiny-random",
        "runtime.weights=float32",
        "search=quick",
        "search.config.num_random=2",
        "search.config.num_tpe=1",
        "calibration.max_new_tokens=8",
        "progress=false",
        "mask_name=tiny-found",
        script="viasd-search",
    )
    assert "use it: routing=tiny-found" in out
    mask_file = installed["user"] / "routing" / "tiny-found.yaml"
    assert mask_file.is_file()
    assert (installed["work"] / "outputs" / "search" / "tiny-random" / "quick-2" / "mask.yaml").is_file()
    assert tree_digest(package) == before  # nothing written into the installed package
    mask = yaml.safe_load(mask_file.read_text())
    # Calibrated on the shipped prompts by default: the last prompt of each of their 7 categories.
    assert mask["provenance"]["calibration"]["prompts"] == [f"spec_bench/{8 * c}" for c in range(1, 8)]

    # The user config directory is on every command's search path: routing=<mask_name> selects it
    # (Hydra stops with "Could not find 'routing/tiny-found'" otherwise).
    out = run_installed(
        installed,
        "model_pair=tiny-random",
        "framework=sd",
        "verifier=tiered",
        "routing=tiny-found",
        "max_new_tokens=6",
        "prompt=Hello",
        script="viasd-generate",
    )
    assert "new tokens 6" in out and "slim" in out  # the slim verifier ran


def _distribution(requirement: str) -> str:
    """The normalised distribution name of a requirement string ("PyYAML>=6" -> "pyyaml")."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", requirement).group()).lower()


def _imported_modules() -> dict[str, set[str]]:
    """Top-level third-party module -> the source files that import it (absolute imports only)."""
    modules: dict[str, set[str]] = {}
    for tree in SOURCE_TREES:
        for path in (REPO / tree).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top != "viasd_adapters":
                        modules.setdefault(top, set()).add(str(path.relative_to(REPO)))
    return modules


def _installed_without_deps() -> set[str]:
    """What `make setup` installs with --no-deps (their own pins are unusable): declared there instead."""
    line = re.search(r"install --no-deps (.+)", (REPO / "Makefile").read_text()).group(1)
    return {_distribution(spec) for spec in line.split()}


# Imports of extras `make setup` leaves out (too slow to build), by the distribution that provides them.
NOT_SET_UP = {"llama_cpp": "llama-cpp-python"}


def test_every_imported_distribution_is_declared():
    """The wheel test installs with --no-deps, so this is what catches an undeclared dependency."""
    declared = {_distribution(r) for r in PYPROJECT["project"]["dependencies"]}
    declared |= {_distribution(r) for extra in EXTRAS.values() for r in extra}
    declared |= _installed_without_deps()
    owners = importlib.metadata.packages_distributions()
    for module, distribution in NOT_SET_UP.items():
        owners.setdefault(module, [distribution])
    undeclared = [
        f"{module} ({', '.join(owners.get(module, ['not installed']))}), imported by {sorted(files)[:3]}"
        for module, files in sorted(_imported_modules().items())
        if not {_distribution(d) for d in owners.get(module, [])} & declared
    ]
    assert not undeclared, "declared nowhere in pyproject.toml (dependencies or an extra):\n" + "\n".join(undeclared)


def test_every_command_loads_without_the_extras(installed, tmp_path):
    """Only the core dependencies are imported when a command loads: an extra's modules (plots,
    task metrics, eagle-llm) are imported where they are used."""
    optional = {_distribution(r) for extra in EXTRAS.values() for r in extra} | _installed_without_deps()
    owners = importlib.metadata.packages_distributions()
    for module, distribution in NOT_SET_UP.items():
        owners.setdefault(module, [distribution])
    hidden = [m for m in _imported_modules() if {_distribution(d) for d in owners.get(m, [])} <= optional]
    assert {"matplotlib", "eagle"} <= set(hidden)
    for module in hidden:  # a package that raises as a missing one does when imported
        (tmp_path / module).mkdir()
        (tmp_path / module / "__init__.py").write_text(
            f"raise ModuleNotFoundError('{module} is hidden', name='{module}')\n"
        )
    program = (
        "from importlib.metadata import distribution\n"
        "for ep in distribution('viasd-adapters').entry_points:\n"
        "    ep.load()\n"
        "    print('@@', ep.name)\n"
    )
    out = run_installed(installed, "-c", program, hidden=tmp_path)
    assert sorted(re.findall(r"@@ (\S+)", out)) == sorted(SCRIPTS)


def test_every_console_script_describes_itself(installed):
    """`--help` prints the command's own description, not Hydra's default text; one process for all six."""
    program = (
        "import contextlib, io, sys\n"
        "from importlib.metadata import distribution\n"
        "import viasd_adapters, viasd_adapters.configs\n"
        "print('@@version', viasd_adapters.__version__, viasd_adapters.configs.CONFIG_DIR)\n"
        "for ep in distribution('viasd-adapters').entry_points:\n"
        "    sys.argv = [ep.name, '--help']\n"
        "    buf = io.StringIO()\n"
        "    with contextlib.redirect_stdout(buf), contextlib.suppress(SystemExit):\n"
        "        ep.load()()\n"
        "    print('@@', ep.name, sys.modules[ep.module].__file__)\n"
        "    print(buf.getvalue())\n"
    )
    out = run_installed(installed, "-c", program)
    version, config_dir = re.search(r"@@version (\S+) (\S+)", out).groups()
    assert version == viasd_adapters.__version__ and Path(config_dir) == installed["site"] / "viasd_adapters" / "conf"
    sections = dict(re.findall(r"@@ (\S+) (\S+)\n", out))
    assert sorted(sections) == sorted(SCRIPTS)
    for name, part in zip(re.findall(r"@@ (\S+) \S+\n", out), re.split(r"@@ \S+ \S+\n", out)[1:]):
        assert Path(sections[name]).is_relative_to(installed["site"]), (name, sections[name])
        assert part.startswith(f"{name}: "), (name, part[:200])  # its own first line
        assert "Usage:" in part and "== Config groups" in part and "powered by Hydra" not in part, name
        assert "$VIASD_CONFIG_DIR, else ~/.config/viasd-adapters/conf" in part, name


@pytest.mark.parametrize("command", sorted(name.removeprefix("viasd-").replace("-", "_") for name in SCRIPTS))
def test_every_command_searches_the_user_config_dir(command, tmp_path, monkeypatch):
    """One search path for all: a routing file in the user config directory is an option of every command."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from viasd_adapters.configs import CONFIG_DIR, user_config_dir
    from viasd_adapters.routing import RoutingMask

    monkeypatch.setenv("VIASD_CONFIG_DIR", str(tmp_path / "mine"))
    assert user_config_dir() == tmp_path / "mine"
    RoutingMask(skip_layers=(0, 3), num_layers=4).to_yaml(tmp_path / "mine" / "routing" / "my-mask.yaml")
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(command, overrides=["model_pair=tiny-random", "routing=my-mask"])
    assert cfg.user_config_dir == str(tmp_path / "mine")
    assert instantiate(cfg.routing).skip_layers == (0, 3)
