// A ProcessGroup that passes every call to the group it wraps: tests that watch or change one
// collective (log it, wrap its work) derive from it and override only that one.
#pragma once

#include <fsdp/comm/process_group.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace fsdp::test {

class ForwardingGroup : public ProcessGroup {
 public:
  explicit ForwardingGroup(std::shared_ptr<ProcessGroup> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  c10::Device device() const override { return inner_->device(); }
  std::string backend_name() const override { return inner_->backend_name(); }
  WorkHandle all_gather_into_tensor(const at::Tensor& out, const at::Tensor& in) override {
    return inner_->all_gather_into_tensor(out, in);
  }
  WorkHandle reduce_scatter_tensor(const at::Tensor& out, const at::Tensor& in,
                                   ReduceOp op) override {
    return inner_->reduce_scatter_tensor(out, in, op);
  }
  WorkHandle all_reduce(const at::Tensor& t, ReduceOp op) override {
    return inner_->all_reduce(t, op);
  }
  WorkHandle broadcast(const at::Tensor& t, int root) override {
    return inner_->broadcast(t, root);
  }
  WorkHandle reduce(const at::Tensor& t, int root, ReduceOp op) override {
    return inner_->reduce(t, root, op);
  }
  WorkHandle barrier() override { return inner_->barrier(); }
  // A split of the wrapped group, wrapped by wrap_split so that it is watched alike.
  std::shared_ptr<ProcessGroup> split(const std::vector<int>& ranks,
                                      const std::string& name) override {
    auto inner = inner_->split(ranks, name);
    return inner ? wrap_split(std::move(inner)) : nullptr;
  }

 protected:
  virtual std::shared_ptr<ProcessGroup> wrap_split(std::shared_ptr<ProcessGroup> inner) = 0;
  ProcessGroup& inner() { return *inner_; }

 private:
  std::shared_ptr<ProcessGroup> inner_;
};

}  // namespace fsdp::test
