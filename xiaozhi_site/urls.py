from __future__ import annotations

from django.contrib import admin
from django.urls import include, path, reverse_lazy
from django.utils.translation import gettext_lazy as _
from django.views.generic import RedirectView

from conversations import tryout
from xiaozhi_site.health import healthz

# settings.PRODUCT_NAME is the same name in English; here it is a translatable label.
admin.site.site_header = _("Xiaozhi Server")
admin.site.site_title = _("Xiaozhi Server")
admin.site.index_title = _("Fleet administration")
# "View site" opens the fleet dashboard; a lazy URL (django-stubs declares str), resolved per page.
admin.site.site_url = reverse_lazy("dashboard:index")  # type: ignore[assignment]

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    # set_language: the admin header's language switch posts here (docs/i18n.md).
    path("i18n/", include("django.conf.urls.i18n")),
    *tryout.urlpatterns,  # admin/conversations/persona/<id>/try/: before the admin's catch-all
    path("admin/", admin.site.urls),
    path("dashboard/", include("dashboard.urls")),
    path("", RedirectView.as_view(pattern_name="dashboard:index"), name="home"),
    path("", include("devices.urls")),
    path("", include("conversations.urls")),
]
