"""Fleet admin: devices (bind, revoke), firmware releases and rollouts, codes, device keys.

Admin methods stay tiny: every change goes through devices.services.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from django.contrib import admin, messages
from django.db.models import Count, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.template.defaultfilters import filesizeformat
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from devices.admin_actions import (
    alert_devices,
    call_device_tool,
    device_tools_html,
    reboot_devices,
    say_on_devices,
)
from devices.admin_history import device_history_html
from devices.addresses import client_address
from devices.auth import normalize_mac
from devices.forms import DeviceBindForm, DeviceKeyUploadForm, FirmwareReleaseForm
from devices.models import ActivationCode, Device, DeviceKey, FirmwareRelease, PairingRequest
from devices.pairing import pairing_request_approve, pairing_request_reject
from devices.ratelimit import code_entry_limit, rate_limit_hit
from devices.selectors import activation_codes_outstanding, pairing_requests_pending
from devices.services import (
    BindError,
    device_bind,
    device_keys_import,
    device_keys_parse_csv,
    device_revoke_tokens,
    device_unbind,
    firmware_release_save,
)

if TYPE_CHECKING:
    from django.contrib.admin.filters import _ListFilterChoices
    from django.contrib.admin.views.main import ChangeList
    from django_stubs_ext import StrOrPromise


class BoundFilter(admin.SimpleListFilter):
    title = _("bound")
    parameter_name = "bound"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, StrOrPromise]]:
        return [("yes", _("Bound")), ("no", _("Waiting for activation"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Device]) -> QuerySet[Device]:
        if self.value() in ("yes", "no"):
            return queryset.filter(owner__isnull=self.value() == "no")
        return queryset


class PairingFilter(admin.SimpleListFilter):
    title = _("re-pairing")
    parameter_name = "repairing"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, StrOrPromise]]:
        return [("requested", _("Re-pairing requested"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Device]) -> QuerySet[Device]:
        if self.value() == "requested":
            return queryset.filter(pk__in=pairing_requests_pending().values("device"))
        return queryset


@admin.register(Device)
class DeviceAdmin(admin.ModelAdmin):
    list_display = (
        "mac", "name", "online", "last_seen_at", "board_type", "firmware_version", "owner", "persona", "bound",
    )
    list_filter = ("is_online", BoundFilter, PairingFilter, "board_type", "firmware_version", "owner", "persona")
    search_fields = ("mac", "name", "serial_number", "client_id")
    list_select_related = ("owner", "persona")
    raw_id_fields = ("owner",)
    actions = ("revoke_tokens", "unbind", reboot_devices, alert_devices, say_on_devices, call_device_tool)
    readonly_fields = (
        "client_id", "serial_number", "board_type", "board_name", "chip_model", "firmware_version",
        "flash_size", "minimum_free_heap", "language", "user_agent", "last_ip", "last_checkin_at",
        "bound_at", "token_generation", "revoked_at", "is_online", "online_since", "last_seen_at", "session_id",
        "mcp_server_info", "device_tools", "mcp_tools_updated_at", "created_at", "updated_at",
        "conversation_history",
    )
    fieldsets = (
        (None, {"fields": ("mac", "name", "owner", "persona", "bound_at", "location", "timezone")}),
        (_("Hardware and firmware"), {"fields": (
            "client_id", "serial_number", "board_type", "board_name", "chip_model", "firmware_version",
            "flash_size", "minimum_free_heap", "language", "user_agent", "last_ip", "last_checkin_at",
        )}),
        (_("Presence and tokens"), {"fields": (
            "is_online", "online_since", "last_seen_at", "session_id", "token_generation", "revoked_at",
        )}),
        (_("Conversations"), {"fields": ("conversation_history",)}),
        (_("Device tools (MCP)"), {"classes": ("collapse",), "fields": (
            "mcp_server_info", "device_tools", "mcp_tools_updated_at",
        )}),
        (_("Record"), {"fields": ("created_at", "updated_at")}),
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[Device]:
        return super().get_queryset(request).defer("mcp_tools", "mcp_server_info")

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Device], search_term: str
    ) -> tuple[QuerySet[Device], bool]:
        # Operators paste MACs as printed on labels: AA-BB-CC-DD-EE-FF.
        return super().get_search_results(request, queryset, normalize_mac(search_term) or search_term)

    @admin.display(description=_("Tools the device offers (user-only tools are never shown to the LLM)"))
    def device_tools(self, device: Device) -> str:
        return device_tools_html(device)

    @admin.display(description=_("Conversations and last turn"))
    def conversation_history(self, device: Device) -> str:
        return device_history_html(device)

    @admin.display(description=_("online"), boolean=True, ordering="is_online")
    def online(self, device: Device) -> bool:
        return device.is_online

    @admin.display(description=_("bound"), boolean=True, ordering="owner")
    def bound(self, device: Device) -> bool:
        return device.is_bound

    @admin.action(description=_("Revoke tokens (the device must be activated again with a code)"))
    def revoke_tokens(self, request: HttpRequest, queryset: QuerySet[Device]) -> None:
        for device in queryset:
            device_revoke_tokens(device=device)
        count = len(queryset)
        text = ngettext("Revoked the tokens of %(count)d device.", "Revoked the tokens of %(count)d devices.", count)
        self.message_user(request, text % {"count": count}, messages.SUCCESS)

    @admin.action(description=_("Unbind (the device asks for a new activation code)"))
    def unbind(self, request: HttpRequest, queryset: QuerySet[Device]) -> None:
        for device in queryset:
            device_unbind(device=device)
        count = len(queryset)
        text = ngettext("Unbound %(count)d device.", "Unbound %(count)d devices.", count)
        self.message_user(request, text % {"count": count}, messages.SUCCESS)

    def get_urls(self) -> list[URLPattern]:
        bind = path("bind/", self.admin_site.admin_view(self.bind_view), name="devices_device_bind")
        return [bind, *super().get_urls()]

    def bind_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_change_permission(request):
            return HttpResponse(status=403)
        form = DeviceBindForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            device = self._bind(request, form)
            if device is not None:
                text = gettext("Bound %(device)s to %(owner)s.") % {"device": device, "owner": device.owner}
                self.message_user(request, text, messages.SUCCESS)
                return HttpResponseRedirect(reverse("admin:devices_device_change", args=[device.pk]))
        context = {**self.admin_site.each_context(request), "opts": self.opts, "form": form,
                   "title": _("Bind a device")}
        return TemplateResponse(request, "admin/devices/device/bind.html", context)

    def _bind(self, request: HttpRequest, form: DeviceBindForm) -> Device | None:
        # Counted before the lookup, so a right guess after the limit still fails.
        decision = rate_limit_hit(limit=code_entry_limit(), address=client_address(request) or "unknown")
        if not decision.allowed:
            form.add_error("code", gettext("Too many attempts; try again in %(seconds)s s.") % {
                "seconds": decision.retry_after})
            return None
        try:
            return device_bind(code=form.cleaned_data["code"], owner=form.cleaned_data["owner"],
                               persona=form.cleaned_data["persona"])
        except BindError as exc:
            form.add_error("code", str(exc))
            return None


@admin.register(PairingRequest)
class PairingRequestAdmin(admin.ModelAdmin):
    """Bound devices seen with a new Client-Id. Approve a device you reflashed or reset;
    reject what you do not recognise (someone who knows the MAC)."""

    list_display = ("device", "client_id", "address", "firmware_version", "key_verified", "last_seen_at")
    list_filter = ("key_verified",)
    list_select_related = ("device",)
    search_fields = ("device__mac", "device__name", "client_id")
    readonly_fields = ("device", "client_id", "address", "board_type", "firmware_version", "key_verified",
                       "created_at", "last_seen_at", "approved_at")
    exclude = ("challenge",)
    actions = ("approve", "reject")

    def get_queryset(self, request: HttpRequest) -> QuerySet[PairingRequest]:
        return super().get_queryset(request).filter(approved_at__isnull=True)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # requests come from OTA checks

    @admin.action(description=_("Approve: the device now uses this Client-Id"),
                  permissions=["change"])
    def approve(self, request: HttpRequest, queryset: QuerySet[PairingRequest]) -> None:
        count = 0
        for pairing in queryset.select_related("device"):
            pairing_request_approve(request=pairing)
            count += 1
        self.message_user(request, gettext("Approved %(count)d re-pairing request(s).") % {"count": count},
                          messages.SUCCESS)

    @admin.action(description=_("Reject"), permissions=["change"])
    def reject(self, request: HttpRequest, queryset: QuerySet[PairingRequest]) -> None:
        count = 0
        for pairing in queryset.select_related("device"):
            pairing_request_reject(request=pairing)
            count += 1
        self.message_user(request, gettext("Rejected %(count)d re-pairing request(s).") % {"count": count},
                          messages.SUCCESS)


class CodeStateFilter(admin.SimpleListFilter):
    """Defaults to the codes an operator can still enter."""

    title = _("state")
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, StrOrPromise]]:
        return [("outstanding", _("Outstanding")), ("used", _("Used")), ("expired", _("Expired")), ("all", _("All"))]

    def value(self) -> str:
        return super().value() or "outstanding"

    def choices(self, changelist: ChangeList) -> Iterator[_ListFilterChoices]:
        for lookup, title in self.lookup_choices:
            yield {"selected": self.value() == lookup, "display": title,
                   "query_string": changelist.get_query_string({self.parameter_name: lookup})}

    def queryset(self, request: HttpRequest, queryset: QuerySet[ActivationCode]) -> QuerySet[ActivationCode]:
        now = timezone.now()
        if self.value() == "outstanding":
            return queryset.filter(pk__in=activation_codes_outstanding(now=now).values("pk"))
        if self.value() == "used":
            return queryset.filter(used_at__isnull=False)
        if self.value() == "expired":
            return queryset.filter(used_at__isnull=True, expires_at__lte=now)
        return queryset


@admin.register(ActivationCode)
class ActivationCodeAdmin(admin.ModelAdmin):
    list_display = ("code", "device", "client_id", "created_at", "expires_at", "used_at", "activated_at")
    list_filter = (CodeStateFilter,)
    list_select_related = ("device",)
    search_fields = ("code", "device__mac")
    readonly_fields = ("device", "code", "challenge", "client_id", "created_at", "expires_at", "used_at",
                       "activated_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # codes are issued to devices by the OTA check

    def has_change_permission(self, request: HttpRequest, obj: ActivationCode | None = None) -> bool:
        return False


@admin.register(FirmwareRelease)
class FirmwareReleaseAdmin(admin.ModelAdmin):
    form = FirmwareReleaseForm
    list_display = ("board_type", "version", "size_display", "rollout_percent", "force", "is_active",
                    "allowlisted", "created_at")
    list_editable = ("rollout_percent", "is_active")
    list_filter = ("board_type", "is_active", "force")
    search_fields = ("board_type", "version")
    filter_horizontal = ("allowlist",)
    readonly_fields = ("size", "sha256", "created_at")

    def get_queryset(self, request: HttpRequest) -> QuerySet[FirmwareRelease]:
        return super().get_queryset(request).annotate(allowlist_size=Count("allowlist"))

    @admin.display(description=_("size"), ordering="size")
    def size_display(self, release: FirmwareRelease) -> str:
        return filesizeformat(release.size)

    @admin.display(description=_("allowlist"), ordering="allowlist_size")
    def allowlisted(self, release: FirmwareRelease) -> int:
        return release.allowlist_size  # type: ignore[attr-defined]

    def save_model(self, request: HttpRequest, obj: FirmwareRelease, form: object, change: bool) -> None:
        firmware_release_save(release=obj, binary_changed="binary" in form.changed_data)  # type: ignore[attr-defined]


@admin.register(DeviceKey)
class DeviceKeyAdmin(admin.ModelAdmin):
    list_display = ("serial_number", "fingerprint", "created_at")
    search_fields = ("serial_number",)
    fields = ("serial_number", "fingerprint", "created_at")
    readonly_fields = ("serial_number", "fingerprint", "created_at")

    @admin.display(description=_("key fingerprint"))
    def fingerprint(self, key: DeviceKey) -> str:
        # Never show the key itself: a short hash is enough to compare with the factory list.
        return hashlib.sha256(key.key_hex.lower().encode()).hexdigest()[:12]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # keys come in by CSV upload or `manage.py import_device_keys`

    def get_urls(self) -> list[URLPattern]:
        upload = path("upload/", self.admin_site.admin_view(self.upload_view), name="devices_devicekey_upload")
        return [upload, *super().get_urls()]

    def upload_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request) or not request.user.has_perm("devices.add_devicekey"):
            return HttpResponse(status=403)
        form = DeviceKeyUploadForm(request.POST or None, request.FILES or None)
        if request.method == "POST" and form.is_valid():
            self._import(request, form.cleaned_data["file"])
            return HttpResponseRedirect(reverse("admin:devices_devicekey_changelist"))
        context = {**self.admin_site.each_context(request), "opts": self.opts, "form": form,
                   "title": _("Upload device keys")}
        return TemplateResponse(request, "admin/devices/devicekey/upload.html", context)

    def _import(self, request: HttpRequest, text: str) -> None:
        rows, errors = device_keys_parse_csv(text=text)
        result = device_keys_import(rows=rows)
        text = gettext("Imported keys: %(created)d new, %(updated)d replaced.")
        self.message_user(request, text % {"created": result.created, "updated": result.updated})
        for error in [*errors, *result.errors][:20]:
            self.message_user(request, error, messages.WARNING)
