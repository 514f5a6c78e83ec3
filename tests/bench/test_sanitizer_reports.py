#!/usr/bin/env python3
"""bench/gpu/sanitizer_reports.py against compute-sanitizer output: the report memcheck gave on
the H200 (NCCL's kernel-image probe, quoted from the run of 2026-11-28) is excused; the same
API error from our own frame, an invalid write, and a race are not; racecheck's hazards
inside PyTorch's attention kernel (quoted from the same run) are, unless one access is
elsewhere. Run by ctest (SanitizerReports)."""
import os
import subprocess
import sys
import tempfile

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "gpu", "sanitizer_reports.py")
BANNER = "========= COMPUTE-SANITIZER\n"
NCCL_PROBE = """\
========= Program hit cudaErrorNoKernelImageForDevice (error 209) due to "no kernel image is available for execution on the device" on CUDA API call to cudaFuncGetAttributes.
=========     Saved host backtrace up to driver entry point at error
=========         Host Frame: ncclInitKernelsForDevice(int, int, unsigned long*) in enqueue.cc:52 [0x6d9d3] in libnccl.so.2
=========         Host Frame: ncclCommInitRankFunc(ncclAsyncJob*) in init.cc:1534 [0x85765] in libnccl.so.2
=========
"""
OURS_API_ERROR = NCCL_PROBE.replace(
    "ncclInitKernelsForDevice(int, int, unsigned long*) in enqueue.cc:52 [0x6d9d3] in libnccl.so.2",
    "fsdp::detail::launch_pack(at::Tensor const&) [0x1234] in libfsdp.so")
INVALID_WRITE = """\
========= Invalid __global__ write of size 4 bytes
=========     at fill(int *)+0x70
=========     by thread (32,0,0) in block (0,0,0)
=========     Address 0x7f0000000080 is out of bounds
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: main [0x1111] in probe
=========
"""
TORCH_ATTENTION_RACE = """\
========= Error: Race reported between Read access at fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float, cutlass::arch::Sm80, (bool)1, (int)64, (int)64, (int)64, (bool)1, (bool)1>::Params)+0x103d0
=========     and Write access at fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float, cutlass::arch::Sm80, (bool)1, (int)64, (int)64, (int)64, (bool)1, (bool)1>::Params)+0x10840 [56 hazards]
=========
"""
RACE = """\
========= Error: Race reported between Write access at 0x30 in pack(float*)
=========     and Read access at 0x50 in pack(float*) [8 hazards]
=========
"""


def classify(text):
    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
        f.write(text)
    try:
        run = subprocess.run([sys.executable, SCRIPT, f.name], capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    return run.returncode, run.stdout


def main():
    cases = [
        ("banner and summary only", BANNER + "========= ERROR SUMMARY: 0 errors\n", 0, "clean"),
        ("NCCL's probe, twice", BANNER + NCCL_PROBE * 2 + "========= ERROR SUMMARY: 2 errors\n",
         0, "2 report(s), all excused (NCCL's kernel-image probe"),
        ("the same API error from our frame", BANNER + NCCL_PROBE + OURS_API_ERROR, 1,
         "1 of 2 report(s) not excused"),
        ("an invalid write beside NCCL's probe", BANNER + NCCL_PROBE + INVALID_WRITE, 1,
         "1 of 2 report(s) not excused\n========= Invalid __global__ write"),
        ("a race", BANNER + RACE + "========= RACECHECK SUMMARY: 1 hazard displayed\n", 1,
         "1 of 1 report(s) not excused"),
        ("a race inside PyTorch's attention kernel",
         BANNER + TORCH_ATTENTION_RACE * 3 + "========= RACECHECK SUMMARY: 3 hazards displayed\n",
         0, "3 report(s), all excused (shared-memory hazards inside PyTorch's"),
        ("a race between PyTorch's attention kernel and ours",
         BANNER + TORCH_ATTENTION_RACE.replace("and Write access at fmha_cutlassF_f32_aligned",
                                               "and Write access at pack_shards"), 1,
         "1 of 1 report(s) not excused"),
        ("no sanitizer output", "probe: no error\n", 2, "no compute-sanitizer output"),
    ]
    failures = 0
    for name, text, want_rc, want_start in cases:
        rc, out = classify(text)
        if rc != want_rc or not out.startswith(want_start):
            failures += 1
            print(f"FAIL {name}: exit {rc} (want {want_rc}), output {out!r} (want {want_start!r}...)")
        else:
            print(f"ok   {name}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
