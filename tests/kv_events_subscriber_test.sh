#!/usr/bin/env bash
# Runs kv_events_subscriber_test.py with a Python that has zmq and msgpack (Debian's python3-zmq
# and python3-msgpack live in /usr/bin/python3's path, which a pyenv or venv python3 first on
# PATH does not see). Exits 77 (skipped) where there is none.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
for py in python3 /usr/bin/python3; do
  if command -v "$py" >/dev/null && "$py" -c 'import zmq, msgpack' 2>/dev/null; then
    exec "$py" "$here/kv_events_subscriber_test.py"
  fi
done
echo "SKIP: no python3 with the zmq and msgpack modules (apt install python3-zmq python3-msgpack)"
exit 77
