"""Who a device is, who owns it, and which firmware it should run."""
from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone


class Device(models.Model):
    mac = models.CharField("MAC address", max_length=17, unique=True)
    client_id = models.CharField(max_length=64, blank=True)
    serial_number = models.CharField(max_length=64, blank=True, db_index=True)
    name = models.CharField(max_length=100, blank=True)
    board_type = models.CharField(max_length=100, blank=True, db_index=True)
    board_name = models.CharField(max_length=100, blank=True)
    chip_model = models.CharField(max_length=50, blank=True)
    firmware_version = models.CharField(max_length=50, blank=True)
    flash_size = models.BigIntegerField(null=True, blank=True)
    minimum_free_heap = models.BigIntegerField(null=True, blank=True)
    language = models.CharField(max_length=20, blank=True)
    user_agent = models.CharField(max_length=200, blank=True)
    last_ip = models.GenericIPAddressField(null=True, blank=True)
    last_checkin_at = models.DateTimeField(null=True, blank=True)

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="devices",
    )
    persona = models.ForeignKey(
        "conversations.Persona", null=True, blank=True, on_delete=models.SET_NULL,
        related_name="devices",
    )
    bound_at = models.DateTimeField(null=True, blank=True)
    location = models.CharField(max_length=100, blank=True, help_text="City, used by weather and location tools.")
    timezone = models.CharField(max_length=64, blank=True, help_text="IANA time zone, e.g. Asia/Shanghai.")

    # Bumping the generation revokes every token issued before (it is part of the HMAC).
    token_generation = models.PositiveIntegerField(default=0)

    is_online = models.BooleanField(default=False, db_index=True)
    online_since = models.DateTimeField(null=True, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    session_id = models.CharField(max_length=36, blank=True)

    mcp_server_info = models.JSONField(default=dict, blank=True)
    mcp_tools = models.JSONField(default=list, blank=True)
    mcp_tools_updated_at = models.DateTimeField(null=True, blank=True)

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-last_seen_at", "mac"]
        # The dashboard's fleet figures: devices gone quiet, firmware versions per board.
        indexes = [
            models.Index(fields=["last_seen_at"], name="device_last_seen"),
            models.Index(fields=["board_type", "firmware_version"], name="device_board_firmware"),
        ]

    def __str__(self) -> str:
        return self.name or self.mac

    @property
    def is_bound(self) -> bool:
        return self.owner_id is not None

    @property
    def group_name(self) -> str:
        """Channel-layer group of the process holding this device's socket."""
        return device_group_name(self.pk)


def device_group_name(device_pk: int) -> str:
    return f"device.{device_pk}"


class DeviceKey(models.Model):
    """Per-device HMAC key (eFuse HMAC_KEY0) for Activation-Version 2, imported by serial."""

    serial_number = models.CharField(max_length=64, unique=True)
    key_hex = models.CharField(max_length=128)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.serial_number


class ActivationCode(models.Model):
    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="activation_codes")
    code = models.CharField(max_length=6, db_index=True)
    challenge = models.CharField(max_length=64)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    # When the device was told "200 activated" for this challenge; a second answer for the
    # same challenge is a replay.
    activated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.code} ({self.device})"

    @property
    def is_usable(self) -> bool:
        return self.used_at is None and self.expires_at > timezone.now()


def firmware_upload_to(instance: FirmwareRelease, filename: str) -> str:
    return f"firmware/{instance.board_type}/{instance.version}/{filename}"


class FirmwareRelease(models.Model):
    board_type = models.CharField(max_length=100, db_index=True)
    version = models.CharField(
        max_length=50, help_text="Dotted numbers only, e.g. 2.4.3 (the firmware compares them numerically)."
    )
    binary = models.FileField(upload_to=firmware_upload_to)
    size = models.PositiveBigIntegerField(default=0, editable=False)
    sha256 = models.CharField(max_length=64, blank=True, editable=False)
    force = models.BooleanField(default=False, help_text="Devices install it even if not newer.")
    rollout_percent = models.PositiveSmallIntegerField(
        default=100, validators=[MinValueValidator(0), MaxValueValidator(100)],
        help_text="Share of devices offered this release; the same device always falls on the same side.",
    )
    allowlist = models.ManyToManyField(
        Device, blank=True, related_name="allowed_releases",
        help_text="If set, only these devices are offered the release (rollout still applies to none of them).",
    )
    is_active = models.BooleanField(default=True)
    notes = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["board_type", "-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["board_type", "version"], name="unique_board_version"),
        ]

    def __str__(self) -> str:
        return f"{self.board_type} {self.version}"
