#!/usr/bin/env python3
"""Reads a compute-sanitizer log and says whether any report is ours to fix.

    python3 bench/gpu/sanitizer_reports.py LOG

compute-sanitizer writes each finding as a block of lines that begin "=========": a headline
("Invalid __global__ write of size 4 bytes", "Program hit cudaErrorX ... on CUDA API call to
f.", "Race reported between ...") and then its frames. This splits the log into those blocks
and excuses the ones listed in KNOWN, each with the reason; the rest are printed.

[Note: the reports we excuse]
Only a report whose headline and first host frame both match is excused, so that the same
error from our own code still counts. At present one: NCCL probes, when a communicator is set
up, whether each of its kernels has an image for the device (cudaFuncGetAttributes, then
cudaGetLastError), and expects "no kernel image" for the kernels it was not built with; memcheck
reports each such API error, 8 per communicator set-up on the H200 runs of 2026-11-27 and -28,
every one from ncclInitKernelsForDevice inside libnccl.

Prints one line: "clean", "N report(s), all excused (why...)", or "N of M report(s) not
excused" followed by those reports. Exit status: 0 when every report is excused, 1 when one is
not, 2 when the log holds no sanitizer output at all.
"""
import re
import sys

PREFIX = "========="
HEADLINE = re.compile(r"^=========\s{1,2}(?!\s)(?!Saved host)(\S.*)$")

# (headline pattern, first host frame pattern, why): see [Note: the reports we excuse].
KNOWN = [
    (re.compile(r"Program hit cudaErrorNoKernelImageForDevice .* on CUDA API call to "
                r"(cudaFuncGetAttributes|cudaGetLastError)\."),
     re.compile(r"Host Frame: ncclInitKernelsForDevice\(.*libnccl\.so"),
     "NCCL's kernel-image probe at communicator set-up"),
]


def reports(lines):
    """Each report as its list of lines, the headline first."""
    found, current = [], None
    for line in lines:
        if not line.startswith(PREFIX):
            continue
        if "COMPUTE-SANITIZER" in line or "SUMMARY:" in line:  # the banner, the counts
            current = None
            continue
        if HEADLINE.match(line):
            current = [line]
            found.append(current)
        elif current is not None:
            current.append(line)
    return found


def excuse(report):
    """Why the report is excused, or None."""
    first_host = next((line for line in report if "Host Frame:" in line), "")
    for headline, frame, why in KNOWN:
        if headline.search(report[0]) and frame.search(first_host):
            return why
    return None


def main(argv):
    if len(argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    with open(argv[1], errors="replace") as f:
        lines = f.read().splitlines()
    if not any(line.startswith(PREFIX) for line in lines):
        print(f"no compute-sanitizer output in {argv[1]}")
        return 2
    found = reports(lines)
    open_reports = [r for r in found if excuse(r) is None]
    if not found:
        print("clean")
        return 0
    if not open_reports:
        whys = sorted({excuse(r) for r in found})
        print(f"{len(found)} report(s), all excused ({'; '.join(whys)})")
        return 0
    print(f"{len(open_reports)} of {len(found)} report(s) not excused")
    for report in open_reports:
        print("\n".join(report))
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
