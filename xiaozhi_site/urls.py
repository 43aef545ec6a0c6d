from __future__ import annotations

from django.conf import settings
from django.contrib import admin
from django.urls import include, path

from xiaozhi_site.health import healthz

admin.site.site_header = settings.PRODUCT_NAME
admin.site.site_title = settings.PRODUCT_NAME
admin.site.index_title = "Fleet administration"

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("admin/", admin.site.urls),
    path("", include("devices.urls")),
    path("", include("conversations.urls")),
]
