// jemalloc's settings for the programs that are linked with it (CMakeLists.txt, FSDP_JEMALLOC).
//
// [Note: the programs keep freed pages]
// A training step allocates the same large host tensors every step: GPT-2's logits and their
// gradient are 206 MB each at 8 x 128 tokens, the gathered parameters and the reduce-scatter
// inputs tens of MB. glibc's malloc maps every allocation over 32 MiB (its largest mmap
// threshold) and unmaps it when freed, so each step faults all of those pages in again and the
// kernel zeroes them: in fsdp-train's HSDP 2 x 2 GPT-2 step on a 2-core host, 17% of the cycles
// (perf: clear_page_erms, the page-fault path, the page-table lock), and 2.2-2.4 s from the
// forward's end to the backward's start (the loss and its gradient) that take 0.65 s when the
// pages are kept. jemalloc reuses freed extents; with its decay off (-1) it never gives
// their pages back, as a GPU's caching allocator keeps its blocks, so after the first step no
// page is faulted again. The resident peak does not rise: jemalloc's was 2.84 GB a rank against
// glibc's 3.18 GB in that run (bench/RESULTS.md, "Host memory through jemalloc"). MALLOC_CONF
// overrides these, as jemalloc reads it after this string.
extern "C" {
// NOLINTNEXTLINE(cppcoreguidelines-avoid-non-const-global-variables): jemalloc's interface
const char* malloc_conf = "dirty_decay_ms:-1,muzzy_decay_ms:-1";
}
