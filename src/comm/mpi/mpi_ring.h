// Private to src/comm/mpi: ring collectives over MPI's non-blocking point-to-point operations,
// for the message sizes where they beat Open MPI's own non-blocking collectives (see [Note: MPI
// algorithm by message size] in mpi_algorithm.cpp).
//
// Every function here runs on the group's progress thread, as one op of the group's queue, so the
// ranks post their sends and receives in the same order; messages between two ranks on one tag
// then match in the order posted, and no tag needs agreeing on. The caller's tensors are flat,
// contiguous and on the CPU (the queue checked them).
#pragma once

#include "mpi_check.h"

#include <fsdp/comm/process_group.h>

#include <ATen/ATen.h>

#include <functional>
#include <string>

namespace fsdp::detail {

// What a ring needs from its group: the communicator, this rank's place in it, the start of every
// message, and how to wait.
struct RingLink {
  MPI_Comm comm;
  int rank;
  int size;
  std::string context;  // "fsdp: rank 0 of 2: all_reduce: "
  // Whether a reducing step lands the left's whole chunk at once instead of in landing slots:
  // where the left neighbour is on another host ([Note: a whole chunk posted across hosts]).
  bool land_whole_chunks;
  // Drives requests[0..count) to completion, or throws once the op's deadline passes, naming
  // peers[i], the rank that request i exchanges with, for the first request still pending.
  std::function<void(MPI_Request* requests, const int* peers, int count)> wait_all;
};

// output (n elements) gets chunk rank of the reduction of input (size x n elements), input is
// never written. Each chunk is summed along the ring in the same order as the gloo backend's ring
// (it starts at the chunk's rank + 1 and ends at its owner), in the dtype's arithmetic (BFloat16
// and Half: each hop adds in float32 and rounds once); kAvg divides by size before the last
// rounding. The result is therefore the gloo backend's reduce_scatter_tensor, bit for bit.
void ring_reduce_scatter(const RingLink& link, const at::Tensor& output, const at::Tensor& input,
                         ReduceOp reduce_op);

// tensor gets the reduction over every rank, in place: a ring reduce-scatter over size chunks
// (chunk c: elements [c N / size, (c + 1) N / size), so uneven when size does not divide N,
// and empty when N < size), then a ring all-gather of the reduced chunks. Every rank ends with
// the owner's bits of every chunk, so the result is the same on every rank. Any dtype at::add
// sums; kAvg only for floating point types (the caller checked).
void ring_all_reduce(const RingLink& link, const at::Tensor& tensor, ReduceOp reduce_op);

// output (size x n elements) gets every rank's input (n elements) in rank order.
void ring_all_gather(const RingLink& link, const at::Tensor& output, const at::Tensor& input);

// tensor gets root's tensor: a pipeline along the ring from root (root, root + 1, ...), each rank
// forwarding a segment to its right as soon as it has arrived from its left; the last rank
// (root - 1) only receives. Bytes are moved as they are, any dtype.
void ring_broadcast(const RingLink& link, const at::Tensor& tensor, int root);

// root's tensor gets the reduction over every rank: ring_all_reduce's reduce-scatter (so root's
// result has the bits ring_all_reduce would give), then each rank sends its reduced chunk to
// root. The other ranks' tensors are not written: their partial sums go to two scratch buffers
// of a chunk each.
void ring_reduce(const RingLink& link, const at::Tensor& tensor, int root, ReduceOp reduce_op);

}  // namespace fsdp::detail
