#!/usr/bin/env bash
# gloo_rendezvous — two ways the gloo rendezvous of standalone ranks failed, each on a trial that
# sets it up (rank 0 of 2 started first; trials run until two of them have hit the case):
# - A stranger: a process that connects to 127.0.0.1 at the port a rank's gloo pair listens on (as
#   a ZeroMQ client retrying a server that has exited does, once the kernel has given that
#   ephemeral port to gloo). gloo 0.5's TCP pair accepts the first connection its port receives: on
#   127.0.0.1 the stranger was accepted, the peer's connect refused, the rendezvous failed on both
#   ranks. Standalone ranks now listen on a loopback address of their own (comm_gloo.cc). The
#   stranger connects before rank 1 starts; both ranks must train their step. The trials that count
#   are those where rank 0 is the accepting side (gloo's rule: the lower address and port accepts).
# - An early exit: the connecting rank of a pair leaves connectFullMesh once its TCP connect is
#   made, before the peer has accepted it; on a bad data file it failed and exited while rank 0 was
#   still connecting, and rank 0 reported "gloo rendezvous ... Connection closed by peer" instead of
#   the bad file (integ_gen_data_bpe's bad shard, once). Rank 0 is stopped (SIGSTOP) after it
#   publishes its address; rank 1, the connecting side in the trials that count, connects and either
#   exits (the old code) or waits in the rendezvous's closing barrier, having sent on the connection;
#   then rank 0 resumes. Both ranks must name the bad file.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh" "$1" "$2" gloo-rendezvous
source "$(dirname "$0")/lib/job.sh"
tiny_job "$S/job.ini" fsdp.timeout_s=30
tiny_job "$S/bad.ini" fsdp.timeout_s=30 data.train=bad.bin
head -c 2048 /dev/urandom > "$S/bad.bin"
OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python3 - "$BUILD/fsdp-worker" "$S" <<'PY' || fail "the rendezvous failed"
import os, signal, socket, struct, subprocess, sys, time
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

def start(rank, rdv, job="job.ini"):
    return subprocess.Popen([worker, "--standalone", "--rank", str(rank), "--world", "2", "--rendezvous", rdv,
                             f"{S}/{job}"], stdout=open(f"{rdv}.{rank}.jsonl", "w"), stderr=open(f"{rdv}.{rank}.log", "w"))

def finish(p, rdv, rank, want_rc=0):
    try:
        rc = p.wait(timeout=90)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = "no exit within 90 s"
    if (rc == 0) != (want_rc == 0) or rc == "no exit within 90 s":
        log = open(f"{rdv}.{rank}.log").read().strip().splitlines()
        sys.exit(f"rank {rank}: exit {rc}: {log[-1] if log else ''}")

def first_address(rdv, proc):
    deadline = time.monotonic() + 60
    while not pair_addresses(rdv):
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"{rdv}: rank 0 published no pair address within 60 s")
        time.sleep(0.01)
    return next(iter(pair_addresses(rdv).items()))

def rx_queued(addr, port):
    """Bytes waiting on the established TCP socket whose local end is ADDR:PORT (/proc/net/tcp)."""
    want = f"{struct.unpack('<I', addr)[0]:08X}:{socket.ntohs(port):04X}"
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        f = line.split()
        if f[1] == want and f[3] == "01":
            return int(f[4].split(":")[1], 16)
    return 0

tested = 0
for trial in range(16):
    rdv = f"{S}/stranger{trial}"
    os.mkdir(rdv)
    r0 = start(0, rdv)
    key0, (addr0, port0) = first_address(rdv, r0)
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

tested = 0
for trial in range(16):
    rdv = f"{S}/early{trial}"
    os.mkdir(rdv)
    r0 = start(0, rdv, "bad.ini")
    key0, (addr0, port0) = first_address(rdv, r0)
    os.kill(r0.pid, signal.SIGSTOP)
    r1 = start(1, rdv, "bad.ini")
    deadline = time.monotonic() + 60
    while len(pair_addresses(rdv)) < 2 and r1.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    others = [v for k, v in pair_addresses(rdv).items() if k != key0]
    connects = bool(others) and others[0] > (addr0, port0)   # rank 1 the connecting side
    while connects and r1.poll() is None and rx_queued(addr0, port0) == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(r0.pid, signal.SIGCONT)
    finish(r1, rdv, 1, want_rc=1)
    finish(r0, rdv, 0, want_rc=1)
    for r in (0, 1):
        log = open(f"{rdv}.{r}.log").read()
        assert "bad.bin is not an llm.c token file" in log, f"rank {r} did not name the bad file: {log.strip().splitlines()[-1:]}"
    print(f"trial {trial}: rank 1 {'connects' if connects else 'accepts'}; each rank named the bad file")
    tested += connects
    if tested == 2:
        break
assert tested == 2, f"rank 1 was the connecting side in {tested} of 16 trials"
PY
echo "gloo_rendezvous: OK"
