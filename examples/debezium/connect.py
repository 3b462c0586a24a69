#!/usr/bin/env python3
"""Debezium as the relay under test: one Kafka Connect worker, in
distributed mode, running Debezium's PostgreSQL connector with its outbox
event router, started the way the contract starts any relay
(docs/contract.md): from the environment chaos gives it.

What one incarnation does:
  1. starts a Connect worker (a JVM, a child in this process's group, so
     chaos's SIGKILL and SIGSTOP reach it) whose group and internal topics
     are the run's own;
  2. registers the connector once (a restarted worker finds it in the run's
     config topic and resumes from the run's offsets topic);
  3. waits until the REST API shows the connector's task RUNNING;
  4. only then opens a database session named PGAPPNAME: that session is
     what chaos waits for before it sends any traffic or strikes this
     process (the JDBC driver ignores PGAPPNAME, so the worker's own
     sessions cannot say it);
  5. waits for the worker, and on SIGTERM stops it.

    python3 connect.py [--mode at-least-once|exactly-once] [--key COLUMN]
                       [--table TABLE]

--mode exactly-once: the worker's exactly.once.source.support=enabled and
  the connector's exactly.once.support=required (Kafka's KIP-618).
--key COLUMN: the outbox column the router takes as the message key
  (default aggregateid). Any other column is a misconfiguration: a
  payment's events no longer share a key, nor a partition.

Names, all derived from CHAOS_RUN_ID so that chaos (and `chaos clean`) can
find and remove them: the replication slot and the publication are named
like the run's schema (chaos_<run id>), the worker's group and topics
chaos.<run id>.connect*.

Exit codes: 0 stopped by SIGTERM; 3 Kafka Connect's jars missing or
PostgreSQL without wal_level=logical (one line on stderr naming the fix);
1 the worker or the connector failed (its error quoted); otherwise the
worker's own exit status.
"""
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import psycopg

# How long the worker may take to answer on its REST port, and then to show
# its task RUNNING. A JVM on a busy two-core machine took 6 to 20 s.
REST_TIMEOUT_S = 120
RUNNING_TIMEOUT_S = 120
STOP_GRACE_S = 8


def fail(code, message):
    print(f"connect.py: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def args():
    mode, key, table = "at-least-once", "aggregateid", "outbox"
    rest = sys.argv[1:]
    while rest:
        flag = rest.pop(0)
        if flag in ("--mode", "--key", "--table") and rest:
            value = rest.pop(0)
            if flag == "--mode":
                if value not in ("at-least-once", "exactly-once"):
                    fail(2, f"--mode {value!r}: expected at-least-once or exactly-once")
                mode = value
            elif flag == "--key":
                key = value
            else:
                table = value
        else:
            fail(2, f"unknown argument {flag!r}; usage: connect.py [--mode at-least-once|exactly-once] [--key COLUMN] [--table TABLE]")
    return mode, key, table


def connect_lib():
    lib = os.environ.get("CHAOS_CONNECT_LIB") or os.path.join(
        os.environ.get("CHAOS_CACHE_DIR") or os.path.expanduser("~/.cache/chaos"), "connect", "lib")
    if not os.path.isfile(os.path.join(lib, ".complete")):
        fail(3, f"Kafka Connect's and Debezium's jars are not in {lib}: run scripts/services.sh up connect")
    return lib


def names():
    run = re.sub(r"[^a-z0-9_]", "_", os.environ["CHAOS_RUN_ID"].lower())
    return {
        "slot": f"chaos_{run}"[:63],
        "connector": f"chaos-outbox-{os.environ['CHAOS_RUN_ID']}",
        # chaos.<run id>.…: the run's own names, which `chaos clean` removes.
        "group": f"chaos.{os.environ['CHAOS_RUN_ID']}.connect",
    }


def database():
    url = urllib.parse.urlparse(os.environ["CHAOS_DATABASE_URL"])
    return {
        "database.hostname": url.hostname or "127.0.0.1",
        "database.port": str(url.port or 5432),
        "database.user": urllib.parse.unquote(url.username or ""),
        "database.password": urllib.parse.unquote(url.password or ""),
        "database.dbname": url.path.lstrip("/"),
    }


def check_wal_level():
    # Not under PGAPPNAME: a session so named is this incarnation's word
    # that it is ready, and the worker has not even started yet.
    name = f"{os.environ.get('PGAPPNAME', 'connect')}-check"
    try:
        with psycopg.connect(os.environ["CHAOS_DATABASE_URL"], connect_timeout=10, application_name=name) as conn:
            level = conn.execute("SHOW wal_level").fetchone()[0]
    except psycopg.Error as e:
        fail(1, f"PostgreSQL is not reachable: {e}".splitlines()[0])
    if level != "logical":
        fail(3, f"PostgreSQL runs with wal_level={level}; Debezium needs wal_level=logical: run scripts/services.sh up postgres")


def free_port():
    # Below the kernel's ephemeral range: a port the kernel picked and we
    # released can go to any outgoing connection (the worker's own, to
    # Kafka) before the worker binds its REST listener to it.
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_from = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_from = 32768
    for _ in range(200):
        port = random.randrange(10000, max(ephemeral_from, 11000))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_properties(mode, port, group):
    props = {
        "bootstrap.servers": os.environ["CHAOS_BROKERS"],
        "group.id": group,
        "config.storage.topic": f"{group}-configs",
        "offset.storage.topic": f"{group}-offsets",
        "status.storage.topic": f"{group}-status",
        # The worker's own clients name themselves by the run too.
        "client.id": group,
        "config.storage.replication.factor": "1",
        "offset.storage.replication.factor": "1",
        "status.storage.replication.factor": "1",
        "offset.storage.partitions": "1",
        "status.storage.partitions": "1",
        "key.converter": "org.apache.kafka.connect.storage.StringConverter",
        "value.converter": "org.apache.kafka.connect.storage.StringConverter",
        "listeners": f"http://127.0.0.1:{port}",
        "rest.advertised.host.name": "127.0.0.1",
        "rest.advertised.port": str(port),
        # A killed worker's task moves to its replacement at once, not after
        # the default five minutes of scheduled rebalance delay, and its
        # group membership lapses after 6 s, not 45.
        "scheduled.rebalance.max.delay.ms": "0",
        "session.timeout.ms": "6000",
        "heartbeat.interval.ms": "1000",
        # Offsets (and with them the slot's confirmed position) every
        # second, not every minute: a kill replays at most about a second
        # of events. Users who keep the default replay up to a minute.
        "offset.flush.interval.ms": "1000",
        "task.shutdown.graceful.timeout.ms": "5000",
    }
    if mode == "exactly-once":
        props["exactly.once.source.support"] = "enabled"
    return props


def connector_config(mode, key, table, n):
    schema = os.environ["CHAOS_SCHEMA"]
    config = {
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "tasks.max": "1",
        "plugin.name": "pgoutput",
        **database(),
        "topic.prefix": n["slot"],
        "slot.name": n["slot"],
        "publication.name": n["slot"],
        "publication.autocreate.mode": "filtered",
        "schema.include.list": schema,
        "table.include.list": f"{schema}.{table}",
        # The connector is ready before the first order: nothing to snapshot.
        "snapshot.mode": "no_data",
        "transforms": "outbox",
        "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
        # Every event to the run's topic, whatever its aggregatetype.
        "transforms.outbox.route.topic.replacement": os.environ["CHAOS_TOPIC"],
        "transforms.outbox.table.field.event.key": key,
        # The contract's headers: event_id (the stable id an inbox keys on)
        # and event_type.
        "transforms.outbox.table.fields.additional.placement": "id:header:event_id,type:header:event_type",
    }
    if mode == "exactly-once":
        config["exactly.once.support"] = "required"
    return config


def rest(port, method, path, body=None):
    """(status, parsed JSON or text); status 0 when nothing answers."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                 headers={"Content-Type": "application/json", "Accept": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, raw.decode(errors="replace")
    except (urllib.error.URLError, OSError, ValueError):
        return 0, None


def wait_for(worker, what, timeout_s, probe):
    """Polls probe() until it returns a value; fails naming `what` if the
    worker dies or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if worker.poll() is not None:
            fail(1, f"the Connect worker exited with status {worker.returncode} before {what}")
        got = probe()
        if got is not None:
            return got
        time.sleep(0.25)
    fail(1, f"the Connect worker did not reach {what} within {timeout_s} s")


def register(worker, port, name, config):
    def probe():
        status, body = rest(port, "GET", f"/connectors/{name}")
        if status == 200:
            return "found"
        if status == 404:
            status, body = rest(port, "PUT", f"/connectors/{name}/config", config)
            if status in (200, 201):
                return "registered"
            if status == 400:
                fail(1, f"Kafka Connect refused the connector: {json.dumps(body)}")
        return None  # 409 while the worker joins its group, or no answer yet
    return wait_for(worker, "a registered connector", REST_TIMEOUT_S, probe)


def running(worker, port, name):
    # The status topic still holds the last incarnation's word: only a task
    # this worker runs counts.
    me = f"127.0.0.1:{port}"

    def probe():
        status, body = rest(port, "GET", f"/connectors/{name}/status")
        if status != 200 or not isinstance(body, dict):
            return None
        for task in body.get("tasks", []):
            if task.get("state") == "FAILED":
                trace = (task.get("trace") or "").strip().splitlines()
                fail(1, f"the connector's task failed: {' | '.join(trace[:3])}")
            if task.get("state") == "RUNNING" and task.get("worker_id") == me:
                return task
        return None
    return wait_for(worker, "its task RUNNING", RUNNING_TIMEOUT_S, probe)


def watch_task(port, name):
    """Says once, on stderr, when the task fails after it ran. Connect does
    not restart a failed task, so the relay publishes nothing more and the
    run ends with a `stalled relay`; this line in the relay's log says why."""
    while True:
        time.sleep(2)
        status, body = rest(port, "GET", f"/connectors/{name}/status")
        if status != 200 or not isinstance(body, dict):
            continue
        for task in body.get("tasks", []):
            if task.get("state") == "FAILED":
                trace = [l.strip() for l in (task.get("trace") or "").splitlines()]
                why = [l for l in trace if "Exception" in l and not l.startswith("at ")][:3]
                print(f"connect.py: the connector's task FAILED, and Connect does not restart a failed task: "
                      f"{' | '.join(why)}", file=sys.stderr, flush=True)
                return


def main():
    mode, key, table = args()
    lib = connect_lib()
    check_wal_level()
    n = names()
    port = free_port()
    home = tempfile.mkdtemp(prefix=f"chaos-connect-{os.environ['CHAOS_RUN_ID']}-")
    props = os.path.join(home, "worker.properties")
    with open(props, "w") as f:
        for k, v in worker_properties(mode, port, n["group"]).items():
            f.write(f"{k}={v}\n")
    java = [
        # No perf data file: a SIGKILLed JVM would leave it in /tmp.
        "java", f"-Xmx{os.environ.get('CHAOS_CONNECT_HEAP', '512m')}", "-XX:-UsePerfData", "-cp", os.path.join(lib, "*"),
        "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
        "-Dorg.slf4j.simpleLogger.log.io.debezium=info",
        "-Dorg.slf4j.simpleLogger.showDateTime=true",
        "org.apache.kafka.connect.cli.ConnectDistributed", props,
    ]
    started = time.monotonic()
    worker = subprocess.Popen(java, stdin=subprocess.DEVNULL)

    def stop(*_):
        worker.terminate()
        try:
            worker.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            worker.kill()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        how = register(worker, port, n["connector"], connector_config(mode, key, table, n))
    finally:
        # The worker read its properties as it started, before it answered:
        # nothing is left in /tmp, however this incarnation ends later.
        shutil.rmtree(home, ignore_errors=True)
    running(worker, port, n["connector"])
    print(f"connect.py: connector {n['connector']} {how}, task RUNNING after "
          f"{time.monotonic() - started:.1f} s ({mode}, REST on 127.0.0.1:{port})", file=sys.stderr, flush=True)
    # The session chaos waits for (named by PGAPPNAME, which libpq reads).
    # Held, not used: if the database restarts under it, it just breaks.
    session = psycopg.connect(os.environ["CHAOS_DATABASE_URL"], connect_timeout=10)
    threading.Thread(target=watch_task, args=(port, n["connector"]), daemon=True).start()
    code = worker.wait()
    session.close()
    fail(code or 1, f"the Connect worker exited with status {code}")


if __name__ == "__main__":
    main()
