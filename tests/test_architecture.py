"""The house (docs/architecture.md): every folder sits on one layer and
every import points down the layers, no module imports itself through
others, every module says what it owns, and none is over 600 lines.

Read from the source. Deferred imports (inside a function) count, and so
does a project module named in a string (``import_string``, a job
function, a worker class): an import moved into a function or a string to
dodge a circle is still a circle. The few names a lower module holds on
purpose are listed in ``NAMED_ON_PURPOSE``, each with why.

A package's ``__init__`` that re-exports its modules (``runs.transitions``,
``runs.runtime``, ``runs.reaper``, ``runs.models``) is a facade for the layers above; the
modules inside import each other directly, never through it.
"""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("nrllm_ops", "console", "api", "agents", "runs", "spend", "tools", "ground")
#: The most lines a module may have (docs/architecture.md, "Small modules").
MOST_LINES = 600

#: Top to bottom, each layer a set of parts, each part a folder (a package
#: and the folders inside it that no other part claims). A module may
#: import its own part, or any part of a layer below; never a part beside
#: it or above it. docs/architecture.md draws the same picture.
LAYERS = (
    # The composition root: settings, urls, wsgi, gunicorn, the app config.
    {"root": ("nrllm_ops",)},
    # Adapters: they parse, check permissions and show; they decide nothing.
    {"console": ("console",), "api": ("api",)},
    {
        "commands": (
            "runs.management",
            "agents.management",
            "spend.management",
            "api.management",
        )
    },
    # What deployments name: ``runs.worker``, ``runs.jobs``, ``runs.cron``,
    # the app config (and the migrations, which no module imports).
    {"entry points": ("runs",)},
    {"workers": ("runs.workers",)},
    # Schedules and signed events: they start runs of agents (G23).
    {"triggers": ("triggers",)},
    # The domain.
    {"agents": ("agents",), "operators": ("runs.operators",), "reaper": ("runs.reaper",)},
    {"runtime": ("runs.runtime",)},
    # Told by the runtime and the reaper; posts as the approval webhook does.
    {"run webhooks": ("runs.run_webhooks",)},
    {"approvals": ("runs.approvals",)},
    {"queue": ("runs.queue",)},
    {"providers": ("runs.providers",)},
    {"transitions": ("runs.transitions",)},
    # The run's tables, their words and the queries every layer shares.
    {"run models": ("runs.models",)},
    {"spend": ("spend",)},
    {"tools": ("tools",)},
    # Who belongs to which team, and the one layer that scopes every query (G22).
    {"teams": ("teams",)},
    {"ground": ("ground",)},
)

#: (module, what it names) that point up on purpose.
NAMED_ON_PURPOSE = {
    # The queue names the job function RQ calls, as RQ stores it in Redis,
    # and, without Redis, what the caller runs instead: it wakes the
    # runtime the way a worker does, by name, and never imports it.
    ("runs.queue.dispatch", "runs.jobs"),
    ("runs.queue.dispatch", "runs.runtime"),
    # Django's entry point names its settings module, which names it back
    # (``WSGI_APPLICATION``).
    ("nrllm_ops.wsgi", "nrllm_ops.settings"),
}

_DOTTED = re.compile(r"[a-z_]+(\.[A-Za-z_][A-Za-z0-9_]*)+")


def modules(packages=PACKAGES) -> dict[str, Path]:
    found = {}
    for package in packages:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _docstrings(tree) -> set[int]:
    nodes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, nodes)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def _logger_names(tree) -> set[int]:
    """``logging.getLogger("runs.transitions")`` names a logger, not code."""
    return {
        id(argument)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "attr", getattr(node.func, "id", None)) == "getLogger"
        for argument in node.args
    }


def imports_of(name: str, path: Path, known: dict) -> set[str]:
    """The project modules ``name`` imports or names, wherever it does."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text())
    not_code = _docstrings(tree) | _logger_names(tree)
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if is_package else name.split(".")[:-1]
                here = here[: len(here) - (node.level - 1)]
                base = ".".join([*here, base] if base else here)
            # ``from runs.approvals import actions`` imports the module
            # ``runs.approvals.actions``; ``from runs.models import AgentRun``
            # imports ``runs.models``.
            names += [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in not_code
            and _DOTTED.fullmatch(node.value)
        ):
            # A module, or a name in one (``runs.jobs.execute_run_job``).
            # Not an app's label and a name (``"runs.change_agentrun"``, a
            # permission; ``"agents.AgentVersion"``, a model): Django's
            # registry resolves those, and no code of the app is run.
            head, _, _ = node.value.rpartition(".")
            if node.value in known or "." in head:
                names += [node.value if node.value in known else head]
    return {target for target in names if target in known and target != name}


def import_graph() -> dict[str, set[str]]:
    """Module → the project modules it depends on, less ``NAMED_ON_PURPOSE``."""
    known = modules()
    return {
        name: {
            target
            for target in imports_of(name, path, known)
            if (name, target) not in NAMED_ON_PURPOSE
        }
        for name, path in known.items()
    }


def part_of(module: str) -> tuple[int, str]:
    """The module's layer (0 is the top) and its part: the longest prefix."""
    matches = [
        (len(prefix), depth, part)
        for depth, layer in enumerate(LAYERS)
        for part, prefixes in layer.items()
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    assert matches, f"{module} is in no part of LAYERS: place it"
    _, depth, part = max(matches)
    return depth, part


def test_every_import_points_down_the_layers():
    """Layers of folders, not of modules: each part is a folder, so where a
    module goes is where its folder is."""
    not_folders = [
        prefix
        for layer in LAYERS
        for prefixes in layer.values()
        for prefix in prefixes
        if not (ROOT / prefix.replace(".", "/") / "__init__.py").is_file()
    ]
    assert not not_folders, f"parts of LAYERS that are no folder: {not_folders}"
    wrong = []
    for module, targets in sorted(import_graph().items()):
        depth, part = part_of(module)
        for target in sorted(targets):
            target_depth, target_part = part_of(target)
            if target_part != part and target_depth <= depth:
                where = "beside it" if target_depth == depth else "above it"
                wrong.append(f"{module} ({part}) depends on {target} ({target_part}), {where}")
    assert not wrong, "\n".join(wrong)


def test_what_is_named_on_purpose_is_still_there():
    """An entry of ``NAMED_ON_PURPOSE`` that no longer matches would let a
    new dependency of the same pair through unseen."""
    known = modules()
    for module, target in sorted(NAMED_ON_PURPOSE):
        assert target in imports_of(module, known[module], known), (module, target)


def test_no_module_depends_on_itself_through_others():
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
    assert not circles, "circles: " + "; ".join(" ↔ ".join(c) for c in circles)


def test_every_module_says_what_it_owns():
    silent = [
        name
        for name, path in sorted(modules((*PACKAGES, "bench")).items())
        if "migrations" not in path.parts
        and path.read_text().strip()
        and not ast.get_docstring(ast.parse(path.read_text()))
    ]
    assert not silent, f"modules without a docstring: {silent}"


def test_no_module_is_over_600_lines():
    """The house's size (docs/architecture.md, "Small modules"): a module
    past about 600 lines holds more than one job; split it along a seam."""
    long = [
        f"{path.relative_to(ROOT)} ({lines} lines)"
        for path in sorted(modules((*PACKAGES, "bench", "tests")).values())
        if "migrations" not in path.parts
        and (lines := len(path.read_text().splitlines())) > MOST_LINES
    ]
    assert not long, f"modules over {MOST_LINES} lines: {long}"
