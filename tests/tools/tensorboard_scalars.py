"""TensorBoard's side of tests/tools/test_fsdp_train_tensorboard.cpp: reads fsdp-train's
--tensorboard directory with TensorBoard's own readers and prints what they found as one JSON
object on stdout:

  {"files": [the directory's file names],
   "events": [{"step": s, "wall_time": t, "file_version": "...", "tags": [...]}, ...],
   "scalars": {tag: [[step, value], ...]}}

"events" are the file's records in order (EventFileLoader); "scalars" is what TensorBoard's
EventAccumulator, the reader behind its dashboards, makes of the directory. Both check every
record's CRC-32C and stop quietly at the first bad one, so a bad checksum shows as missing
events.

usage: tensorboard_scalars.py DIR

Exits non-zero with a message when tensorboard is missing or DIR holds no single event file.
"""
import json
import os
import sys

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
except ImportError as e:  # never skip silently
    sys.exit(f"tensorboard_scalars.py: {e}; install it with "
             f"'{sys.executable} -m pip install -r scripts/requirements-test.txt'")

directory = sys.argv[1]
files = sorted(os.listdir(directory))
if len(files) != 1:
    sys.exit(f"tensorboard_scalars.py: {directory} holds {files}, not one event file")

events = []
for event in EventFileLoader(os.path.join(directory, files[0])).Load():
    events.append({
        "step": event.step,
        "wall_time": event.wall_time,
        "file_version": event.file_version,
        "tags": [v.tag for v in event.summary.value],
    })

# size_guidance 0: keep every event (the default samples scalars down to 10,000 per tag).
accumulator = EventAccumulator(directory, size_guidance={"scalars": 0})
accumulator.Reload()
scalars = {
    tag: [[e.step, e.value] for e in accumulator.Scalars(tag)]
    for tag in accumulator.Tags()["scalars"]
}
print(json.dumps({"files": files, "events": events, "scalars": scalars}))
