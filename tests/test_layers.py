"""The package's layers hold: each folder imports only the layers above it (the order in
`specnb/__init__.py`), the core never reaches the notebook runtime, no private name crosses a module,
`import specnb` with the core loads no plotting or notebook machinery, and the runner no model classes."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "specnb"
ORDER = (
    "kernels",
    "core",
    "io",
    "drafters",
    "analysis",
    "training",
    "bench",
    "experiments",
    "notebook",
)  # each may import the ones before it


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.parent != PACKAGE)


def imported(path: Path) -> list[tuple[str, list[str]]]:
    """(absolute module, names) for every `from ... import ...` of specnb in the file, any depth."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts  # ("specnb", layer, module)
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = parts[: len(parts) - node.level]
                module = ".".join(base + ((node.module,) if node.module else ()))
            else:
                module = node.module or ""
            if module.startswith("specnb"):
                out.append((module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names if a.name.startswith("specnb")]
    return out


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_follow_the_layers(path):
    mine = path.parent.name
    allowed = set(ORDER[: ORDER.index(mine) + 1])
    for module, names in imported(path):
        layer = layer_of(module)
        if layer in ORDER:
            assert layer in allowed, f"{path.name} ({mine}) imports {module}: {layer} is not above {mine}"
        else:  # `from .. import x` (the package itself): only sub-modules of a permitted layer
            assert all(n.split(".")[0] in allowed for n in names), f"{path.name} imports {names} from {module}"


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_private_name_crosses_modules(path):
    for module, names in imported(path):
        private = [n for n in names if n.startswith("_")]
        assert not private, f"{path.name} imports private {private} from {module}"


def test_the_core_loads_no_notebook_runtime():
    code = (
        "import sys, specnb, specnb.core.generation, specnb.drafters.methods, specnb.analysis.replay\n"
        "bad = sorted(m for m in sys.modules "
        "if m.startswith(('specnb.notebook', 'matplotlib', 'seaborn', 'papermill')))\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", f"importing the core pulled in: {out.stdout.strip()}"


def test_the_runner_loads_no_model_classes():
    """The runner checks parameters and profiles before any notebook runs; transformers' model classes
    (modeling_utils: seconds of import) load in the notebooks' kernels, with the models."""
    code = "import sys, specnb.notebook.runner\nprint('transformers.modeling_utils' in sys.modules)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False", "importing the runner imported transformers.modeling_utils"


def test_the_report_and_figure_check_load_no_torch():
    """Their commands read runs from disk (`places.default_outputs`): neither needs torch, which would
    cost seconds of import for a report."""
    code = "import sys, specnb.notebook.report, specnb.notebook.legibility\nprint('torch' in sys.modules)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False", "importing the report or the figure check imported torch"


def test_top_level_names_resolve():
    import specnb

    for name in specnb.LAZY:
        assert callable(getattr(specnb, name))
    assert not hasattr(specnb, "MODULES"), "modules are imported by their folder, not by an alias"
    with pytest.raises(AttributeError):
        specnb.replay  # noqa: B018


def test_every_folder_is_a_layer():
    folders = {p.parent.name for p in modules()}
    assert folders == set(ORDER), f"folders {sorted(folders)} against layers {ORDER}"


FACTORIES = {
    "tensor",
    "zeros",
    "ones",
    "full",
    "arange",
    "empty",
    "rand",
    "randn",
    "randint",
    "as_tensor",
    "eye",
    "linspace",
}


def host_by_design(lines: list[str], span: tuple[int, int]) -> bool:
    """A `# host` comment on the lines of the statement that makes the tensor: made on the CPU on
    purpose (the comment says why)."""
    return any("# host" in line for line in lines[span[0] - 1 : span[1]])


def statement_spans(tree: ast.AST) -> dict[int, tuple[int, int]]:
    """id(call) -> the line span of the innermost simple statement that holds it."""
    spans = {}
    for stmt in ast.walk(tree):
        if isinstance(stmt, ast.stmt) and not hasattr(stmt, "body"):
            for node in ast.walk(stmt):
                spans[id(node)] = (stmt.lineno, stmt.end_lineno)
    return spans


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_tensor_factory_names_its_device(path):
    """A tensor made without a device lands on the CPU; next to CUDA tensors that is a crash (or a
    silent copy per call). Every torch factory call names its device, is moved at once (`.to(...)`),
    or is marked `# host` (built on the CPU by design, e.g. a mask that `forward` moves)."""
    source = path.read_text()
    lines = source.splitlines()
    tree = ast.parse(source)
    spans = statement_spans(tree)
    moved = {
        id(n.func.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "to"
    }
    bare = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in FACTORIES
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "torch"
            and not any(k.arg == "device" for k in node.keywords)
            and id(node) not in moved
            and not host_by_design(lines, spans.get(id(node), (node.lineno, node.end_lineno)))
        ):
            bare.append(f"{path.name}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    assert not bare, "tensor factories without a device:\n" + "\n".join(bare)
