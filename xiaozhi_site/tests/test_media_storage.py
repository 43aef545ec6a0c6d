"""Where recorded audio (and firmware) is stored is a settings change: a storage backend and
its options from the environment, checked at start-up."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parents[2]
PRINT_STORAGE = ("import django; django.setup(); from django.conf import settings; import json; "
                 "print(json.dumps(settings.STORAGES['default']))")


def run_settings(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PRINT_STORAGE], cwd=BASE_DIR, capture_output=True, text=True, timeout=60,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "xiaozhi_site.settings", "XIAOZHI_DATA_DIR": str(tmp_path),
             **env},
        check=False,
    )


def test_the_default_storage_is_the_filesystem_under_the_data_dir(tmp_path: Path) -> None:
    result = run_settings(tmp_path)
    assert json.loads(result.stdout) == {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {}}


def test_another_backend_and_its_options_come_from_the_environment(tmp_path: Path) -> None:
    options = {"bucket_name": "xiaozhi", "endpoint_url": "https://minio.example.com", "default_acl": "private"}
    result = run_settings(tmp_path, XIAOZHI_MEDIA_STORAGE="storages.backends.s3.S3Storage",
                          XIAOZHI_MEDIA_STORAGE_OPTIONS=json.dumps(options))
    assert json.loads(result.stdout) == {"BACKEND": "storages.backends.s3.S3Storage", "OPTIONS": options}


def test_storage_options_that_are_not_a_json_object_stop_the_start(tmp_path: Path) -> None:
    for bad in ("[1, 2]", "{not json", '"bucket"'):
        result = run_settings(tmp_path, XIAOZHI_MEDIA_STORAGE_OPTIONS=bad)
        assert result.returncode != 0
        assert "XIAOZHI_MEDIA_STORAGE_OPTIONS must be a JSON object" in result.stderr
