"""G1: a tool's effect is code, and resolution by name fails closed."""

import pytest
from django.apps import apps
from django.conf import settings as django_settings
from django.db import connection

from tools.effects import ToolEffect
from tools.models import ToolSetting
from tools.registry import ToolRegistryError, build_registry, effect_for, get_registry

P = "tests.tools_for_tests."


@pytest.mark.parametrize(
    ("name", "effect"),
    [
        ("read_note", ToolEffect.READ_ONLY),
        ("search_notes", ToolEffect.READ_ONLY),
        ("http_get", ToolEffect.READ_ONLY),
        ("upsert_note", ToolEffect.IDEMPOTENT_WRITE),
        ("send_notification", ToolEffect.NON_IDEMPOTENT_WRITE),
        ("post_webhook", ToolEffect.NON_IDEMPOTENT_WRITE),
    ],
)
def test_builtin_tools_declare_their_effect(name, effect):
    assert effect_for(name) is effect


def test_effect_values_and_is_write():
    assert [e.value for e in ToolEffect] == [
        "read_only",
        "idempotent_write",
        "non_idempotent_write",
    ]
    assert [e.is_write for e in ToolEffect] == [False, True, True]


def test_a_tool_that_declares_nothing_is_read_only():
    registry = build_registry([P + "NoEffectDeclared"])
    assert registry.effect_for("no_effect_declared") is ToolEffect.READ_ONLY


@pytest.mark.parametrize("name", ["removed_tool", "", "READ_NOTE", "read_note "])
def test_an_unknown_name_resolves_to_non_idempotent_write(name):
    assert effect_for(name) is ToolEffect.NON_IDEMPOTENT_WRITE


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("StringEffect", "effect 'read_only' is not a ToolEffect member"),
        ("DuplicateReadNote", "duplicate tool name 'read_note'"),
        ("Nameless", "has no name"),
        ("SchemaLess", "'schema_less'"),
        ("BrokenSchema", "'broken_schema'"),
        ("NotATool", "not a subclass of tools.contract.Tool"),
        ("DoesNotExist", "cannot import 'tests.tools_for_tests.DoesNotExist'"),
    ],
)
def test_loading_refuses_a_broken_tool_naming_it(path, message):
    with pytest.raises(ToolRegistryError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_registry([P + path])


def test_nrllm_tools_adds_third_party_tools(settings):
    settings.NRLLM_TOOLS = [P + "FenceProbe"]
    assert "fence_probe_write" in get_registry()
    assert effect_for("fence_probe_write") is ToolEffect.IDEMPOTENT_WRITE
    settings.NRLLM_TOOLS = []
    assert "fence_probe_write" not in get_registry()


def test_a_string_effect_in_nrllm_tools_stops_start_up(worker_env):
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        env={**worker_env, "NRLLM_TOOLS": P + "StringEffect"},
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0
    assert "string_effect" in result.stderr and "not a ToolEffect member" in result.stderr


@pytest.mark.django_db
def test_no_column_stores_a_tools_effect():
    # A step's effect is history (what it executed under), as is an
    # approval request's (what the approver was shown); the run's
    # pending_effect is the fence. Nothing else may hold an effect, and
    # none of them is read to decide what a tool does.
    allowed = {
        ("runs_runstep", "effect"),
        ("runs_approvalrequest", "effect"),
        ("runs_agentrun", "pending_effect"),
    }
    with connection.cursor() as cursor:
        for model in apps.get_models():
            if not model._meta.managed:
                continue
            table = model._meta.db_table
            for column in connection.introspection.get_table_description(cursor, table):
                if "effect" in column.name:
                    assert (table, column.name) in allowed, f"{table}.{column.name}"


def test_no_setting_names_an_effect():
    assert not [name for name in dir(django_settings) if "EFFECT" in name.upper()]


@pytest.mark.django_db
def test_the_admin_form_has_no_effect_field_and_a_post_cannot_change_it(admin_client):
    url = "/admin/tools/toolsetting/send_notification/change/"
    page = admin_client.get(url)
    assert page.status_code == 200
    form_fields = page.context["adminform"].form.fields
    assert "effect" not in form_fields
    assert "non_idempotent_write" in page.content.decode()  # shown, read-only

    response = admin_client.post(
        url, {"enabled": "on", "approval": "default", "effect": "read_only"}
    )
    assert response.status_code == 302
    assert effect_for("send_notification") is ToolEffect.NON_IDEMPOTENT_WRITE
    assert ToolSetting.objects.get(name="send_notification").enabled is True
