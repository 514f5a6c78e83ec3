// The sinks of fsdp/train/metrics_sink.h. The JSON lines and the TensorBoard scalars come from
// the same StepRecord, so the two never disagree; tests/tools/test_fsdp_train_tensorboard.cpp
// reads both back and compares them.
#include <fsdp/train/metrics_sink.h>

#include <train/tensorboard_event.h>
#include <train/tensorboard_writer.h>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <algorithm>

namespace fsdp::train {
namespace {

nlohmann::json ranks_json(const std::vector<RankStepStats>& ranks) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& s : ranks) {
    out.push_back({{"rank", s.rank},
                   {"param_bytes", s.param_bytes},
                   {"grad_bytes", s.grad_bytes},
                   {"optim_bytes", s.optim_bytes},
                   {"peak_unsharded_bytes", s.peak_unsharded_bytes},
                   {"all_gather_bytes", s.all_gather_bytes},
                   {"reduce_scatter_bytes", s.reduce_scatter_bytes},
                   {"all_reduce_bytes", s.all_reduce_bytes},
                   {"broadcast_bytes", s.broadcast_bytes},
                   {"reduce_bytes", s.reduce_bytes},
                   {"tp_all_gather_calls", s.tp_all_gather_calls},
                   {"tp_reduce_scatter_calls", s.tp_reduce_scatter_calls},
                   {"tp_all_reduce_calls", s.tp_all_reduce_calls},
                   {"peak_rss_bytes", s.peak_rss_bytes},
                   {"sent_bytes", s.sent_bytes},
                   {"peak_alloc_bytes", s.peak_alloc_bytes},
                   {"activation_bytes", s.activation_bytes},
                   {"host_kept_bytes", s.host_kept_bytes},
                   {"host_returned_bytes", s.host_returned_bytes}});
  }
  return out;
}

int64_t largest_peak_alloc_bytes(const std::vector<RankStepStats>& ranks) {
  int64_t peak = 0;
  for (const auto& s : ranks) peak = std::max(peak, s.peak_alloc_bytes);
  return peak;
}

nlohmann::json to_json(const StepRecord& r) {
  nlohmann::json line = {{"step", r.step},
                         {"loss", r.loss},
                         {"grad_norm", r.grad_norm},
                         {"tokens_per_s", r.tokens_per_s},
                         {"step_s", r.step_s},
                         {"exposed_comm_s", r.exposed_comm_s},
                         {"comm_s", r.comm_s},
                         {"lr", r.lr},
                         {"skipped_steps", r.skipped_steps},
                         {"units", r.units},
                         {"ranks", ranks_json(r.ranks)}};
  if (r.val_loss) line["val_loss"] = *r.val_loss;
  if (r.loss_scale) line["loss_scale"] = *r.loss_scale;
  if (r.tp_comm_s) line["tp_comm_s"] = *r.tp_comm_s;
  return line;
}

std::vector<TensorBoardScalar> tensorboard_scalars(const StepRecord& r) {
  auto f = [](double v) { return static_cast<float>(v); };
  std::vector<TensorBoardScalar> scalars = {
      {"train/loss", f(r.loss)},
      {"train/lr", f(r.lr)},
      {"train/grad_norm", f(r.grad_norm)},
      {"perf/tokens_per_s", f(r.tokens_per_s)},
      {"perf/step_s", f(r.step_s)},
      {"memory/peak_alloc_bytes", f(static_cast<double>(largest_peak_alloc_bytes(r.ranks)))}};
  if (r.val_loss) scalars.push_back({"val/loss", f(*r.val_loss)});
  if (r.loss_scale) scalars.push_back({"train/loss_scale", f(*r.loss_scale)});
  return scalars;
}

}  // namespace

std::string to_json_line(const StepRecord& record) { return to_json(record).dump(); }

JsonLinesSink::JsonLinesSink(const std::string& path, const std::string& name)
    : path_(path), out_(path, std::ios::out | std::ios::trunc) {
  TORCH_CHECK(out_.good(), "cannot open ", name, " '", path, "' for writing");
}

void JsonLinesSink::write(const StepRecord& record) {
  out_ << to_json_line(record) << '\n';
  out_.flush();
  TORCH_CHECK(out_.good(), "cannot write metrics file '", path_, "'");
}

TensorBoardSink::TensorBoardSink(const std::string& dir, const std::string& name)
    : writer_(std::make_unique<TensorBoardWriter>(dir, name)) {}
TensorBoardSink::~TensorBoardSink() = default;

void TensorBoardSink::write(const StepRecord& record) {
  writer_->write_scalars(record.step, tensorboard_scalars(record));
}

const std::string& TensorBoardSink::path() const { return writer_->path(); }

}  // namespace fsdp::train
