"""Tools in the admin: operators switch them on and off; the effect is shown
from the code and cannot be edited (there is no field for it)."""

from django.contrib import admin

from tools.models import Note, OutboxNotification, ToolSetting
from tools.registry import effect_for, get_registry


@admin.register(ToolSetting)
class ToolSettingAdmin(admin.ModelAdmin):
    list_display = ["name", "description", "effect", "enabled", "updated_at"]
    list_editable = ["enabled"]
    fields = ["name", "description", "effect", "enabled"]
    readonly_fields = ["name", "description", "effect"]

    @admin.display(description="description")
    def description(self, obj):
        tool = get_registry().get(obj.name)
        return tool.description if tool else "(no longer registered)"

    @admin.display(description="effect (from code)")
    def effect(self, obj):
        return effect_for(obj.name).value

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


admin.site.register(Note)
admin.site.register(OutboxNotification)
