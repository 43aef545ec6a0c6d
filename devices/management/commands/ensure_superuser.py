"""Create the first admin from DJANGO_SUPERUSER_* if no such user exists yet."""
from __future__ import annotations

import os

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils.translation import gettext as _


class Command(BaseCommand):
    help = "Create the admin user from DJANGO_SUPERUSER_USERNAME/PASSWORD/EMAIL if missing."

    def handle(self, *args: object, **options: object) -> None:
        username = os.environ.get("DJANGO_SUPERUSER_USERNAME", "").strip()
        password = os.environ.get("DJANGO_SUPERUSER_PASSWORD", "")
        email = os.environ.get("DJANGO_SUPERUSER_EMAIL", "").strip()
        if not username or not password:
            raise CommandError(_("Set DJANGO_SUPERUSER_USERNAME and DJANGO_SUPERUSER_PASSWORD."))
        User = get_user_model()
        if User.objects.filter(username=username).exists():
            self.stdout.write(_("Admin user %(username)r already exists.") % {"username": username})
            return
        User.objects.create_superuser(username=username, email=email, password=password)
        self.stdout.write(_("Created admin user %(username)r.") % {"username": username})
