#!/usr/bin/env python3
"""A stand-in Python reference for tests/support/test_reference_cache.cpp: it reads its inputs,
writes its outputs, and appends a line to $PROBE_LAUNCHES each time Python starts, so the test can
tell a computed result from a restored one and count launches.

    reference_cache_probe.py IN OUT [--dir OUTDIR] [--fail]
    reference_cache_probe.py --jobs FILE    (the batch protocol of fsdp2_reference.py)

OUT gets "probe:" + IN's bytes + the arguments; OUTDIR (if given) gets a.txt and sub/b.txt; --fail
exits 1 after writing nothing.
"""
import json
import os
import shlex
import sys


def run(argv):
    args = [a for a in argv if not a.startswith("--")]
    if "--fail" in argv:
        print("probe: failing on purpose")
        return False
    src, out = args[0], args[1]
    with open(src, "rb") as f:
        data = f.read()
    with open(out, "wb") as f:
        f.write(b"probe:" + data + " ".join(argv).encode())
    if "--dir" in argv:
        d = argv[argv.index("--dir") + 1]
        os.makedirs(os.path.join(d, "sub"), exist_ok=True)
        with open(os.path.join(d, "a.txt"), "w") as f:
            f.write("a")
        with open(os.path.join(d, "sub", "b.txt"), "w") as f:
            f.write("b")
    print(f"probe: computed {out}")
    return True


def main():
    if os.environ.get("PROBE_LAUNCHES"):
        with open(os.environ["PROBE_LAUNCHES"], "a") as f:
            f.write("launch\n")
    if len(sys.argv) == 3 and sys.argv[1] == "--jobs":
        with open(sys.argv[2]) as f:
            jobs = json.load(f)
        status = []
        for job in jobs:
            ok = run(shlex.split(job))
            status.append({"ok": ok, "output": "probe: job " + ("ok" if ok else "failed")})
        with open(sys.argv[2] + ".status", "w") as f:
            json.dump(status, f)
        sys.exit(0 if all(s["ok"] for s in status) else 1)
    sys.exit(0 if run(sys.argv[1:]) else 1)


if __name__ == "__main__":
    main()
