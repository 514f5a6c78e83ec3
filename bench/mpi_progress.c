/* Blocking against non-blocking MPI collectives, and the cost of each way of waiting for a
 * non-blocking one: the measurement behind the mpi backend's design (src/comm/mpi/). Plain MPI,
 * no fsdp code, so it shows what the library itself costs here.
 *
 *   mpicc -O2 bench/mpi_progress.c -o build/mpi-progress
 *   mpirun --allow-run-as-root --oversubscribe -np 2 build/mpi-progress
 *
 * For each size (4 KiB, 256 KiB, 4 MiB of float32) and collective (all-reduce, all-gather,
 * reduce-scatter), rank 0 prints the median over 200 calls (after 20 untimed) of: the blocking
 * call; the non-blocking call then MPI_Wait; and the non-blocking call driven by MPI_Test in a
 * loop that spins, yields (sched_yield) or sleeps with backoff (2 us doubling to 200 us after
 * 50 us of spinning, with a 1 us timer slack). Ranks start each call
 * together (a barrier). */
#define _GNU_SOURCE
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

enum { kIters = 200, kWarmup = 20 };
enum Wait { kBlocking, kWait, kSpin, kYield, kBackoff, kWaits };
static const char* kWaitNames[kWaits] = {"blocking", "MPI_Wait", "spin", "yield", "backoff"};
enum Coll { kAllReduce, kAllGather, kReduceScatter, kColls };
static const char* kCollNames[kColls] = {"all-reduce", "all-gather", "reduce-scatter"};

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

static void sleep_us(double us) {
  struct timespec t = {0, (long)(us * 1000)};
  nanosleep(&t, NULL);
}

static void drive(MPI_Request* request, enum Wait wait) {
  if (wait == kWait) {
    MPI_Wait(request, MPI_STATUS_IGNORE);
    return;
  }
  const double start = now_us();
  double sleep = 2;
  for (;;) {
    int done = 0;
    MPI_Test(request, &done, MPI_STATUS_IGNORE);
    if (done) return;
    if (wait == kYield) sched_yield();
    if (wait == kBackoff && now_us() - start > 50) {
      sleep_us(sleep);
      sleep = sleep * 2 > 200 ? 200 : sleep * 2;
    }
  }
}

/* One call of coll on count floats per rank (all-gather: each rank's part). */
static void call(enum Coll coll, enum Wait wait, float* in, float* out, int count, int world) {
  MPI_Request request;
  switch (coll) {
    case kAllReduce:
      if (wait == kBlocking) {
        MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        return;
      }
      MPI_Iallreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &request);
      break;
    case kAllGather:
      if (wait == kBlocking) {
        MPI_Allgather(in, count / world, MPI_FLOAT, out, count / world, MPI_FLOAT, MPI_COMM_WORLD);
        return;
      }
      MPI_Iallgather(in, count / world, MPI_FLOAT, out, count / world, MPI_FLOAT, MPI_COMM_WORLD,
                     &request);
      break;
    default:
      if (wait == kBlocking) {
        MPI_Reduce_scatter_block(in, out, count / world, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        return;
      }
      MPI_Ireduce_scatter_block(in, out, count / world, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD,
                                &request);
  }
  drive(&request, wait);
}

static int by_value(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  int provided = 0, rank = 0, world = 1;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  prctl(PR_SET_TIMERSLACK, 1000UL);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const int sizes[] = {1024, 65536, 1048576}; /* floats: 4 KiB, 256 KiB, 4 MiB */
  float* in = calloc(sizes[2], sizeof(float));
  float* out = calloc((size_t)sizes[2] * world, sizeof(float));
  double times[kIters];
  if (rank == 0) {
    printf("%d ranks; median us per call over %d calls\n", world, kIters);
    printf("| collective | bytes | blocking | MPI_Wait | spin | yield | backoff |\n");
    printf("|---|---|---|---|---|---|---|\n");
  }
  for (int c = 0; c < kColls; ++c) {
    for (int s = 0; s < 3; ++s) {
      if (rank == 0) printf("| %s | %d |", kCollNames[c], sizes[s] * 4);
      for (int w = 0; w < kWaits; ++w) {
        for (int i = 0; i < kWarmup + kIters; ++i) {
          MPI_Barrier(MPI_COMM_WORLD);
          const double start = now_us();
          call((enum Coll)c, (enum Wait)w, in, out, sizes[s], world);
          if (i >= kWarmup) times[i - kWarmup] = now_us() - start;
        }
        qsort(times, kIters, sizeof(double), by_value);
        if (rank == 0) printf(" %.1f |", times[kIters / 2]);
      }
      if (rank == 0) printf("\n");
    }
  }
  free(in);
  free(out);
  MPI_Finalize();
  return 0;
}
