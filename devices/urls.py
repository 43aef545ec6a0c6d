"""Device-facing HTTP routes.

The firmware posts activation to `<ota_url>activate`, adding a "/" when the configured OTA
URL lacks one, so both spellings of each path are served (protocol-reference §11.13).
"""
from __future__ import annotations

from django.urls import path

from devices import views

app_name = "devices"

urlpatterns = [
    path("xiaozhi/ota/", views.ota, name="ota"),
    path("xiaozhi/ota", views.ota),
    path("xiaozhi/ota/activate", views.activate, name="activate"),
    path("xiaozhi/ota/activate/", views.activate),
    path("xiaozhi/ota/firmware/<int:pk>/<str:filename>", views.firmware_download, name="firmware-download"),
]
