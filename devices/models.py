"""Who a device is, who owns it, and which firmware it should run."""
from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _


class Device(models.Model):
    mac = models.CharField(_("MAC address"), max_length=17, unique=True)
    client_id = models.CharField(_("client ID"), max_length=64, blank=True)
    serial_number = models.CharField(_("serial number"), max_length=64, blank=True, db_index=True)
    name = models.CharField(_("name"), max_length=100, blank=True)
    board_type = models.CharField(_("board type"), max_length=100, blank=True, db_index=True)
    board_name = models.CharField(_("board name"), max_length=100, blank=True)
    chip_model = models.CharField(_("chip model"), max_length=50, blank=True)
    firmware_version = models.CharField(_("firmware version"), max_length=50, blank=True)
    flash_size = models.BigIntegerField(_("flash size"), null=True, blank=True)
    minimum_free_heap = models.BigIntegerField(_("minimum free heap"), null=True, blank=True)
    language = models.CharField(_("language"), max_length=20, blank=True)
    user_agent = models.CharField(_("user agent"), max_length=200, blank=True)
    last_ip = models.GenericIPAddressField(_("last IP address"), null=True, blank=True)
    last_checkin_at = models.DateTimeField(_("last check-in"), null=True, blank=True)

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="devices", verbose_name=_("owner"),
    )
    persona = models.ForeignKey(
        "conversations.Persona", null=True, blank=True, on_delete=models.SET_NULL,
        related_name="devices", verbose_name=_("persona"),
    )
    bound_at = models.DateTimeField(_("bound at"), null=True, blank=True)
    location = models.CharField(
        _("location"), max_length=100, blank=True, help_text=_("City, used by weather and location tools.")
    )
    timezone = models.CharField(_("time zone"), max_length=64, blank=True,
                                help_text=_("IANA time zone, e.g. Asia/Shanghai."))

    # Bumping the generation revokes every token issued before (it is part of the HMAC).
    token_generation = models.PositiveIntegerField(_("token generation"), default=0)
    # Set by "revoke tokens": until an operator binds it again with a fresh code, the OTA
    # check answers with an activation code instead of a token.
    revoked_at = models.DateTimeField(
        _("tokens revoked at"), null=True, blank=True,
        help_text=_("While set, the device gets no token and must be activated again with a code."),
    )

    is_online = models.BooleanField(_("online"), default=False, db_index=True)
    online_since = models.DateTimeField(_("online since"), null=True, blank=True)
    last_seen_at = models.DateTimeField(_("last seen"), null=True, blank=True)
    session_id = models.CharField(_("session ID"), max_length=36, blank=True, db_index=True)
    # The channel-layer address of the consumer holding the live socket (commands and the
    # "replaced" event go there); "" when no socket is open.
    channel_name = models.CharField(_("channel name"), max_length=200, blank=True, editable=False)

    mcp_server_info = models.JSONField(_("MCP server info"), default=dict, blank=True)
    mcp_tools = models.JSONField(_("MCP tools"), default=list, blank=True)
    mcp_tools_updated_at = models.DateTimeField(_("tools updated at"), null=True, blank=True)

    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    class Meta:
        ordering = ["-last_seen_at", "mac"]
        verbose_name = _("device")
        verbose_name_plural = _("devices")
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
    def needs_activation(self) -> bool:
        """Unbound, or bound but revoked: the OTA check hands out a code, not a token."""
        return not self.is_bound or self.revoked_at is not None


class DeviceKey(models.Model):
    """Per-device HMAC key (eFuse HMAC_KEY0) for Activation-Version 2, imported by serial."""

    serial_number = models.CharField(_("serial number"), max_length=64, unique=True)
    key_hex = models.CharField(_("key (hex)"), max_length=128)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)

    class Meta:
        verbose_name = _("device key")
        verbose_name_plural = _("device keys")

    def __str__(self) -> str:
        return self.serial_number


class ActivationCode(models.Model):
    device = models.ForeignKey(
        Device, on_delete=models.CASCADE, related_name="activation_codes", verbose_name=_("device")
    )
    code = models.CharField(_("code"), max_length=6, db_index=True)
    challenge = models.CharField(_("challenge"), max_length=64)
    # The Client-Id that asked for the code: binding with it binds the device to this client
    # (trust on first use). Blank on codes issued before the field existed.
    client_id = models.CharField(_("client id"), max_length=64, blank=True)
    created_at = models.DateTimeField(_("created at"), default=timezone.now)
    expires_at = models.DateTimeField(_("expires at"))
    used_at = models.DateTimeField(_("used at"), null=True, blank=True)
    # When the device was told "200 activated" for this challenge; a second answer for the
    # same challenge is a replay.
    activated_at = models.DateTimeField(_("activated at"), null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = _("activation code")
        verbose_name_plural = _("activation codes")

    def __str__(self) -> str:
        return f"{self.code} ({self.device})"


class PairingRequest(models.Model):
    """A bound device checked in with a Client-Id other than the one it was bound with.

    It gets no token; an operator approves (the device is re-paired with the new Client-Id,
    e.g. after a reflash erased its NVS) or rejects (someone who knows the MAC). The
    challenge lets the firmware poll /activate until then.
    """

    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="pairing_requests",
                               verbose_name=_("device"))
    client_id = models.CharField(_("client id"), max_length=64)
    challenge = models.CharField(max_length=64, unique=True)
    address = models.GenericIPAddressField(_("address"), null=True, blank=True)
    board_type = models.CharField(_("board type"), max_length=100, blank=True)
    firmware_version = models.CharField(_("firmware version"), max_length=50, blank=True)
    key_verified = models.BooleanField(
        _("key proof"), default=False,
        help_text=_("The requester proved it holds this device's HMAC key (Activation-Version 2)."),
    )
    created_at = models.DateTimeField(_("requested at"), default=timezone.now)
    last_seen_at = models.DateTimeField(_("last seen at"), default=timezone.now)
    approved_at = models.DateTimeField(_("approved at"), null=True, blank=True)

    class Meta:
        ordering = ["-last_seen_at"]
        verbose_name = _("re-pairing request")
        verbose_name_plural = _("re-pairing requests")
        constraints = [
            models.UniqueConstraint(fields=["device", "client_id"], name="unique_pairing_per_client"),
        ]

    def __str__(self) -> str:
        return f"{self.device} ← {self.client_id}"


def firmware_upload_to(instance: FirmwareRelease, filename: str) -> str:
    return f"firmware/{instance.board_type}/{instance.version}/{filename}"


class FirmwareRelease(models.Model):
    board_type = models.CharField(_("board type"), max_length=100, db_index=True)
    version = models.CharField(
        _("version"), max_length=50,
        help_text=_("Dotted numbers only, e.g. 2.4.3 (the firmware compares them numerically)."),
    )
    binary = models.FileField(_("firmware file"), upload_to=firmware_upload_to)
    size = models.PositiveBigIntegerField(_("size"), default=0, editable=False)
    sha256 = models.CharField(_("SHA-256"), max_length=64, blank=True, editable=False)
    force = models.BooleanField(_("force"), default=False, help_text=_("Devices install it even if not newer."))
    rollout_percent = models.PositiveSmallIntegerField(
        _("rollout percent"), default=100, validators=[MinValueValidator(0), MaxValueValidator(100)],
        help_text=_("Share of devices offered this release; the same device always falls on the same side."),
    )
    allowlist = models.ManyToManyField(
        Device, blank=True, related_name="allowed_releases", verbose_name=_("allowlist"),
        help_text=_("If set, only these devices are offered the release (rollout still applies to none of them)."),
    )
    is_active = models.BooleanField(_("active"), default=True)
    notes = models.TextField(_("notes"), blank=True)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)

    class Meta:
        ordering = ["board_type", "-created_at"]
        verbose_name = _("firmware release")
        verbose_name_plural = _("firmware releases")
        constraints = [
            models.UniqueConstraint(fields=["board_type", "version"], name="unique_board_version"),
        ]

    def __str__(self) -> str:
        return f"{self.board_type} {self.version}"
