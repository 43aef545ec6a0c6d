"""Admin login throttling with django-axes: the two hooks the settings name.

Axes counts failed logins in the database (AccessAttempt) per client address and per
username (AXES_LOCKOUT_PARAMETERS); after XIAOZHI_ADMIN_LOGIN_FAILURES failures either is
locked for XIAOZHI_ADMIN_LOGIN_COOLOFF_SECONDS, even with the right password. This module
gives axes the project's client-address rule (trusted proxies, as every other rate limit) and
shows the lock-out on the admin's own login page instead of axes' bare text response.
"""
from __future__ import annotations

import math
from typing import Any

from django.conf import settings
from django.contrib import admin
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import REDIRECT_FIELD_NAME
from django.forms.utils import ErrorDict, ErrorList
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from devices.addresses import client_address


def client_ip(request: HttpRequest) -> str | None:
    """AXES_CLIENT_IP_CALLABLE: the address every rate limit of the project uses. None when
    there is none (a unix socket, a test's force_login): axes stores NULL (PostgreSQL's inet
    column refuses anything but an address), and all such requests share one count."""
    return client_address(request)


class LockedOutLoginForm(AdminAuthenticationForm):
    """The admin login form as shown during a lock-out: empty, with the lock-out message as
    its only error, so the stock admin/login.html shows it where login errors go."""

    def __init__(self, request: HttpRequest, message: str) -> None:
        super().__init__(request)
        self.message = message

    @property
    def errors(self) -> ErrorDict:  # type: ignore[override]
        return ErrorDict({"__all__": self.non_field_errors()})

    def non_field_errors(self) -> ErrorList:
        return ErrorList([self.message], error_class="nonfield")


def lockout_message() -> str:
    minutes = max(1, math.ceil(settings.XIAOZHI_ADMIN_LOGIN_COOLOFF_SECONDS / 60))
    return ngettext(
        "Too many failed login attempts. Try again in %(minutes)d minute.",
        "Too many failed login attempts. Try again in %(minutes)d minutes.",
        minutes,
    ) % {"minutes": minutes}


def lockout_response(request: HttpRequest, *args: Any) -> HttpResponse:
    """AXES_LOCKOUT_CALLABLE: the login page again, with the lock-out message (HTTP 429)."""
    context = {
        **admin.site.each_context(request),
        "title": _("Log in"),
        "subtitle": None,
        "app_path": request.get_full_path(),
        "username": "",
        "form": LockedOutLoginForm(request, lockout_message()),
        REDIRECT_FIELD_NAME: request.POST.get(REDIRECT_FIELD_NAME) or reverse("admin:index"),
    }
    return render(request, "admin/login.html", context, status=429)
