"""The package's layers and its import rules (docs/architecture.md, "Layers").

Every ``import`` of an ``mrcnic`` module, at the top of a module or inside a function, is
checked against :data:`MAY_IMPORT`; a block of ``tx/`` or ``rx/`` imports another block of its
layer only in the half that assembles them. The check reads the sources (no import runs), so
a violation fails here whether or not a test exercises the line.
"""

import ast

import pytest

from testkit import ROOT

PACKAGE = ROOT / "hdl" / "mrcnic"
BOARDS = ROOT / "boards"                 # installed as mrcnic.boards

# The layers, bottom to top, and what each may import. Gateware (base, tx, rx, nic, boards)
# never imports the flow, the network simulator, the models or the tests; the models import
# only the base.
MAY_IMPORT = {
    "base":   {"base"},
    "model":  {"base", "model"},
    "tx":     {"base", "tx"},
    "rx":     {"base", "rx"},
    "nic":    {"base", "tx", "rx"},
    "host":   {"base", "model", "tx", "rx", "nic", "host"},
    "boards": {"base", "tx", "rx", "nic", "host", "boards"},
    "flow":   {"base", "model", "tx", "rx", "nic", "host", "boards", "flow"},
    "netsim": {"base", "model", "tx", "rx", "nic", "host", "flow", "netsim"},
    "cli":    {"base", "model", "tx", "rx", "nic", "host", "boards", "flow", "netsim"},
}
# The halves: the one module of tx/ (rx/) that may import the other blocks of its layer.
HALVES = {"tx": "mrcnic.tx.mrc_tx", "rx": "mrcnic.rx.mrc_rx"}
# Never imported by the package, whatever the layer.
TEST_PACKAGES = ("testkit", "sim", "cocotb_tests")


def package_sources():
    """``{module name: source}`` of every module of the package, the board tops included."""
    sources = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        sources[name.removesuffix(".__init__")] = path.read_text()
    for path in BOARDS.glob("*.py"):
        sources[f"mrcnic.boards.{path.stem}".removesuffix(".__init__")] = path.read_text()
    return sources


def layer_of(module):
    """The layer of an ``mrcnic`` module: its first name under the package (``mrcnic.nic``
    and ``mrcnic.cli`` are layers of one module each)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def imported(module, source):
    """The absolute names of the modules (or module attributes) ``source`` imports."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[:-node.level]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            # ``from mrcnic.tx import path_selector`` imports the module mrcnic.tx.path_selector
            for alias in node.names:
                yield node.lineno, f"{target}.{alias.name}" if target in (
                    "mrcnic", *(f"mrcnic.{layer}" for layer in MAY_IMPORT)) else target


def violations(sources):
    """Every import of ``sources`` that breaks a rule, as ``module:line imports target
    (why)`` strings."""
    found = []
    for module, source in sorted(sources.items()):
        layer = layer_of(module)
        for line, target in imported(module, source):
            where = f"{module}:{line} imports {target}"
            if target.split(".")[0] in TEST_PACKAGES:
                found.append(f"{where} (the package never imports the tests)")
                continue
            if not target.startswith("mrcnic.") or target == "mrcnic":
                continue
            if layer is None or layer not in MAY_IMPORT:
                found.append(f"{where} (module outside every layer)")
                continue
            other = layer_of(target)
            if other not in MAY_IMPORT[layer]:
                found.append(f"{where} ({layer} may import only {sorted(MAY_IMPORT[layer])})")
            elif (layer == other and layer in HALVES and module != HALVES[layer]
                  and len(target.split(".")) > 2
                  and target.split(".")[:3] != module.split(".")[:3]):
                found.append(f"{where} (a block imports another block only through "
                             f"{HALVES[layer]})")
    return found


def test_every_module_is_in_a_layer():
    sources = package_sources()
    assert {layer_of(m) for m in sources} - {None} == set(MAY_IMPORT)
    assert not [m for m in sources if layer_of(m) is None and m != "mrcnic"]


def test_the_package_keeps_its_import_rules():
    assert violations(package_sources()) == []


@pytest.mark.parametrize("module, line, why", [
    ("mrcnic.rx.ack_generator", "from mrcnic.rx.roce_rx import RoceRx", "only through"),
    ("mrcnic.tx.roce_tx", "from mrcnic.tx import segmenter", "only through"),
    ("mrcnic.tx.path_selector", "from mrcnic.model.ev import expand", "may import only"),
    ("mrcnic.base.stream", "from mrcnic.flow import registry", "may import only"),
    ("mrcnic.model.tx.path_selector", "import mrcnic.tx.path_selector", "may import only"),
    ("mrcnic.boards.selftest", "from mrcnic.netsim.fabric import Fabric", "may import only"),
    ("mrcnic.nic", "from testkit.streams import MetaSink", "never imports the tests"),
    ("mrcnic.rx.psn_tracker", "def f():\n    from mrcnic.nic import MrcNic", "may import only"),
])
def test_a_deliberate_violation_is_found(module, line, why):
    """Each rule, broken once on top of the real package: the check names it."""
    sources = package_sources()
    sources[module] = sources.get(module, "") + "\n" + line + "\n"
    found = violations(sources)
    assert len(found) == 1 and module in found[0] and why in found[0], found


def test_the_halves_may_assemble_their_blocks():
    """The rule that bans tx -> tx imports leaves the transmit half free to do so."""
    sources = package_sources()
    assert any(target.startswith("mrcnic.tx.") for _, target in
               imported("mrcnic.tx.mrc_tx", sources["mrcnic.tx.mrc_tx"]))


def test_a_block_split_into_files_imports_them():
    """A block that is a package (its stages one file each) imports its own files, and still
    not another block's."""
    sources = package_sources()
    assert any(target.startswith("mrcnic.tx.retransmit_tracker.") for _, target in imported(
        "mrcnic.tx.retransmit_tracker.ack", sources["mrcnic.tx.retransmit_tracker.ack"]))
    sources["mrcnic.tx.retransmit_tracker.ack"] += "\nfrom mrcnic.tx.segmenter import X\n"
    found = violations(sources)
    assert len(found) == 1 and "only through" in found[0], found


# The block that decides a whole request in one deep cycle, until it is rebuilt as stage
# components (its speed issue).
LONG_MODULES = {"mrcnic.tx.path_selector"}
MAX_LINES = 800


def test_no_module_is_over_800_lines():
    long = {m: len(s.splitlines()) for m, s in package_sources().items()
            if m not in LONG_MODULES and len(s.splitlines()) > MAX_LINES}
    assert long == {}, f"split these by concern: {long}"


def test_every_package_is_installed():
    """pyproject.toml lists the packages one by one (mrcnic.boards lives outside hdl/): a
    new folder must be listed, or `pip install .` would leave it out."""
    import tomllib
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    found = {".".join(p.parent.relative_to(PACKAGE.parent).parts)
             for p in PACKAGE.rglob("__init__.py")} | {"mrcnic.boards"}
    assert listed == found
