#!/usr/bin/env bash
# gloo_stranger — a process that connects to 127.0.0.1 at the port a standalone rank's gloo pair
# listens on (as a ZeroMQ client retrying a server that has exited does, once the kernel has given
# that ephemeral port to gloo) does not take the peer's place. gloo 0.5's TCP pair accepts the first
# connection its port receives; on 127.0.0.1 the stranger was accepted, the peer's connect refused,
# and the rendezvous failed on both ranks. Standalone ranks now listen on a loopback address of
# their own (comm_gloo.cc). Each trial starts rank 0 of 2, connects the stranger to 127.0.0.1 at
# the port rank 0 published, then starts rank 1; both must train their step. Only trials in which
# rank 0 is the accepting side (gloo's rule: the lower address and port accepts) test anything, so
# trials run until two such ones have.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh" "$1" "$2" gloo-stranger
cat > "$S/job.ini" <<'JOB'
[job]
steps = 1
[model]
n_layer = 1
n_head = 2
n_embd = 16
vocab_size = 64
seq_len = 16
[data]
train = synthetic:markov:1
batch_size = 1
grad_accum = 1
[fsdp]
world_size = 2
timeout_s = 30
JOB
OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python3 - "$BUILD/fsdp-worker" "$S" <<'PY' || fail "a stranger on 127.0.0.1 broke the rendezvous"
import os, socket, struct, subprocess, sys, time
worker, S = sys.argv[1], sys.argv[2]

def pair_addresses(rdv):
    """{file: (address bytes, port as stored)} of the pair addresses in gloo's file store: for world
    2 a rank publishes one tcp::Address, a sockaddr_storage and a sequence number (136 bytes)."""
    out = {}
    for f in os.listdir(rdv):
        p = os.path.join(rdv, f)
        if f.startswith(".") or os.path.getsize(p) != 136:
            continue
        b = open(p, "rb").read()
        assert struct.unpack("<H", b[:2])[0] == socket.AF_INET, f"{p}: not an IPv4 address"
        out[f] = (b[4:8], struct.unpack("<H", b[2:4])[0])
    return out

def start(rank, rdv):
    return subprocess.Popen([worker, "--standalone", "--rank", str(rank), "--world", "2", "--rendezvous", rdv,
                             f"{S}/job.ini"], stdout=open(f"{rdv}.{rank}.jsonl", "w"), stderr=open(f"{rdv}.{rank}.log", "w"))

def finish(p, rdv, rank):
    try:
        rc = p.wait(timeout=90)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = "no exit within 90 s"
    if rc != 0:
        log = open(f"{rdv}.{rank}.log").read().strip().splitlines()
        sys.exit(f"rank {rank}: {rc}: {log[-1] if log else ''}")

tested = 0
for trial in range(16):
    rdv = f"{S}/rdv{trial}"
    os.mkdir(rdv)
    r0 = start(0, rdv)
    deadline = time.monotonic() + 60
    while not pair_addresses(rdv):
        if r0.poll() is not None or time.monotonic() > deadline:
            finish(r0, rdv, 0)
            sys.exit("rank 0 published no pair address within 60 s")
        time.sleep(0.01)
    (key0, (addr0, port0)), = pair_addresses(rdv).items()
    stranger = socket.socket()
    try:
        stranger.connect(("127.0.0.1", socket.ntohs(port0)))
    except OSError:
        pass   # nothing listens there for the stranger: what the fix is for
    r1 = start(1, rdv)
    finish(r1, rdv, 1)
    finish(r0, rdv, 0)
    stranger.close()
    (addr1, port1), = [v for k, v in pair_addresses(rdv).items() if k != key0]
    accepts = (addr0, port0) < (addr1, port1)   # Pair::connect: memcmp of the addresses, then the ports
    assert open(f"{rdv}.0.jsonl").read().count('"step":1,') == 1, "rank 0 reported no step 1"
    print(f"trial {trial}: rank 0 at {socket.inet_ntoa(addr0)}:{socket.ntohs(port0)} "
          f"{'accepts' if accepts else 'connects'}, the stranger tried 127.0.0.1: both ranks trained")
    tested += accepts
    if tested == 2:
        break
assert tested == 2, f"rank 0 was the accepting side in {tested} of 16 trials"
PY
echo "gloo_stranger: OK"
