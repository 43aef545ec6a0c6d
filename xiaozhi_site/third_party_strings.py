"""Labels of third-party apps whose own catalogues have no Simplified Chinese (django-axes).

Django looks a msgid up in every catalogue, ours (LOCALE_PATHS) first, so listing the texts
here lets `make messages` keep them in locale/zh_Hans and the admin shows them translated.
Nothing imports this module; it only has to be where makemessages looks.
"""
from __future__ import annotations

from django.utils.translation import gettext_noop

AXES_LABELS = (
    gettext_noop("access attempt"), gettext_noop("access attempts"),
    gettext_noop("access failure"), gettext_noop("access failures"),
    gettext_noop("access log"), gettext_noop("access logs"),
    gettext_noop("User Agent"), gettext_noop("IP Address"), gettext_noop("Username"),
    gettext_noop("HTTP Accept"), gettext_noop("Path"), gettext_noop("Attempt Time"),
    gettext_noop("GET Data"), gettext_noop("POST Data"), gettext_noop("Failed Logins"),
    gettext_noop("Access lock out"), gettext_noop("Logout Time"), gettext_noop("Session key hash (sha256)"),
)
