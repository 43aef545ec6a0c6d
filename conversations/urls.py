"""HTTP routes of the conversations side: the camera's vision endpoint (protocol-reference §5.6).

The view lives in devices/vision.py (it authenticates devices); the URL is here because the
MCP `initialize` built by the voice session is what hands it to the device.
"""
from __future__ import annotations

from django.urls import path

from devices.vision import vision_explain

urlpatterns = [
    path("mcp/vision/explain", vision_explain, name="vision-explain"),
    path("mcp/vision/explain/", vision_explain),
]
