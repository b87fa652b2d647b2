"""The admin app, with the project's admin site as ``admin.site``."""

from django.contrib.admin.apps import AdminConfig as DjangoAdminConfig


class AdminConfig(DjangoAdminConfig):
    default_site = "console.site.AdminSite"
