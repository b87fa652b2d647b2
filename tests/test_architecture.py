"""The house (docs/architecture.md): every import points down the layers, no
module imports itself through others, and every module says what it owns.

Read from the source, deferred imports (inside a function) included: an
import moved into a function to dodge a circle is still a circle.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("runs", "tools", "api", "nrllm_ops")

#: Top to bottom. A module may import its own part, or a part below it.
LAYERS = (
    (
        "adapters",
        (
            "api",
            "runs.admin",
            "runs.management",
            "runs.jobs",
            "runs.cron",
            "runs.worker",
            "runs.embedded_worker",
            "nrllm_ops.urls",
            "nrllm_ops.observability",
            "nrllm_ops.admin_site",
            "nrllm_ops.queue_dashboard",
            "nrllm_ops.wsgi",
            "nrllm_ops.asgi",
        ),
    ),
    ("reaper", ("runs.reaper",)),
    ("operators", ("runs.operators",)),
    ("runtime", ("runs.runtime",)),
    ("approvals", ("runs.approvals",)),
    ("queue", ("runs.dispatch",)),
    ("providers", ("runs.providers",)),
    ("transitions", ("runs.transitions",)),
    (
        "the record",
        (
            "runs.models",
            "runs.vocabulary",
            "runs.failures",
            "runs.selectors",
            "runs.metrics",
            "runs.faults",
            "runs.action_result",
            "runs.apps",
            "runs.migrations",
            "runs",
        ),
    ),
    ("tools", ("tools",)),
    (
        "the project's ground",
        (
            "nrllm_ops.settings",
            "nrllm_ops.commits",
            "nrllm_ops.durability",
            "nrllm_ops.metrics_files",
            "nrllm_ops",
        ),
    ),
)


def modules(packages=PACKAGES) -> dict[str, Path]:
    found = {}
    for package in packages:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, known: dict) -> set[str]:
    """The project modules ``name`` imports, wherever the import stands."""
    is_package = path.name == "__init__.py"
    targets = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if is_package else name.split(".")[:-1]
                here = here[: len(here) - (node.level - 1)]
                base = ".".join([*here, base] if base else here)
            # ``from runs.approvals import actions`` imports the module.
            candidates = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for candidate in candidates:
            while candidate and candidate not in known:
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name:
                targets.add(candidate)
                break
    return targets


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def layer_of(module: str) -> tuple[int, str]:
    best = None
    for rank, (layer, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > len(best[2]):
                    best = (rank, layer, prefix)
    assert best is not None, f"{module} is in no layer of LAYERS: place it"
    return best[0], best[1]


def test_every_import_points_down_the_layers():
    wrong = []
    for module, targets in sorted(import_graph().items()):
        rank, layer = layer_of(module)
        for target in sorted(targets):
            target_rank, target_layer = layer_of(target)
            if target_rank < rank:
                wrong.append(f"{module} ({layer}) imports {target} ({target_layer}), a layer above")
    assert not wrong, "\n".join(wrong)


def test_no_module_imports_itself_through_others():
    graph = import_graph()
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(module):  # Tarjan's strongly connected components
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in graph.get(module, ()):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    assert not circles, "import circles: " + "; ".join(" ↔ ".join(c) for c in circles)


def test_every_module_says_what_it_owns():
    silent = [
        name
        for name, path in sorted(modules((*PACKAGES, "bench")).items())
        if "migrations" not in path.parts
        and path.read_text().strip()
        and not ast.get_docstring(ast.parse(path.read_text()))
    ]
    assert not silent, f"modules without a docstring: {silent}"
