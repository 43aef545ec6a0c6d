"""django-axes under a name people can read, in their language (its own AppConfig calls the
app "Axes" and ships no Chinese)."""
from __future__ import annotations

from axes.apps import AppConfig as AxesAppConfig
from django.utils.translation import gettext_lazy as _


class LoginProtectionConfig(AxesAppConfig):
    verbose_name = _("Login protection")
