#!/usr/bin/env bash
# Installs what Cynomys and its tests need on a fresh Debian/Ubuntu machine:
# MariaDB, Redis and PostgreSQL server binaries (the tests and the demo start
# their own throwaway servers on free loopback ports; no system service is
# used), a Java 17 runtime (Spark) and the JDBC drivers of the Iceberg JDBC
# catalog, a C compiler and the Python headers (the compiled hot path,
# cynomys/_speedups.c), Prometheus with promtool (the alert rules' tests and
# a real scrape of both daemons), libfaketime (a source whose clock runs
# ahead, for the freshness test), and a Python virtual environment in .venv.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || need+=(mariadb-server mariadb-client)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v java >/dev/null 2>&1 || need+=(openjdk-17-jre-headless)
# The Iceberg JDBC catalog: PostgreSQL (the tests start their own server) and
# the JDBC drivers Spark loads from /usr/share/java (MariaDB's for a MariaDB catalog).
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
[ -f /usr/share/java/postgresql.jar ] || need+=(libpostgresql-jdbc-java)
[ -f /usr/share/java/mariadb-java-client.jar ] || need+=(libmariadb-java)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
# The compiled hot path: gcc and Python.h for the python3 that makes .venv.
command -v gcc >/dev/null 2>&1 || need+=(gcc libc6-dev)
[ -f "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" ] || need+=(python3-dev)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
dpkg -s faketime >/dev/null 2>&1 || need+=(faketime)
# mysqlclient (the snapshot's chunk reads, setup.cfg extra "snapshot") builds against libmariadb.
pkg-config --exists libmariadb 2>/dev/null || need+=(libmariadb-dev pkg-config)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  # Do not start the packaged services: Cynomys runs its own server processes.
  DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
# One extra per target kind, read from the registry (cynomys/core/targets.py
# imports nothing, so the system python reads it before the venv exists).
KINDS=$(PYTHONPATH=. python3 -c 'from cynomys.core.targets import TARGET_KINDS; print(",".join(TARGET_KINDS))')
.venv/bin/python -m pip install -q -e ".[${KINDS},snapshot,lake,test,bench,docs]"
# The extension is optional (Cynomys falls back to pure Python): say so here
# rather than let a slow producer be the first sign.
.venv/bin/python -c 'import cynomys._speedups' 2>/dev/null \
  || echo "setup: WARNING: the compiled hot path (cynomys._speedups) did not build; Cynomys runs pure Python (slower)" >&2
.venv/bin/python -c 'import cynomys._reader' 2>/dev/null \
  || echo "setup: WARNING: the compiled binlog reader (cynomys._reader) did not build; the library's reader runs (slower)" >&2
echo "setup: ready (.venv)"
