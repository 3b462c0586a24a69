#!/usr/bin/env python3
"""The orders system's migrations, as a command: applies schema.sql in the
run's schema (CHAOS_SCHEMA) of CHAOS_DATABASE_URL and exits 0. Declared with
`setup_command = ["python3", "migrate.py"]` in place of `setup = "schema.sql"`,
the way a team with its own migration tool would declare it."""
import os
import pathlib
import sys

import psycopg

schema = os.environ["CHAOS_SCHEMA"]
sql = pathlib.Path(__file__).with_name("schema.sql").read_text()
try:
    with psycopg.connect(os.environ["CHAOS_DATABASE_URL"], options=f"-c search_path={schema}") as conn:
        conn.execute(sql)
except psycopg.Error as e:
    print(f"migrate.py: {e}", file=sys.stderr)
    sys.exit(1)
