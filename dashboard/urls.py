from __future__ import annotations

from django.urls import path

from dashboard import views

app_name = "dashboard"

urlpatterns = [
    path("", views.index, name="index"),
    path("now.json", views.now_json, name="now"),
    path("figures.json", views.figures_data, name="figures"),
    path("breakdown/", views.breakdown_page, name="breakdown"),
    path("turns/", views.turns, name="turns"),
    path("devices/<int:pk>/live.json", views.device_live, name="device-live"),
]
