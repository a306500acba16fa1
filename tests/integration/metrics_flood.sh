#!/usr/bin/env bash
# metrics_flood — fsdpd --metrics under abuse, from this machine only (loopback, bounded counts):
# 70 connections that send headers slowly and never finish them, then 100 that send nothing, while
# a scraper asks for /metrics: every scrape is answered within 1 s (the oldest idle connection
# makes room for a new one). 5,000 requests with a 70 kB URL add less than 10 kB to the log. A 405
# answer names the allowed methods (Allow: GET, HEAD).
# Usage: bash metrics_flood.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib/daemon.sh" "$1" "$2" metrics_flood

start_daemon_metrics floodnode
curl -sf --max-time 5 "http://127.0.0.1:$PORT/metrics" -o /dev/null || fail "no answer on /metrics before the flood"

# 405 with Allow.
curl -s --max-time 5 -X POST -D "$S/post.h" -o /dev/null "http://127.0.0.1:$PORT/metrics" || true
grep -q "^HTTP/1.1 405" "$S/post.h" || fail "POST: $(head -1 "$S/post.h")"
grep -qi "^Allow: GET, HEAD" "$S/post.h" || fail "POST's 405 has no 'Allow: GET, HEAD': $(cat "$S/post.h")"

log_before=$(stat -c %s "$S/fsdpd.log")
python3 - "$PORT" <<'PY' || fail "the flood test failed (above)"
import socket, sys, time, urllib.request
port = int(sys.argv[1])
def scrape():
    t = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1.0) as r:
        body = r.read()
    assert b"fsdp_node_up" in body, body[:200]
    return time.monotonic() - t
held = []
def hold(n, partial):
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        if partial:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")   # headers never finished
        held.append(s)
worst = 0.0
for what, n, partial in (("slow-header", 70, True), ("idle", 100, False)):
    hold(n, partial)
    for _ in range(5):   # scrapes while the connections are held
        worst = max(worst, scrape())
        for s in held[-10:]:
            try:
                s.sendall(b"a") if partial else None   # a slow client keeps trickling
            except OSError:
                pass   # closed to make room: expected for the oldest
    print(f"{what}: {len(held)} connections held, worst scrape so far {worst * 1000:.0f} ms")
assert worst < 1.0, worst
for s in held:
    s.close()
# The long-URL flood: 5,000 requests of 70 kB each.
url = b"/" + b"a" * 70000
t = time.monotonic()
for i in range(5000):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        s.sendall(b"GET " + url + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        s.recv(256)
    except OSError:
        pass   # refused mid-send: the server closes early, which is what it should do
    s.close()
print(f"long-URL flood: 5000 requests in {time.monotonic() - t:.1f} s")
print(f"scrape after the flood: {scrape() * 1000:.0f} ms")
PY
log_after=$(stat -c %s "$S/fsdpd.log")
grew=$((log_after - log_before))
echo "the log grew by $grew bytes during the floods"
[ "$grew" -lt 10240 ] || fail "the log grew by $grew bytes (limit 10 kB): $(tail -5 "$S/fsdpd.log")"
stop_daemon
echo "metrics_flood: ok"
