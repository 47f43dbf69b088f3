#!/usr/bin/env bash
# Make sure a PostgreSQL server answers on 127.0.0.1:5432 with trust auth, so the
# PostgreSQL half of the test suite runs against a real server: start the local cluster
# if it is stopped, install one from Debian's packages if there is none.
set -euo pipefail
host=${PGHOST:-127.0.0.1}
port=${PGPORT:-5432}

ready() { pg_isready -q -h "$host" -p "$port" 2>/dev/null; }

if command -v pg_isready >/dev/null && ready; then
  exit 0
fi
if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
  echo "ensure-postgres: installing PostgreSQL" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq postgresql >/dev/null
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
pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
for _ in $(seq 1 30); do
  ready && break
  sleep 1
done
ready || { echo "ensure-postgres: PostgreSQL did not come up on $host:$port" >&2; exit 1; }
psql -h "$host" -p "$port" -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname='test'" \
  | grep -q 1 || psql -h "$host" -p "$port" -U postgres -c "CREATE DATABASE test" >/dev/null
