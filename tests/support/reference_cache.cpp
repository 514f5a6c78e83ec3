// The reference cache (reference_cache.h): keys, storage and the one-launch batch of misses.
//
// [Note: what a reference-cache key holds]
// A cached result may stand in for a run only if the run could not have printed anything else.
// The key therefore holds, each part length-prefixed so that no two parts can run together:
// - a format version (bump it when what is stored changes);
// - the bytes of the script;
// - the arguments, with each input and output path replaced by its role (<in0>, <out1>);
// - the bytes of each input, in order (a directory's files by relative name, sorted), then of
//   each file the script lists with --list-inputs, in its order;
// - the Python environment: sys.version, the interpreter's real path, and the name and version
//   of every installed distribution (torch, transformers, tokenizers, numpy, ...);
// - the machine: the CPU's model name and instruction-set flags, the number of online CPUs, and
//   the thread variables OMP_NUM_THREADS and MKL_NUM_THREADS (these choose the kernels and the
//   reduction orders of a float result).
// Anything the key does not hold must not change the result; that is why every file a reference
// reads is an input, named by the test or listed by the script.
//
// [Note: one reference cache for every clone]
// A key names everything a result depends on, none of it a path of the clone, so results can
// be shared by every clone and build of one user, as the compiler cache is. The default place is
// therefore the user's cache folder ($XDG_CACHE_HOME or ~/.cache, under fsdp/reference-cache),
// the one CI uses: the references a developer's or a fresh clone's run computed are then ones
// CI's next run need not compute (a changed reference script otherwise starts every parity suite's
// Python again in CI, minutes on a 2-core machine).
#include "support/reference_cache.h"

#include "support/command.h"
#include "support/files.h"

#include <xxhash.h>
#include <nlohmann/json.hpp>

#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>

#ifndef FSDP_REFERENCE_CACHE_DIR
#error "tests/CMakeLists.txt defines FSDP_REFERENCE_CACHE_DIR"
#endif

namespace fsdp::test {
namespace {

constexpr char kFormat[] = "fsdp-reference-cache 2";

std::string read_file(const std::string& path) {
  if (!exists(path)) throw std::runtime_error("reference cache: cannot read " + path);
  return read_bytes(path);
}

std::string directory_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

class KeyHasher {
 public:
  KeyHasher() : state_(XXH3_createState(), &XXH3_freeState) {
    if (!state_ || XXH3_128bits_reset(state_.get()) != XXH_OK) {
      throw std::runtime_error("reference cache: XXH3 state");
    }
  }
  void add(const std::string& part) {
    const uint64_t size = part.size();
    XXH3_128bits_update(state_.get(), &size, sizeof(size));
    XXH3_128bits_update(state_.get(), part.data(), part.size());
  }
  std::string hex() const {
    const XXH128_hash_t h = XXH3_128bits_digest(state_.get());
    char text[33];
    std::snprintf(text, sizeof(text), "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                  static_cast<unsigned long long>(h.low64));
    return text;
  }

 private:
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> state_;
};

// The first "model name" and "flags" lines of /proc/cpuinfo.
std::string cpu_identity() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model, flags;
  while (std::getline(in, line) && (model.empty() || flags.empty())) {
    if (model.empty() && line.rfind("model name", 0) == 0) model = line;
    if (flags.empty() && line.rfind("flags", 0) == 0) flags = line;
  }
  return model + "\n" + flags;
}

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

// The Python environment and the machine, once per interpreter per process.
const std::string& environment_fingerprint(const std::string& python) {
  static std::mutex mutex;
  static std::map<std::string, std::string> by_python;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = by_python.find(python);
  if (it != by_python.end()) return it->second;
  const CommandResult r =
      run_command("'" + python +
                      "' -c 'import importlib.metadata as m, os, sys; print(sys.version); "
                      "print(os.path.realpath(sys.executable)); "
                      "print(sorted(set(d.metadata[\"Name\"].lower() + \"==\" + d.version "
                      "for d in m.distributions())))'",
                  60);
  if (r.exit_code != 0) {
    throw std::runtime_error("reference cache: cannot list " + python + "'s packages:\n" +
                             r.output);
  }
  const std::string machine =
      cpu_identity() + "\ncpus " + std::to_string(std::thread::hardware_concurrency()) + "\nomp " +
      env_or_empty("OMP_NUM_THREADS") + "\nmkl " + env_or_empty("MKL_NUM_THREADS");
  return by_python[python] = r.output + "\n" + machine;
}

// args with every input and output path replaced by its role, longest paths first so that a
// path that is a prefix of another (dir and dir/file) cannot take part of it.
std::string normalized_args(const ReferenceRun& run) {
  std::vector<std::pair<std::string, std::string>> roles;
  for (size_t i = 0; i < run.inputs.size(); ++i)
    roles.push_back({run.inputs[i], "<in" + std::to_string(i) + ">"});
  for (size_t i = 0; i < run.outputs.size(); ++i)
    roles.push_back({run.outputs[i], "<out" + std::to_string(i) + ">"});
  std::sort(roles.begin(), roles.end(),
            [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  std::string args = run.args;
  for (const auto& [path, role] : roles) {
    for (size_t at = args.find(path); at != std::string::npos;
         at = args.find(path, at + role.size())) {
      args.replace(at, path.size(), role);
    }
  }
  return args;
}

bool is_directory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The files under dir, as paths relative to it, sorted.
std::vector<std::string> files_under(const std::string& dir, const std::string& prefix = "") {
  std::vector<std::string> files;
  for (const auto& name : list_dir(dir + (prefix.empty() ? "" : "/" + prefix))) {
    const std::string relative = prefix.empty() ? name : prefix + "/" + name;
    if (is_directory(dir + "/" + relative)) {
      for (auto& f : files_under(dir, relative)) files.push_back(std::move(f));
    } else {
      files.push_back(relative);
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

// A file's bytes, or a directory's files (relative name, bytes).
void add_input(KeyHasher& key, const std::string& path) {
  if (!is_directory(path)) {
    key.add(read_file(path));
    return;
  }
  for (const auto& relative : files_under(path)) {
    key.add(relative);
    key.add(read_file(path + "/" + relative));
  }
}

// What the script says it reads besides its arguments (ReferenceRun::lists_inputs).
std::vector<std::string> listed_inputs(const std::string& python, const ReferenceRun& run) {
  const CommandResult r =
      run_command("'" + python + "' '" + run.script + "' --list-inputs " + run.args, 60);
  if (r.exit_code != 0) {
    throw std::runtime_error("reference cache: " + run.script + " --list-inputs failed:\n" +
                             r.output);
  }
  std::vector<std::string> paths;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty()) paths.push_back(line);
  }
  return paths;
}

// Copies a file, or a directory with everything under it, to `to`; returns whether all of it was.
bool copy_tree(const std::string& from, const std::string& to) {
  if (!is_directory(from)) {
    make_directories(directory_of(to));
    return write_bytes(to, read_bytes(from));
  }
  bool copied = make_directories(to);
  for (const auto& relative : files_under(from)) {
    const std::string target = to + "/" + relative;
    copied = copied && make_directories(directory_of(target)) &&
             write_bytes(target, read_bytes(from + "/" + relative));
  }
  return copied;
}

// "" when the cache is off. [Note: one reference cache for every clone]: without
// $FSDP_REFERENCE_CACHE, the user's cache folder (as CI's), so a developer's runs, a fresh clone's
// and CI's share results; the build tree only where the user has no home.
std::string cache_root() {
  const std::string from_env = env_or_empty("FSDP_REFERENCE_CACHE");
  if (from_env == "off") return "";
  if (!from_env.empty()) return from_env;
  const std::string xdg = env_or_empty("XDG_CACHE_HOME");
  if (!xdg.empty()) return xdg + "/fsdp/reference-cache";
  const std::string home = env_or_empty("HOME");
  if (!home.empty()) return home + "/.cache/fsdp/reference-cache";
  return FSDP_REFERENCE_CACHE_DIR;
}

std::string output_name(size_t i) { return "out" + std::to_string(i); }

bool restore(const std::string& dir, const ReferenceRun& run, ReferenceResult& result) {
  if (dir.empty() || !exists(dir + "/output.txt")) return false;
  for (size_t i = 0; i < run.outputs.size(); ++i) {
    if (!exists(dir + "/" + output_name(i))) return false;
  }
  for (size_t i = 0; i < run.outputs.size(); ++i) {
    remove_all(run.outputs[i]);
    if (!copy_tree(dir + "/" + output_name(i), run.outputs[i])) {
      throw std::runtime_error("reference cache: cannot write " + run.outputs[i]);
    }
  }
  result = {0, read_file(dir + "/output.txt"), true};
  return true;
}

// Stores a successful run: written to a private directory, then renamed into place, so a
// reader never sees half an entry and two writers of one key cannot mix their files.
void store(const std::string& dir, const ReferenceRun& run, const std::string& output) {
  if (dir.empty()) return;
  for (const auto& out : run.outputs) {
    if (!exists(out)) return;  // the caller's assertions report it; nothing to keep
  }
  static std::atomic<int> counter{0};
  const std::string tmp =
      dir + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  bool written = make_directories(tmp);
  for (size_t i = 0; i < run.outputs.size(); ++i) {
    written = written && copy_tree(run.outputs[i], tmp + "/" + output_name(i));
  }
  written = written && write_bytes(tmp + "/output.txt", output);
  // rename(2) fails when another writer stored the same key first: theirs stays.
  if (!written || ::rename(tmp.c_str(), dir.c_str()) != 0) remove_all(tmp);
}

std::string entry_dir(const std::string& python, const ReferenceRun& run) {
  const std::string root = cache_root();
  if (root.empty()) return "";
  make_directories(root);
  return root + "/" + reference_key(python, run);
}

std::string quoted(const std::string& s) { return "'" + s + "'"; }

}  // namespace

std::string reference_key(const std::string& python, const ReferenceRun& run) {
  KeyHasher key;
  key.add(kFormat);
  key.add(read_file(run.script));
  key.add(normalized_args(run));
  for (const auto& in : run.inputs) add_input(key, in);
  if (run.lists_inputs) {
    // By content, in the order listed (the order the script reads them): a path names a
    // place that differs between clones, not what the script sees.
    for (const auto& in : listed_inputs(python, run)) add_input(key, in);
  }
  key.add(environment_fingerprint(python));
  return key.hex();
}

std::string installed_version(const std::string& python, const std::string& package) {
  const std::string& listing = environment_fingerprint(python);
  const std::string tag = "'" + package + "==";
  const size_t at = listing.find(tag);
  if (at == std::string::npos) return "";
  const size_t from = at + tag.size();
  return listing.substr(from, listing.find('\'', from) - from);
}

ReferenceResult run_reference(const std::string& python, const ReferenceRun& run) {
  const std::string dir = entry_dir(python, run);
  ReferenceResult result;
  if (restore(dir, run, result)) return result;
  const CommandResult r =
      run_command(quoted(python) + " " + quoted(run.script) + " " + run.args, run.limit_s);
  result = {r.exit_code, r.output, false};
  if (r.exit_code == 0) store(dir, run, r.output);
  return result;
}

std::vector<ReferenceResult> run_references(const std::string& python,
                                            const std::vector<ReferenceRun>& runs, int limit_s) {
  std::vector<ReferenceResult> results(runs.size());
  std::vector<std::string> dirs(runs.size());
  nlohmann::json jobs = nlohmann::json::array();
  std::vector<size_t> missed;
  for (size_t i = 0; i < runs.size(); ++i) {
    dirs[i] = entry_dir(python, runs[i]);
    if (restore(dirs[i], runs[i], results[i])) continue;
    jobs.push_back(runs[i].args);
    missed.push_back(i);
  }
  if (missed.empty()) return results;
  static std::atomic<int> launches{0};
  const std::string jobs_file = temp_root() + "/fsdp_reference_jobs_" + std::to_string(::getpid()) +
                                "_" + std::to_string(launches++) + ".json";
  write_bytes(jobs_file, jobs.dump());
  const CommandResult r = run_command(
      quoted(python) + " " + quoted(runs[missed[0]].script) + " --jobs " + quoted(jobs_file),
      limit_s);
  // The script writes, per job, whether it succeeded and its error (FILE.status).
  nlohmann::json status;
  try {
    status = nlohmann::json::parse(read_file(jobs_file + ".status"));
  } catch (const std::exception&) {
    status = nlohmann::json::array();
  }
  for (size_t j = 0; j < missed.size(); ++j) {
    const size_t i = missed[j];
    const bool ok = j < status.size() && status[j].value("ok", false);
    const std::string own = j < status.size() ? status[j].value("output", std::string()) : "";
    results[i] = {ok ? 0 : (r.exit_code != 0 ? r.exit_code : 1),
                  ok ? own : own + "\n--- the launch printed:\n" + r.output, false};
    if (ok) store(dirs[i], runs[i], own);
  }
  ::unlink(jobs_file.c_str());
  ::unlink((jobs_file + ".status").c_str());
  return results;
}

}  // namespace fsdp::test
