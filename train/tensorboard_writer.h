// TensorBoardSink's file (fsdp/train/metrics_sink.h): one event file of TensorBoard scalars. The
// file is named as TensorBoard's own writers name theirs, events.out.tfevents.<unix
// seconds>.<hostname> (with .<pid> added if a run of the same second on the same host made that
// name already), so `tensorboard --logdir DIR` finds it. Its first record is the file_version
// event; then one event per write_scalars(), flushed to the kernel before it returns, so a crashed
// run loses at most the step it was in. The encoding is tensorboard_event.h's.
#pragma once

#include <train/tensorboard_event.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace fsdp::train {

class TensorBoardWriter {
 public:
  // Creates dir unless it exists (its parent must) and a new event file in it. Throws naming
  // name (fsdp-train's: --tensorboard), the path and the system's reason when either cannot be
  // made.
  TensorBoardWriter(const std::string& dir, const std::string& name);

  // One event of step's scalars, stamped with the wall clock now. Throws if the write fails.
  void write_scalars(int64_t step, const std::vector<TensorBoardScalar>& scalars);

  // The event file's path.
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& data);

  struct Closer {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::string name_;
  std::string path_;
  std::unique_ptr<std::FILE, Closer> file_;
};

}  // namespace fsdp::train
