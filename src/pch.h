// Precompiled header shared by every target: the LibTorch headers that nearly every source
// file needs. Keep it to headers we actually use; torch/torch.h would double the build time.
#pragma once
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/autograd.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <functional>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>
