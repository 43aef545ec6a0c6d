from __future__ import annotations

from django.conf import settings
from django.contrib import admin
from django.urls import include, path, reverse_lazy
from django.views.generic import RedirectView

from xiaozhi_site.health import healthz

admin.site.site_header = settings.PRODUCT_NAME
admin.site.site_title = settings.PRODUCT_NAME
admin.site.index_title = "Fleet administration"
admin.site.site_url = reverse_lazy("dashboard:index")  # "View site" opens the fleet dashboard

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("admin/", admin.site.urls),
    path("dashboard/", include("dashboard.urls")),
    path("", RedirectView.as_view(pattern_name="dashboard:index"), name="home"),
    path("", include("devices.urls")),
    path("", include("conversations.urls")),
]
