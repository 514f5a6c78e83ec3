// See step_dirs.h. The file-level steps (fsync, rename, exchange) are file_util's.
#include "checkpoint/step_dirs.h"

#include "checkpoint/file_util.h"

#include <c10/util/Exception.h>

#include <dirent.h>
#include <algorithm>
#include <cstdio>
#include <utility>

namespace fsdp::checkpoint::detail {

std::string step_dir_name(int64_t step) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "step_%08lld", static_cast<long long>(step));
  return buf;
}

std::optional<int64_t> parse_step_dir_name(const std::string& name) {
  if (name.size() <= 5 || name.size() > 5 + 18 || name.compare(0, 5, "step_") != 0)
    return std::nullopt;
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

std::vector<std::string> list_directory(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  TORCH_CHECK(d != nullptr, system_error("cannot list", dir));
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(d);
  return names;
}

void prepare_tmp_dir(const std::string& root, const std::string& tmp_dir) {
  make_directories(root);
  for (const auto& name : list_directory(root)) {
    if (name.rfind(".tmp-", 0) == 0) remove_all(root + "/" + name);  // crashed saves
  }
  make_directories(tmp_dir);
}

namespace {

void prune(const std::string& root, const std::string& kept, int keep_last) {
  if (keep_last <= 0) return;
  std::vector<std::pair<int64_t, std::string>> others;
  for (const auto& name : list_directory(root)) {
    if (name == kept) continue;
    if (auto step = parse_step_dir_name(name)) {
      if (is_directory(root + "/" + name)) others.emplace_back(*step, name);
    }
  }
  std::sort(others.rbegin(), others.rend());
  for (size_t i = static_cast<size_t>(keep_last - 1); i < others.size(); ++i) {
    remove_all(root + "/" + others[i].second);
  }
}

}  // namespace

void publish_step_dir(const std::string& root, const std::string& tmp_dir,
                      const std::string& dir_name, int keep_last, const PublishHooks& hooks) {
  fsync_directory(tmp_dir);
  publish_directory(tmp_dir, root + "/" + dir_name);
  if (hooks.after_rename) hooks.after_rename();
  write_file_atomically(root + "/" + kLatestName, dir_name + "\n", hooks.before_latest_rename);
  prune(root, dir_name, keep_last);
}

std::string resolve_step_dir(const std::string& path,
                             const std::function<bool(const std::string&)>& is_checkpoint,
                             const std::string& holds) {
  if (is_checkpoint(path)) return path;
  const std::string latest_path = path + "/" + kLatestName;
  TORCH_CHECK(path_exists(latest_path), "no checkpoint at '", path, "': it holds neither ", holds,
              " nor ", kLatestName);
  std::string name = read_file(latest_path, 256);
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  TORCH_CHECK(parse_step_dir_name(name).has_value(), "'", latest_path,
              "' must name a step_<n> directory, but holds '", name.substr(0, 60), "'");
  const std::string dir = path + "/" + name;
  TORCH_CHECK(is_checkpoint(dir), "'", latest_path, "' names '", name, "', which has no ", holds);
  return dir;
}

}  // namespace fsdp::checkpoint::detail
