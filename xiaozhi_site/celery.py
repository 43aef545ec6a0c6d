"""The Celery application. Tasks live in each app's tasks.py."""
from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "xiaozhi_site.settings")

app = Celery("xiaozhi_site")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
