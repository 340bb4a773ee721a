#!/usr/bin/env bash
# Makes sure the services the tests need are installed and answering:
# PostgreSQL on 127.0.0.1:5432 (user postgres without password, database
# "test") and Redis on 127.0.0.1:6379, and the pgbouncer program the
# pooled-connection tests start. Installs them with apt-get when they
# are missing, starts them when they are stopped, and leaves running ones
# alone. Safe to run again and again (.ci/test runs it first).
set -euo pipefail

log() { printf 'services: %s\n' "$*" >&2; }

apt_install() { # apt_install <why> <package...>
	local why=$1
	shift
	log "installing $* with apt-get: $why"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

wait_for() { # wait_for <what> <command...>: up to 60 s
	local what=$1
	shift
	for _ in $(seq 1 120); do
		if "$@" >/dev/null 2>&1; then
			return 0
		fi
		sleep 0.5
	done
	log "$what did not answer within 60s"
	return 1
}

# --- PostgreSQL -------------------------------------------------------------
installed_pg=false
if ! command -v pg_ctlcluster >/dev/null 2>&1 || [ -z "$(ls /etc/postgresql 2>/dev/null)" ]; then
	apt_install "the tests run against a real PostgreSQL (127.0.0.1:5432, user postgres, database test)" postgresql postgresql-client
	installed_pg=true
fi
pg_version=$(ls /etc/postgresql | sort -V | tail -n 1)
if $installed_pg; then
	# A fresh Debian cluster asks for passwords over TCP; the tests connect
	# as postgres without one, from this machine only.
	hba="/etc/postgresql/$pg_version/main/pg_hba.conf"
	sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$hba"
fi
if ! pg_isready -q -h 127.0.0.1 -p 5432; then
	log "starting PostgreSQL $pg_version"
	pg_ctlcluster --skip-systemctl-redirect "$pg_version" main start || true
fi
wait_for "PostgreSQL on 127.0.0.1:5432" pg_isready -q -h 127.0.0.1 -p 5432
if $installed_pg; then
	pg_ctlcluster --skip-systemctl-redirect "$pg_version" main reload
fi
psql_admin() { psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -U postgres -d postgres "$@"; }
wait_for "PostgreSQL login as postgres" psql_admin -tAc 'SELECT 1'
if [ "$(psql_admin -tAc "SELECT 1 FROM pg_database WHERE datname = 'test'")" != "1" ]; then
	log "creating database test"
	psql_admin -c 'CREATE DATABASE test'
fi

# --- Redis ------------------------------------------------------------------
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
	apt_install "the tests run asynq on a real Redis (127.0.0.1:6379)" redis-server redis-tools
fi
if [ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" != "PONG" ]; then
	log "starting Redis"
	# Nothing kept on disk: the tests' data is throwaway.
	redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no
fi
redis_ping() { [ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" = "PONG" ]; }
wait_for "Redis on 127.0.0.1:6379" redis_ping

# --- PgBouncer --------------------------------------------------------------
# Installed only: the pooled-connection tests start their own PgBouncer on a
# free port, as the postgres user (PgBouncer refuses to run as root).
if ! command -v pgbouncer >/dev/null 2>&1 && [ ! -x /usr/sbin/pgbouncer ]; then
	apt_install "the pooled-connection tests start their own PgBouncer in transaction mode" pgbouncer
fi

log "PostgreSQL and Redis are up; PgBouncer is installed"
