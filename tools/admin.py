"""Tools in the admin: operators switch them on and off; the effect is shown
from the code and cannot be edited (there is no field for it)."""

from django.contrib import admin

from tools.models import Note, OutboxNotification, ToolSetting
from tools.registry import effect_for


@admin.register(ToolSetting)
class ToolSettingAdmin(admin.ModelAdmin):
    list_display = ["name", "effect", "enabled", "updated_at"]
    fields = ["name", "effect", "enabled"]
    readonly_fields = ["name", "effect"]

    @admin.display(description="effect (from code)")
    def effect(self, obj):
        return effect_for(obj.name).value

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


admin.site.register(Note)
admin.site.register(OutboxNotification)
