#!/usr/bin/env bash
# API fuzzing: schemathesis (from PyPI, in its own venv) against the OpenAPI document the
# server serves, with an admin token, a bounded number of examples per operation.
# Every check schemathesis has: no 5xx; status codes, content types, bodies and headers as
# documented; every request the document allows is accepted (2xx, or a status the settings in
# .ci/schemathesis.toml explain) and every request it does not allow is refused; a missing
# required header is refused.
# Usage: .ci/schemathesis.sh [path/to/levee] [schemathesis run options...]
#        (default binary: target/debug/levee, built if missing)
set -euo pipefail
cd "$(dirname "$0")/.."

LEVEE_BIN="${1:-target/debug/levee}"
[ $# -gt 0 ] && shift
CONFIG="$(pwd)/.ci/schemathesis.toml"
[ -x "$LEVEE_BIN" ] || cargo build -p levee-server --bin levee
VENV="${SCHEMATHESIS_VENV:-target/schemathesis-venv}"
if [ ! -x "$VENV/bin/schemathesis" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet 'schemathesis>=4.0,<5'
fi

WORK="$(mktemp -d)"
PASSWORD="schemathesis-admin-password"
cleanup() {
  if [ -n "${SERVER_PID:-}" ]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

# Port 0: the server picks free ports and prints them.
LEVEE_DATA_DIR="$WORK/data" LEVEE_HTTP_ADDR=127.0.0.1:0 LEVEE_GRPC_ADDR=127.0.0.1:0 \
  LEVEE_ADMIN_PASSWORD="$PASSWORD" LEVEE_LOG=warn \
  env -u LEVEE_DATABASE_URL "$LEVEE_BIN" serve >"$WORK/out.log" 2>&1 &
SERVER_PID=$!
BASE=""
for _ in $(seq 1 300); do
  BASE="$(sed -n 's#^levee listening: \(http://[^ ]*\) .*#\1#p' "$WORK/out.log" | head -n1)"
  [ -n "$BASE" ] && break
  kill -0 "$SERVER_PID" 2>/dev/null || { cat "$WORK/out.log"; exit 1; }
  sleep 0.1
done
[ -n "$BASE" ] || { echo "levee did not start"; cat "$WORK/out.log"; exit 1; }

SESSION="$(curl -sf -H 'content-type: application/json' \
  -d "{\"username\":\"admin\",\"password\":\"$PASSWORD\"}" "$BASE/api/v1/auth/login" \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')"
# An admin API token, not a session: the fuzzer may change admin's password or role
# (which ends sessions) and must keep its own access.
TOKEN="$(curl -sf -H "authorization: Bearer $SESSION" -H 'content-type: application/json' \
  -d '{"kind":"api","name":"schemathesis","role":"admin","reason":"schemathesis"}' "$BASE/api/v1/tokens" \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')"
# Something to find: an environment with a service, so paths that name them reach handlers.
curl -sf -H "authorization: Bearer $TOKEN" -H 'content-type: application/json' \
  -d '{"name":"prod","allow_faults":true,"reason":"schemathesis"}' "$BASE/api/v1/environments" >/dev/null
curl -sf -H "authorization: Bearer $TOKEN" -H 'content-type: application/json' \
  -d '{"name":"checkout","reason":"schemathesis","policy":{"dependencies":{"payments":{"attempt_timeout":"300ms"}}},"flags":{"beta":{"type":"bool","value":false}}}' \
  "$BASE/api/v1/environments/prod/services" >/dev/null

# Run from the scratch directory: schemathesis keeps a cache (.schemathesis/) in its cwd.
VENV_ABS="$(cd "$VENV" && pwd)"
cd "$WORK"
"$VENV_ABS/bin/schemathesis" --config-file "$CONFIG" run "$BASE/api/v1/openapi.json" \
  --url "$BASE" \
  --header "Authorization: Bearer $TOKEN" \
  --checks all \
  --max-examples "${SCHEMATHESIS_EXAMPLES:-20}" \
  --seed 1 \
  --request-timeout 10 \
  --max-time "${SCHEMATHESIS_MAX_TIME:-180}" \
  "$@" 2>&1 | tee "$WORK/report.txt"
