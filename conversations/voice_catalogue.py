"""Edge read-aloud's voice list, for the admin's voice picker: fetched by a Celery task
(`conversations.tasks.edge_voices_refresh`, daily) and kept twice, in the Django cache (fast,
shared by the processes when it is Redis) and in a JSON file in the data directory (survives
restarts, and offline a stale list is still a list). A failed fetch never replaces a list.

Before the first fetch has succeeded the picker offers each language's default Edge voice
(voices.EDGE_VOICES), and asking for the list queues a fetch.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from django.conf import settings

from conversations.providers.tts.voices import EDGE_VOICES, Voice
from xiaozhi_site.shared_cache import shared_cache

logger = logging.getLogger(__name__)

CACHE_KEY = "conversations:edge-voices:v1"
CACHE_SECONDS = 7 * 24 * 3600  # the file is the long-term copy; the cache only saves reads
FETCH_TIMEOUT = 20.0
MAX_VOICES = 5000  # the service lists ~400; a reply far bigger is not a voice list


def cache_file() -> Path:
    return Path(settings.DATA_DIR) / "edge-voices.json"


async def edge_voices() -> list[Voice]:
    """The cached list (cache, else the file), else the built-in defaults and a fetch queued."""
    stored = shared_cache().get(CACHE_KEY)
    if stored is None:
        stored = await asyncio.to_thread(_read_file)
        if stored is not None:
            shared_cache().set(CACHE_KEY, stored, CACHE_SECONDS)
    if stored is None:
        await asyncio.to_thread(_queue_refresh)
        return [Voice(name, name.rsplit("-", 1)[0], _short_label(name)) for name in EDGE_VOICES.values()]
    return [Voice(**entry) for entry in stored]


def edge_voices_refresh() -> dict[str, Any]:
    """Fetch the list now (blocking: a Celery task). On any failure the stored list stays."""
    try:
        raw = asyncio.run(_fetch())
        entries = parse_edge_voices(raw)
    except Exception as exc:  # network down, DNS, a changed reply format: keep the old list
        kept = _stored_count()
        logger.warning("edge voice list not refreshed, keeping the stored one: %s", type(exc).__name__,
                       extra={"error": f"{type(exc).__name__}: {str(exc)[:200]}", "kept": kept})
        return {"ok": False, "count": kept}
    _write_file(entries)
    shared_cache().set(CACHE_KEY, entries, CACHE_SECONDS)
    return {"ok": True, "count": len(entries)}


async def _fetch() -> list[Any]:
    import edge_tts  # noqa: PLC0415

    async with asyncio.timeout(FETCH_TIMEOUT):
        voices: list[Any] = list(await edge_tts.list_voices())  # checked by parse_edge_voices
        return voices


def parse_edge_voices(raw: Any) -> list[dict[str, Any]]:
    """edge-tts's voice dicts → Voice fields; entries without a usable name are dropped."""
    if not isinstance(raw, list) or not raw or len(raw) > MAX_VOICES:
        raise ValueError(f"not a voice list ({type(raw).__name__}, {len(raw) if isinstance(raw, list) else '-'})")
    entries = []
    for item in raw:
        if not isinstance(item, dict):
            continue
        name, locale = str(item.get("ShortName") or ""), str(item.get("Locale") or "")
        if not name or not locale or len(name) > 100:
            continue
        gender = str(item.get("Gender") or "").lower()
        entries.append({"name": name, "language": locale, "label": _short_label(name),
                        "gender": gender if gender in ("female", "male") else ""})
    if not entries:
        raise ValueError("no usable voice in the list")
    return sorted(entries, key=lambda entry: entry["name"])


def _short_label(name: str) -> str:
    """"zh-CN-XiaoxiaoNeural" -> "Xiaoxiao"."""
    return name.rsplit("-", 1)[-1].removesuffix("Neural") or name


def _read_file() -> list[dict[str, Any]] | None:
    try:
        data = json.loads(cache_file().read_text(encoding="utf-8"))
        return [dict(name=e["name"], language=e["language"], label=e.get("label", ""), gender=e.get("gender", ""))
                for e in data["voices"]]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        logger.warning("edge voice list file unreadable", extra={"error": repr(exc)[:200]})
        return None


def _write_file(entries: list[dict[str, Any]]) -> None:
    """Atomically: a crash mid-write must not leave half a list behind."""
    target = cache_file()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".edge-voices-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump({"voices": entries}, out, ensure_ascii=False)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _stored_count() -> int:
    stored = shared_cache().get(CACHE_KEY) or _read_file() or []
    return len(stored)


def _queue_refresh() -> None:
    from conversations.tasks import edge_voices_refresh as task  # noqa: PLC0415

    try:
        task.delay()
    except Exception as exc:  # no broker reachable: the daily schedule will fetch it
        logger.warning("edge voice list fetch not queued", extra={"error": repr(exc)[:200]})
