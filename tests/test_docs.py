"""The README and the manual in docs/: every relative link resolves, and the
settings table in docs/operations.md matches what the code reads.

Text only: no database, no network (http(s) links are not fetched).
"""

import ast
import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.helpers import ROOT

DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SETTINGS_TABLE = ROOT / "docs" / "operations.md"
SETTINGS_MODULE = ROOT / "nrllm_ops" / "settings.py"

#: Documented variables that are read outside settings.py, and where.
READ_ELSEWHERE = {
    "NRLLM_ADMIN_PASSWORD": "runs/management/commands/ensure_admin.py",
    "PROMETHEUS_MULTIPROC_DIR": "ground/metrics_files.py",
    "SSL_CERT_FILE": "tools/builtin/http_transport.py",
    "SSL_CERT_DIR": "tools/builtin/http_transport.py",
    # Read and checked by the settings through exporters_from_env; the SDK
    # reads them again itself, and the rest.
    "OTEL_TRACES_EXPORTER": "ground/tracing.py",
    "OTEL_EXPORTER_OTLP_ENDPOINT": "ground/tracing.py",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "ground/tracing.py",
    "OTEL_EXPORTER_OTLP_PROTOCOL": "ground/tracing.py",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "ground/tracing.py",
    "OTEL_EXPORTER_OTLP_HEADERS": "ground/tracing.py",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "ground/tracing.py",
    "OTEL_EXPORTER_OTLP_TIMEOUT": "ground/tracing.py",
    "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "ground/tracing.py",
    "OTEL_EXPORTER_OTLP_COMPRESSION": "ground/tracing.py",
    "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "ground/tracing.py",
    "OTEL_BSP_SCHEDULE_DELAY": "ground/tracing.py",
    "OTEL_BSP_MAX_QUEUE_SIZE": "ground/tracing.py",
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "ground/tracing.py",
    "OTEL_BSP_EXPORT_TIMEOUT": "ground/tracing.py",
    "OTEL_TRACES_SAMPLER": "ground/tracing.py",
    "OTEL_TRACES_SAMPLER_ARG": "ground/tracing.py",
    "OTEL_SDK_DISABLED": "ground/tracing.py",
    "OTEL_PYTHON_DJANGO_EXCLUDED_URLS": "ground/tracing.py",
}
#: The app's code: every variable it reads must be in the settings table.
#: (tests/ and bench/ read variables of their own: NRLLM_TEST_*, NRLLM_BENCH_*.)
APP_PACKAGES = ("nrllm_ops", "ground", "console", "runs", "tools", "api")

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.MULTILINE)
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s[^>]*\b(?:id|name)=\"([^\"]+)\"")
# An environment variable read by name: env_int("X", ...), os.environ.get("X"),
# os.getenv("X"), os.environ["X"].
ENV_READ = re.compile(
    r"(?:\benv_\w+\(|\benviron\.get\(|\bgetenv\(|\benviron\[)\s*[\"']([A-Z][A-Z0-9_]*)[\"']"
)


def outside_code_blocks(text: str) -> str:
    """``text`` with fenced code blocks blanked (their lines kept, empty)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            lines.append("")
        else:
            lines.append("" if fenced else line)
    return "\n".join(lines)


def links(path: Path) -> list[str]:
    """The link targets of a Markdown file, outside code blocks and code spans."""
    prose = CODE_SPAN.sub("", outside_code_blocks(path.read_text()))
    return INLINE_LINK.findall(prose) + REFERENCE_LINK.findall(prose)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text as rendered (code, links and
    emphasis marks gone), lowercased, punctuation but ``-`` and ``_`` dropped,
    spaces made ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor GitHub gives ``path``: one per heading, a repeated one
    suffixed ``-1``, ``-2``…, and any HTML ``id``/``name``."""
    found, seen = set(), {}
    text = outside_code_blocks(path.read_text())
    for line in text.splitlines():
        heading = HEADING.match(line)
        if heading is None:
            continue
        base = slug(heading.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    found.update(HTML_ANCHOR.findall(text))
    return found


def broken_link(source: Path, target: str) -> str | None:
    """Why ``target``, linked from ``source``, does not resolve, or None."""
    if re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
        return None  # http(s), mailto: not fetched
    file_part, _, fragment = target.partition("#")
    linked = (source.parent / unquote(file_part)).resolve() if file_part else source
    if not linked.exists():
        return f"{target}: no file {linked.relative_to(ROOT, walk_up=True)}"
    if fragment:
        if linked.suffix != ".md":
            return f"{target}: an anchor into {linked.name}, which is not Markdown"
        if unquote(fragment) not in anchors(linked):
            return f"{target}: no heading in {linked.relative_to(ROOT)} has the anchor #{fragment}"
    return None


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_relative_link_resolves_to_a_file_and_heading(document):
    broken = [
        why for target in links(document) if (why := broken_link(document, target)) is not None
    ]
    assert not broken, f"{document.relative_to(ROOT)} has broken links:\n" + "\n".join(broken)


#: A test cited as `test_file.py::test_name`; a bare `::test_name` is in the
#: file cited last before it.
CITATION = re.compile(r"`(test_[a-z0-9_]+\.py)?(?:::(test_[a-z0-9_]+))?`")


def names_of_tests_in(file: Path) -> set[str]:
    tree = ast.parse(file.read_text())
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    }


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_cited_test_exists_in_the_file_cited(document):
    """The guarantees name the tests that pin them: a test moved or renamed
    must take its citation along, or the promise reads as pinned by nothing."""
    cited_file, missing = None, []
    for file, name in CITATION.findall(document.read_text()):
        if file:
            cited_file = file
            if not (ROOT / "tests" / file).exists():
                missing.append(f"{file}: no such test file")
                continue
        if name and (
            cited_file is None or name not in names_of_tests_in(ROOT / "tests" / cited_file)
        ):
            missing.append(f"{cited_file}::{name}: no such test")
    assert not missing, f"{document.relative_to(ROOT)} cites:\n" + "\n".join(missing)


def test_the_slug_follows_githubs_rules(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "# G11. Every operator action is audited; history is append-only\n"
        "## `make run`: the demo\n"
        "## django-rq's dashboard\n"
        "## Notes\n"
        "```sh\n# not a heading\n```\n"
        "## Notes\n"
    )
    assert anchors(page) == {
        "g11-every-operator-action-is-audited-history-is-append-only",
        "make-run-the-demo",
        "django-rqs-dashboard",
        "notes",
        "notes-1",
    }


def documented_variables() -> set[str]:
    """The variables named in the first column of docs/operations.md's table
    under "Environment variables"."""
    text = SETTINGS_TABLE.read_text()
    section = text.partition("\n## Environment variables\n")[2].partition("\n## ")[0]
    names = set()
    for row in section.splitlines():
        cells = row.split("|")
        if row.startswith("|") and len(cells) > 2:
            names.update(re.findall(r"`([A-Z][A-Z0-9_]*)`", cells[1]))
    return names


def variables_read_in(path: Path) -> set[str]:
    return set(ENV_READ.findall(path.read_text()))


def test_the_settings_table_is_found():
    # A table this parser no longer recognises must not pass as "nothing to check".
    assert {"DATABASE_URL", "REDIS_URL", "SSL_CERT_DIR"} <= documented_variables()


def test_every_documented_variable_is_read_where_the_table_implies():
    read_by_settings = variables_read_in(SETTINGS_MODULE)
    problems = []
    for name in sorted(documented_variables()):
        if name in READ_ELSEWHERE:
            where = READ_ELSEWHERE[name]
            if name not in variables_read_in(ROOT / where):
                problems.append(f"{name} is documented as read in {where}, which does not read it")
        elif name not in read_by_settings:
            problems.append(
                f"{name} is in the settings table of docs/operations.md but "
                "nrllm_ops/settings.py does not read it"
            )
    assert not problems, "\n".join(problems)


def test_every_variable_settings_reads_is_documented():
    undocumented = variables_read_in(SETTINGS_MODULE) - documented_variables()
    assert not undocumented, (
        f"nrllm_ops/settings.py reads {sorted(undocumented)}, "
        "missing from the settings table of docs/operations.md"
    )


def test_every_variable_the_app_reads_is_documented():
    documented = documented_variables()
    undocumented = [
        f"{name} (read in {path.relative_to(ROOT)})"
        for package in APP_PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for name in sorted(variables_read_in(path) - documented)
    ]
    assert not undocumented, (
        "variables read by the app but missing from the settings table of "
        "docs/operations.md: " + ", ".join(undocumented)
    )


def documented_defaults() -> dict[str, str]:
    """Variable → its default as the settings table writes it, where the
    cell is one code span (``900``, ``true``); words (unset, empty) are left
    out."""
    text = SETTINGS_TABLE.read_text()
    section = text.partition("\n## Environment variables\n")[2].partition("\n## ")[0]
    defaults = {}
    for row in section.splitlines():
        cells = [cell.strip() for cell in row.split("|")]
        if row.startswith("|") and len(cells) > 3:
            names = re.findall(r"`([A-Z][A-Z0-9_]*)`", cells[1])
            value = re.fullmatch(r"`([^`]*)`", cells[2])
            if len(names) == 1 and value:
                defaults[names[0]] = value.group(1)
    return defaults


def defaults_in_settings() -> dict[str, str]:
    """Variable → the literal default ``env_*("NAME", default)`` gives it in
    settings.py, written as the table writes it."""
    found = {}
    for node in ast.walk(ast.parse(SETTINGS_MODULE.read_text())):
        if not (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", "").startswith("env_")
            and len(node.args) >= 2
            and isinstance(node.args[0], ast.Constant)
        ):
            continue
        try:
            default = ast.literal_eval(node.args[1])
        except ValueError:
            continue  # computed: nothing literal to compare
        if isinstance(default, bool):
            default = "true" if default else "false"
        elif isinstance(default, list):
            default = ",".join(default)
        found[node.args[0].value] = str(default)
    return found


def test_every_documented_default_is_the_one_settings_gives():
    documented, actual = documented_defaults(), defaults_in_settings()
    assert len(documented) > 20, "the table's defaults were not found"
    wrong = [
        f"{name}: the table says {documented[name]!r}, settings.py gives {actual[name]!r}"
        for name in sorted(documented.keys() & actual.keys())
        if documented[name] != actual[name]
    ]
    assert not wrong, "\n".join(wrong)
