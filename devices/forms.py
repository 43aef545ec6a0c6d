"""Admin forms: firmware upload, binding by code, device-key CSV upload.

Forms validate input only; the admin views call services to act on it.
"""
from __future__ import annotations

from typing import Any

from django import forms
from django.apps import apps
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import UploadedFile
from django.core.validators import RegexValidator
from django.db.models import Model, QuerySet
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from devices.models import FirmwareRelease
from devices.versions import APP_IMAGE_HEAD_BYTES, app_image_version, is_numeric_version

MAX_KEY_CSV_BYTES = 2 * 1024 * 1024


def validate_numeric_version(value: str) -> None:
    """The firmware compares versions with std::stoi per segment: only plain numbers are safe."""
    if not is_numeric_version(value):
        raise ValidationError(gettext("Use dotted numbers only, e.g. 2.4.3 (each part at most 2147483647)."))


def _image_head(upload: UploadedFile) -> bytes:
    upload.seek(0)
    head = upload.read(APP_IMAGE_HEAD_BYTES)
    upload.seek(0)
    return head


class FirmwareReleaseForm(forms.ModelForm):
    class Meta:
        model = FirmwareRelease
        fields = ["board_type", "version", "binary", "force", "rollout_percent", "allowlist", "is_active", "notes"]

    def clean_version(self) -> str:
        version = self.cleaned_data["version"].strip()
        validate_numeric_version(version)
        return version

    def clean_binary(self) -> object:
        binary = self.cleaned_data["binary"]
        if "binary" not in self.changed_data:
            return binary
        if not binary or binary.size == 0:
            raise ValidationError(gettext("The firmware file is empty."))
        self.image_version = app_image_version(_image_head(binary))
        if self.image_version is None:
            raise ValidationError(
                gettext("This is not an ESP32 application image (xiaozhi.bin, not merged-binary.bin).")
            )
        return binary

    def clean(self) -> dict[str, Any]:
        super().clean()
        cleaned = self.cleaned_data
        image_version = getattr(self, "image_version", None)
        version = cleaned.get("version")
        # A device skips an image whose embedded version equals its own, so a mislabelled
        # release would be downloaded again at every boot.
        if image_version is not None and version and image_version != version:
            self.add_error("version", gettext("The image says it is version %(version)s; the release must match.") % {
                "version": image_version})
        return cleaned


def _persona_queryset() -> QuerySet[Model]:
    # conversations.Persona by name: devices never imports conversations (one-way imports).
    return apps.get_model("conversations", "Persona").objects.order_by("name")


class DeviceBindForm(forms.Form):
    code = forms.CharField(
        max_length=6, min_length=6, label=_("Activation code"),
        validators=[RegexValidator(r"^[0-9]{6}$", _("The code is 6 digits."))],
        help_text=_("The 6 digits the device shows and speaks."),
    )
    owner = forms.ModelChoiceField(
        label=_("Owner"), queryset=get_user_model().objects.filter(is_active=True).order_by("username")
    )
    persona: forms.ModelChoiceField[Model] = forms.ModelChoiceField(
        label=_("Persona"), queryset=None, required=False, empty_label=_("Default persona"))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["persona"].queryset = _persona_queryset()  # type: ignore[attr-defined]

    def clean_code(self) -> str:
        return self.cleaned_data["code"].strip()


class DeviceKeyUploadForm(forms.Form):
    file = forms.FileField(label=_("File"),
                           help_text=_("CSV with the columns serial_number,key_hex (header line optional)."))

    def clean_file(self) -> str:
        upload = self.cleaned_data["file"]
        if upload.size > MAX_KEY_CSV_BYTES:
            raise ValidationError(gettext("The file is larger than 2 MB."))
        try:
            return upload.read().decode("utf-8-sig")
        except UnicodeDecodeError:
            raise ValidationError(gettext("The file is not UTF-8 text.")) from None
