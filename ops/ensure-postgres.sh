#!/usr/bin/env bash
# Make sure a PostgreSQL server answers on 127.0.0.1:5432 with trust auth, so the
# PostgreSQL half of the test suite runs against a real server: start the local cluster
# if it is stopped, install one from Debian's packages if there is none (which needs root
# and apt-get). Exits 1 with one line on stderr saying why when no server can be had.
set -euo pipefail
host=${PGHOST:-127.0.0.1}
port=${PGPORT:-5432}

ready() {
  if command -v pg_isready >/dev/null; then
    pg_isready -q -h "$host" -p "$port" 2>/dev/null
  else  # no client tools: something listening is the best we can know
    (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null
  fi
}
fail() { echo "ensure-postgres: $*" >&2; exit 1; }

if ready; then
  exit 0
fi
if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    fail "no PostgreSQL on $host:$port, and installing one needs root and apt-get"
  fi
  echo "ensure-postgres: installing PostgreSQL" >&2
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq postgresql; } >/dev/null 2>&1 \
    || fail "no PostgreSQL on $host:$port, and apt-get could not install one"
  version=$(ls /etc/postgresql | sort -V | tail -n 1)
  conf=/etc/postgresql/$version/main
  sed -i "s/^#\?listen_addresses.*/listen_addresses = '127.0.0.1'/" "$conf/postgresql.conf"
  cat > "$conf/pg_hba.conf" <<HBA
local all all trust
host all all 127.0.0.1/32 trust
host all all ::1/128 trust
HBA
fi
version=$(ls /etc/postgresql | sort -V | tail -n 1)
echo "ensure-postgres: starting cluster $version/main" >&2
pg_ctlcluster --skip-systemctl-redirect "$version" main start >/dev/null 2>&1 || true
for _ in $(seq 1 30); do
  ready && break
  sleep 1
done
ready || fail "PostgreSQL did not come up on $host:$port"
if command -v psql >/dev/null; then
  psql -h "$host" -p "$port" -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname='test'" \
    | grep -q 1 || psql -h "$host" -p "$port" -U postgres -c "CREATE DATABASE test" >/dev/null
fi
