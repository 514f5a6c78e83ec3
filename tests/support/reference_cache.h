// The Python references' results, cached: a rerun of an unchanged test does not start Python.
//
// A reference run (FSDP2, transformers, tokenizers, torch.amp) is a pure function of its
// script, its arguments, the bytes of its input files and the Python environment it runs in
// (the interpreter, the version of every installed package) on this kind of machine (the CPU
// model and its instruction set, the number of cores: both decide which kernels run, and with
// them the last bits of a float result). The cache keys a run by all of these, as an XXH3-128
// hash, and keeps its output files and its printed output in a directory named by the key.
// See [Note: what a reference-cache key holds] in reference_cache.cpp.
//
// Where: $FSDP_REFERENCE_CACHE if set ("off" turns the cache off), else the user's cache folder
// (fsdp/reference-cache under $XDG_CACHE_HOME or ~/.cache; [Note: one reference cache for every
// clone]), else, with no home, reference-cache/ in the build tree. The first run computes and
// stores; a changed script, input byte, argument or package version makes a new key.
//
// No LibTorch here: the data tests (which do not link it) use this too.
#pragma once

#include <string>
#include <vector>

namespace fsdp::test {

// One run of a Python reference script.
struct ReferenceRun {
  std::string script;  // absolute path of the .py file
  // The arguments after the script, as one shell string. Every file or directory in it must be
  // listed in `inputs` or `outputs`: the key replaces their paths by their roles, so a temporary
  // directory that differs per run does not change the key.
  std::string args;
  // Files and directories the script reads: their bytes (a directory's: every file under it,
  // with its relative name) are in the key. Python modules it imports from this tree too.
  std::vector<std::string> inputs;
  // Files and directories the script writes: restored from the cache, a directory whole.
  std::vector<std::string> outputs;
  // The script also reads files it finds itself (a glob over a system directory): it prints
  // them, one path a line, when run with --list-inputs before `args`, and they join the key.
  bool lists_inputs = false;
  int limit_s = 300;  // the run is killed after this many seconds
};

struct ReferenceResult {
  int exit_code = -1;
  std::string output;       // what the script printed (stdout and stderr)
  bool from_cache = false;  // true: restored, Python did not start
};

// Restores `run`'s outputs from the cache, or runs it with `python` and stores its outputs
// when it exits 0 with every output present. A failed run is never stored.
ReferenceResult run_reference(const std::string& python, const ReferenceRun& run);

// Several runs of one script that takes `--jobs FILE` (a JSON list, each element the argument
// list of one run; bench/reference/fsdp2_reference.py): the cached ones are restored, the others
// computed in one launch of the script, so Python and its imports start once. Each result says
// whether that run succeeded (exit_code 0) and carries the launch's output if it did not.
std::vector<ReferenceResult> run_references(const std::string& python,
                                            const std::vector<ReferenceRun>& runs, int limit_s);

// The version of an installed distribution of `python` ("2.11.0+cpu"), "" if it has none; from
// the package metadata the cache key lists, so no package is imported.
std::string installed_version(const std::string& python, const std::string& package);

// The cache key of `run` (hex), for messages and tests.
std::string reference_key(const std::string& python, const ReferenceRun& run);

}  // namespace fsdp::test
