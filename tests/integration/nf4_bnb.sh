#!/usr/bin/env bash
# NF4 (worker/ops/nf4.h) against bitsandbytes on the CPU, on random normal weights of projection
# shapes, a heavy-tailed tensor, one with zero blocks, bf16-rounded weights, tensors of one and of
# many groups of 256 block scales:
# - the packed 4-bit codes are bit-identical to bitsandbytes.functional.quantize_4bit(W, blocksize=64,
#   compress_statistics=True, quant_type="nf4")'s, and the maps (NF4 codebook, 8-bit dynamic map) are its;
# - the offset is torch's fp32 mean of the block scales (bitsandbytes' offset) within the rounding of
#   an fp32 pairwise sum of nb scales, ceil(log2 nb) ulp: fsdpd sums in double, torch in its own
#   vectorized fp32 order (the count of bit-identical offsets is printed);
# - the block scales' codes and group scales are bitsandbytes' second quantization (its default and
#   CUDA rule: the scale over the group's largest magnitude, bucketed on the dynamic map's midpoints),
#   run here with torch from bitsandbytes' raw block scales less fsdpd's offset, bit for bit. (Its CPU
#   library's own quantize_blockwise resolves near-ties between two map entries differently in about
#   0.1% of the codes: that kernel is not the reference);
# - dequantize_4bit of fsdpd's quantized form, through bitsandbytes' QuantState, equals fsdpd's own
#   dequantization bit for bit, in fp32 and in bf16.
# A control that flips one code must be told apart; a size that is not a multiple of 64 is refused in
# one line.
set -euo pipefail
build=$(cd "$1" && pwd) src=$(cd "$2" && pwd)
tmp=$(mktemp -d /tmp/fsdp-it-nf4.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
TPY=$(bash "$src/scripts/test-env.sh" --check)
export OMP_NUM_THREADS=1

"$TPY" - "$build/nf4_tool" "$tmp" <<'PY' 2>&1 | grep -v -i "kernels"
import subprocess, sys, os
import numpy as np, torch
import bitsandbytes.functional as F
tool, tmp = sys.argv[1], sys.argv[2]
rng = np.random.default_rng(5)
cases = {
    "q_proj 512x512 N(0, 0.02)": rng.normal(0, 0.02, (512, 512)),
    "down_proj 256x1024 N(0, 1)": rng.normal(0, 1, (256, 1024)),
    "student-t(3) 64x4096": rng.standard_t(3, (64, 4096)),
    "blocks of zeros 128x192": np.where(np.arange(128 * 192).reshape(128, 192) // 64 % 3 == 0, 0.0,
                                        rng.normal(0, 1, (128, 192))),
    "one block 1x64": rng.normal(0, 3, (1, 64)),
    "bf16-rounded 300x128": torch.tensor(rng.normal(0, 0.05, (300, 128)), dtype=torch.bfloat16).float().numpy(),
}
bad = 0
same_offsets = 0
def read(d, name, dt): return np.fromfile(os.path.join(d, name), dtype=dt)
def bits(a): return np.ascontiguousarray(a).view(np.uint8)
dyn_t = F.create_dynamic_map()
bounds = (dyn_t[:-1] + dyn_t[1:]) / 2
for name, w in cases.items():
    w = w.astype(np.float32)
    d = os.path.join(tmp, str(abs(hash(name))))
    os.makedirs(d)
    w.tofile(os.path.join(d, "in.f32"))
    subprocess.run([tool, os.path.join(d, "in.f32"), d], check=True)
    t = torch.from_numpy(w)
    q, s = F.quantize_4bit(t, blocksize=64, compress_statistics=True, quant_type="nf4")
    raw = torch.ops.bitsandbytes.quantize_4bit.default(t, 64, "nf4", torch.uint8)[1]   # the block scales
    off = read(d, "offset", np.float32)
    ulps = abs(int(off.view(np.int32)[0]) - int(np.float32(s.offset.item()).view(np.int32)))
    same_offsets += ulps == 0
    # the second quantization as bitsandbytes defines it, from fsdpd's offset
    a = (raw - torch.tensor(off[0])).view(-1)
    nb = a.numel(); ng = -(-nb // 256)
    pad = torch.nn.functional.pad(a, (0, ng * 256 - nb)).view(ng, 256)
    amax2 = pad.abs().max(dim=1)[0]
    sc = torch.clamp(pad * (1.0 / amax2.clamp(min=1e-38).view(-1, 1)), -1, 1).view(-1)[:nb]
    qa = torch.bucketize(sc, bounds, out_int32=True).to(torch.uint8)
    checks = {"codes": (read(d, "codes", np.uint8), q.numpy().reshape(-1)),
              "absmax_q": (read(d, "absmax_q", np.uint8), qa.numpy()),
              "absmax2": (read(d, "absmax2", np.float32), amax2.numpy())}
    # bitsandbytes dequantizes fsdpd's quantized form
    st2 = F.QuantState(absmax=torch.from_numpy(amax2.numpy()), code=dyn_t, blocksize=256, dtype=torch.float32)
    ours = F.QuantState(absmax=torch.from_numpy(read(d, "absmax_q", np.uint8)), shape=t.shape, dtype=torch.float32,
                        blocksize=64, code=s.code, quant_type="nf4", offset=torch.tensor(off[0]),
                        state2=F.QuantState(absmax=torch.from_numpy(read(d, "absmax2", np.float32)), code=dyn_t,
                                            blocksize=256, dtype=torch.float32))
    codes_t = torch.from_numpy(read(d, "codes", np.uint8)).view(-1, 1)
    checks["deq.f32"] = (read(d, "deq.f32", np.float32), F.dequantize_4bit(codes_t, ours).numpy().reshape(-1))
    ours.dtype = torch.bfloat16
    checks["deq.bf16"] = (read(d, "deq.bf16", np.uint16),
                          F.dequantize_4bit(codes_t, ours).view(torch.int16).numpy().reshape(-1).view(np.uint16))
    line = [f"offset {ulps} ulp"]
    for k, (got, want) in checks.items():
        same = got.shape == want.shape and np.array_equal(bits(got), bits(want.astype(got.dtype)))
        line.append(f"{k} {'=' if same else '!='}")
        if not same:
            bad = 1
            n = int(np.sum(bits(got) != bits(want.astype(got.dtype)))) if got.shape == want.shape else -1
            print(f"  {name}: {k} differs in {n} bytes (shapes {got.shape}, {want.shape})")
    if ulps > max(1, int(np.ceil(np.log2(raw.numel())))):
        bad = 1
    print(f"{name}: " + ", ".join(line))
print(f"offsets bit-identical to torch's fp32 mean: {same_offsets} of {len(cases)}")
# the maps
d = os.path.join(tmp, str(abs(hash("one block 1x64"))))
code = read(d, "nf4_code.f32", np.float32)
dyn = read(d, "dynamic.f32", np.float32)
bcode = F.get_4bit_type("nf4", device="cpu").numpy().astype(np.float32)
bdyn = F.create_dynamic_map().numpy().astype(np.float32)
maps = np.array_equal(code.view(np.uint32), bcode.view(np.uint32)) and np.array_equal(dyn.view(np.uint32), bdyn.view(np.uint32))
print(f"maps: NF4 codebook and dynamic map {'=' if maps else '!='} bitsandbytes'")
bad |= not maps
# the control: one flipped code is seen
d = os.path.join(tmp, str(abs(hash("q_proj 512x512 N(0, 0.02)"))))
c = read(d, "codes", np.uint8).copy(); c[1000] ^= 0x10
t = torch.from_numpy(np.fromfile(os.path.join(d, "in.f32"), dtype=np.float32).reshape(512, 512))
q, s = F.quantize_4bit(t, blocksize=64, compress_statistics=True, quant_type="nf4")
if np.array_equal(c, q.numpy().reshape(-1)):
    print("control: a flipped code compares equal"); bad = 1
else:
    print("control: a flipped code is told apart")
sys.exit(bad)
PY
status=${PIPESTATUS[0]}
[ "$status" = 0 ] || { echo "FAIL: fsdpd's NF4 is not bitsandbytes'"; exit 1; }
# a size that is no multiple of the block is refused in one line
python3 -c "import struct; open('$tmp/odd.f32','wb').write(struct.pack('100f', *range(100)))"
if "$build/nf4_tool" "$tmp/odd.f32" "$tmp" 2> "$tmp/err"; then echo "FAIL: 100 values were quantized"; exit 1; fi
[ "$(wc -l < "$tmp/err")" = 1 ] && grep -q "not a multiple of 64" "$tmp/err" || { echo "FAIL: refusal: $(cat "$tmp/err")"; exit 1; }
echo "refused: $(cat "$tmp/err")"
echo "nf4_bnb: PASS"
