from django.apps import AppConfig
from django.db.models.signals import post_migrate


def _sync_tool_settings(**kwargs) -> None:
    """Give every registered tool a settings row, so operators see each one."""
    from tools.models import ToolSetting
    from tools.registry import get_registry

    existing = set(ToolSetting.objects.values_list("name", flat=True))
    ToolSetting.objects.bulk_create(
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
