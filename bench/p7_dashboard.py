"""P7 — operator pages: the dashboard and its data calls with 1,000,000 turns and 5,000 devices.

    .venv/bin/python bench/p7_dashboard.py [--turns 1000000] [--devices 5000] [--days 7] [--loads 20]
        [--database-url postgres://postgres@127.0.0.1:5432/p7_bench] [--keep]

Creates (or empties) a PostgreSQL database, migrates it, fills it with `generate_series`
inserts in the database itself (devices on three boards and three firmware versions, 10 turns
per conversation spread evenly over the last `--days` days, 5 % of conversations from the LLM
Gateway, log-normal stage timings, 2 % errors, 3 % interrupted, 10 % with a tool call), runs
the hourly rollup once (what Celery beat does every five minutes; its duration is printed),
starts the real server (daphne, testing/server.py) on that database and loads every dashboard
page and data call `--loads` times one after another as a signed-in staff user, after two
warm-up loads. Prints a markdown table of p50 / p95 / max per URL, the P7 verdict (p95 ≤ 300 ms
for each) and the machine. The database is dropped at the end unless `--keep`.

A smoke run with small numbers: `--turns 20000 --devices 200 --loads 3`.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))

from common import fmt, header, md_table, percentile, verdict  # noqa: E402  (bench/common.py, beside this script)

TARGET_MS = 300.0
TURNS_PER_CONVERSATION = 10
BOARDS = ("bread-compact-wifi", "esp-box-3", "m5stack-core-s3")
VERSIONS = ("2.3.1", "2.4.2", "2.5.0")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=1_000_000)
    parser.add_argument("--devices", type=int, default=5_000)
    parser.add_argument("--days", type=float, default=7.0, help="turns are spread over this many days up to now")
    parser.add_argument("--loads", type=int, default=20, help="timed loads per URL")
    parser.add_argument("--database-url", default=os.environ.get("P7_DATABASE_URL",
                                                                 "postgres://postgres@127.0.0.1:5432/p7_bench"))
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    return parser.parse_args()


# -- the database -----------------------------------------------------------------------------


def recreate_database(url: str) -> None:
    import psycopg

    name = urlsplit(url).path.lstrip("/")
    admin = url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(url: str) -> None:
    import psycopg

    name = urlsplit(url).path.lstrip("/")
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def setup_django(url: str, data_dir: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ["XIAOZHI_DATA_DIR"] = data_dir
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "xiaozhi_site.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def insert_series(model: Any, expressions: dict[str, str], source: str) -> None:
    """INSERT ... SELECT FROM `source`: the given SQL per column, the model's default for the
    others (so fields added to the model later still get a value)."""
    from django.db import connection

    columns, values, args = [], [], []
    for field in model._meta.concrete_fields:
        if field.primary_key:
            continue
        columns.append(f'"{field.column}"')
        if field.column in expressions:
            values.append(expressions[field.column].replace("%", "%%"))
            continue
        default = field.get_default()
        if default is None and not field.null:
            raise ValueError(f"{model.__name__}.{field.name} needs an expression")
        values.append("%s")
        args.append(field.get_db_prep_save(default, connection))
    sql = (f'INSERT INTO "{model._meta.db_table}" ({", ".join(columns)}) '
           f'SELECT {", ".join(values)} FROM {source.replace("%", "%%")}')
    with connection.cursor() as cursor:
        cursor.execute(sql, args)


NORMAL = "sqrt(-2 * ln(1 - random())) * cos(2 * pi() * random())"  # Box-Muller, one N(0, 1) draw


def fill(turns: int, devices: int, days: float) -> dict[str, Any]:
    from django.contrib.auth import get_user_model
    from django.db import connection

    from conversations.models import Conversation, Persona, Turn
    from devices.models import Device

    personas = [Persona.objects.create(name=f"Bench persona {n}") for n in range(3)]
    persona_ids = "ARRAY[" + ",".join(str(p.pk) for p in personas) + "]"
    boards = "ARRAY[" + ",".join(f"'{b}'" for b in BOARDS) + "]"
    versions = "ARRAY[" + ",".join(f"'{v}'" for v in VERSIONS) + "]"
    started = time.perf_counter()
    insert_series(Device, {
        "mac": "substr(h, 1, 2) || ':' || substr(h, 3, 2) || ':' || substr(h, 5, 2) || ':' || substr(h, 7, 2)"
               " || ':' || substr(h, 9, 2) || ':' || substr(h, 11, 2)",
        "client_id": "md5(i::text)::uuid::text",
        "board_type": f"({boards})[1 + i % 3]",
        "firmware_version": f"({versions})[1 + (i / 3) % 3]",
        "is_online": "random() < 0.05",
        "last_seen_at": "now() - random() * interval '10 days'",
        "online_since": "NULL", "last_checkin_at": "now() - random() * interval '10 days'",
        "created_at": "now() - interval '30 days'", "updated_at": "now()",
        "owner_id": "NULL", "persona_id": "NULL", "bound_at": "NULL",
    }, f"generate_series(1, {devices}) AS g(i), LATERAL (SELECT lpad(to_hex(i + 2199023255552), 12, '0') AS h) AS x")
    first_device = Device.objects.order_by("pk").values_list("pk", flat=True).first()
    conversations = max(1, turns // TURNS_PER_CONVERSATION)
    insert_series(Conversation, {
        "session_id": "'bench-' || i",
        "source": "CASE WHEN i % 20 = 0 THEN 'gateway' ELSE 'device' END",
        "device_id": f"CASE WHEN i % 20 = 0 THEN NULL ELSE {first_device} + (i * 7919) % {devices} END",
        "persona_id": f"CASE WHEN i % 20 = 0 THEN NULL ELSE ({persona_ids})[1 + i % 3] END",
        "client_address": "'127.0.0.1'",
        "started_at": "t", "ended_at": "t + interval '4 minutes'",
    }, f"generate_series(1, {conversations}) AS g(i),"
       f" LATERAL (SELECT now() - (random() + i * 0) * interval '{days} days' - interval '4 minutes' AS t) AS s")
    first_conversation = Conversation.objects.order_by("pk").values_list("pk", flat=True).first()
    # One row of draws per turn; `i * 0` ties the LATERAL to the row so it is drawn per turn.
    draws = (f"LATERAL (SELECT exp(5.0 + i * 0 + 0.5 * {NORMAL}) AS asr, exp(5.7 + 0.5 * {NORMAL}) AS llm,"
             f" exp(4.5 + 0.6 * {NORMAL}) AS tts, 1 + random() * 15 AS frame, random() AS r) AS d")
    source = (f"generate_series(0, {turns} - 1) AS g(i) JOIN conversations_conversation c"
              f" ON c.id = {first_conversation} + i / {TURNS_PER_CONVERSATION}, {draws}")
    insert_series(Turn, {
        "conversation_id": "c.id", "index": f"i % {TURNS_PER_CONVERSATION}",
        "user_text": "'what is the weather like in city ' || i", "reply_text": "'It is sunny and warm today.'",
        "emotion": "'happy'",
        "timings": """CASE WHEN c.source = 'device' THEN jsonb_build_object('speech_end', 0,
            'asr_done', round(asr::numeric, 1), 'llm_first_token', round((asr + llm)::numeric, 1),
            'tts_first_audio', round((asr + llm + tts)::numeric, 1),
            'first_frame_sent', round((asr + llm + tts + frame)::numeric, 1),
            'last_frame_sent', round((asr + llm + tts + frame + 2500)::numeric, 1))
            ELSE jsonb_build_object('llm_ms', round(llm::numeric, 3), 'total_ms', round((llm + 25)::numeric, 3)) END""",
        "providers": """CASE WHEN c.source = 'device' THEN jsonb_build_object('asr', 'faster_whisper', 'llm', 'openai',
            'tts', CASE WHEN r < 0.05 THEN 'edge,espeak' ELSE 'edge' END)
            ELSE jsonb_build_object('llm', 'openai', 'model', 'bench') END""",
        "tool_calls": """CASE WHEN r > 0.9 THEN jsonb_build_array(jsonb_build_object(
            'name', 'self.audio_speaker.set_volume',
            'llm_name', 'self_audio_speaker_set_volume', 'source', 'device', 'arguments', '{}'::jsonb,
            'result', 'true', 'success', r < 0.99, 'duration_ms', 12.5,
            'error', CASE WHEN r < 0.99 THEN '' ELSE 'timeout' END))
            ELSE '[]'::jsonb END""",
        "error": "CASE WHEN r BETWEEN 0.50 AND 0.52 THEN 'llm: Error code: 503 - upstream overloaded' ELSE '' END",
        "interrupted": "r BETWEEN 0.60 AND 0.63",
        "created_at": f"c.started_at + (i % {TURNS_PER_CONVERSATION}) * interval '20 seconds'",
    }, source)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    fill_seconds = time.perf_counter() - started
    user = get_user_model().objects.create_superuser("bench", "bench@example.com", "bench-password")
    device_pk = Turn.objects.filter(conversation__device__isnull=False).values_list(
        "conversation__device_id", flat=True).first()
    return {"user": user, "fill_seconds": fill_seconds, "device_pk": device_pk}


def session_cookie(user: Any) -> str:
    from django.conf import settings
    from django.test import Client

    client = Client()
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


# -- the loads ----------------------------------------------------------------------------------


def load(url: str, cookie: str) -> tuple[float, int, int]:
    request = urllib.request.Request(url, headers={"Cookie": cookie})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=60) as response:
        body = response.read()
        status = response.status
    return (time.perf_counter() - started) * 1000, status, len(body)


def measure(base_url: str, paths: list[str], cookie: str, loads: int) -> list[list[str]]:
    rows: list[list[str]] = []
    for path in paths:
        for _ in range(2):
            load(base_url + path, cookie)  # warm-up: connections, caches, template loading
        timings = []
        size = 0
        for _ in range(loads):
            ms, status, size = load(base_url + path, cookie)
            if status != 200:
                raise RuntimeError(f"{path} answered {status}")
            timings.append(ms)
        p95 = percentile(timings, 0.95)
        rows.append([f"`{path}`", fmt(percentile(timings, 0.5)), fmt(p95), fmt(max(timings)),
                     f"{size / 1024:.0f} KiB", "PASS" if p95 <= TARGET_MS else "FAIL"])
    return rows


def main() -> int:
    args = parse_args()
    from testing.server import AsgiServer

    print(header("P7 — dashboard pages and data calls"))
    with tempfile.TemporaryDirectory(prefix="p7-") as data_dir:
        recreate_database(args.database_url)
        try:
            setup_django(args.database_url, data_dir)
            filled = fill(args.turns, args.devices, args.days)
            from dashboard.selectors import latency_figures
            from dashboard.services import turns_rollup

            started = time.perf_counter()
            hours = turns_rollup(max_hours=100_000)
            rollup_seconds = time.perf_counter() - started
            print(f"Filled {args.turns:,} turns and {args.devices:,} devices over {args.days:g} days in "
                  f"{filled['fill_seconds']:.1f} s; the first rollup ({hours} hours) took {rollup_seconds:.1f} s.\n")
            p95 = {s.key: s.p95 for s in latency_figures("7d").device_stages}["first_frame_sent"] or 0.0
            cookie = session_cookie(filled["user"])
            paths = [
                "/dashboard/", "/dashboard/?range=1h", "/dashboard/?range=7d",
                "/dashboard/figures.json", "/dashboard/figures.json?range=1h", "/dashboard/figures.json?range=7d",
                "/dashboard/now.json",
                "/dashboard/breakdown/?range=7d&by=persona", "/dashboard/breakdown/?range=7d&by=provider",
                f"/dashboard/turns/?range=7d&source=device&stage=first_frame_sent&min_ms={p95:.1f}",
                "/dashboard/turns/?range=7d&failed=any",
                f"/admin/devices/device/{filled['device_pk']}/change/",
            ]
            env = {"DATABASE_URL": args.database_url, "XIAOZHI_DATA_DIR": data_dir}
            with AsgiServer(env=env) as server:
                rows = measure(server.http_url, paths, cookie, args.loads)
        finally:
            if not args.keep:
                from django.db import connections

                connections.close_all()
                drop_database(args.database_url)
    print(md_table(["page or data call", "p50 ms", "p95 ms", "max ms", "size", f"p95 ≤ {TARGET_MS:g} ms"], rows,
                   align="lrrrrl"))
    worst = max(float(row[2]) for row in rows)
    print("\n" + verdict("P7", all(row[-1] == "PASS" for row in rows),
                         f"worst p95 {worst:.1f} ms over {len(rows)} URLs, {args.loads} loads each"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
