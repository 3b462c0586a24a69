"""What service.py, relay.py and consumer.py share: chaos's environment
(docs/contract.md, sections 2 and 8) turned into a SQLAlchemy engine and the
library's outbox table.

The library wants `create_async_engine("postgresql+asyncpg://...")` and a
table from `make_outbox_table(metadata, table_name="outbox")`. asyncpg reads
neither PGAPPNAME nor libpq's `options`: application_name (so the harness
sees our sessions in pg_stat_activity) and search_path (the run's schema)
are set as server settings of every connection.
"""
import logging
import os
import sys

from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import create_async_engine

from faststream_outbox import make_outbox_table

SCHEMA = os.environ.get("CHAOS_SCHEMA", "public")
INSTANCE = os.environ.get("CHAOS_INSTANCE", "local")
QUEUE = "orders_outbox"          # the outbox queue the service writes and the relay reads

metadata = MetaData()
outbox_table = make_outbox_table(metadata, table_name="outbox")


def engine():
    url = os.environ["CHAOS_DATABASE_URL"]
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            url = "postgresql+asyncpg://" + url[len(prefix):]
    settings = {"search_path": SCHEMA}
    if os.environ.get("PGAPPNAME"):
        settings["application_name"] = os.environ["PGAPPNAME"]
    return create_async_engine(
        url,
        pool_size=5,
        pool_pre_ping=True,      # a connection the proxy cut is replaced, not handed out
        connect_args={"server_settings": settings, "timeout": 5},
    )


def logger(name):
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format=f"%(asctime)s {INSTANCE} %(name)s %(levelname)s %(message)s")
    return logging.getLogger(name)
