from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from django.utils.translation import gettext_lazy as _

from xiaozhi_site.health import healthz

# settings.PRODUCT_NAME is the same name in English; here it is a translatable label.
admin.site.site_header = _("Xiaozhi Server")
admin.site.site_title = _("Xiaozhi Server")
admin.site.index_title = _("Fleet administration")

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    # set_language: the admin header's language switch posts here (docs/i18n.md).
    path("i18n/", include("django.conf.urls.i18n")),
    path("admin/", admin.site.urls),
    path("", include("devices.urls")),
    path("", include("conversations.urls")),
]
