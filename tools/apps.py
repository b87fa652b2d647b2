"""The tools app: after migrate, every registered tool has its settings row."""

from django.apps import AppConfig
from django.apps import apps as global_apps
from django.db import DEFAULT_DB_ALIAS
from django.db.models.signals import post_migrate


def _sync_tool_settings(using=DEFAULT_DB_ALIAS, apps=global_apps, **kwargs) -> None:
    """Give every registered tool a settings row, so operators see each one."""
    from tools.registry import get_registry

    try:
        # The migrated state, not the current model: `migrate <other app>` on
        # a fresh database runs this before the tools table exists.
        ToolSetting = apps.get_model("tools", "ToolSetting")
    except LookupError:
        return
    settings = ToolSetting.objects.using(using)
    existing = set(settings.values_list("name", flat=True))
    settings.bulk_create(
        [ToolSetting(name=name) for name in get_registry().names() if name not in existing]
    )


class ToolsConfig(AppConfig):
    name = "tools"
    verbose_name = "Tools"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from tools.registry import get_registry

        # Load the registry now, so a broken tool in NRLLM_TOOLS stops
        # start-up with a message naming it instead of failing a run later.
        get_registry()
        post_migrate.connect(_sync_tool_settings, sender=self)
