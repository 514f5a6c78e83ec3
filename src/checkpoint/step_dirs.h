// The directory tree that every sharded checkpoint format shares, and its crash safety:
//
//   root/step_00000100/...   one complete checkpoint per step (what is inside is the format's)
//   root/latest              "step_00000100": the newest complete one
//   root/.tmp-step_<n>/      a save in progress (or the leftover of a crashed one)
//
// A save writes everything under root/.tmp-step_<n>/, fsyncs it, renames the directory into
// place (atomically exchanging an existing one) and only then replaces `latest` by rename: a
// process killed at any point leaves the previous checkpoint and `latest` intact, and the next
// save removes the leftovers. Used by sharded.cpp (metadata.json) and dcp_hf.cpp (DCP's layout).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::checkpoint::detail {

inline constexpr char kLatestName[] = "latest";

// "step_00000100".
std::string step_dir_name(int64_t step);
// Parses "step_<digits>" (what `latest` may name and what pruning deletes); nullopt otherwise.
std::optional<int64_t> parse_step_dir_name(const std::string& name);
// The names in dir, without "." and "..". Throws naming dir when it cannot be listed.
std::vector<std::string> list_directory(const std::string& dir);

// Rank 0, before any rank writes: creates root and tmp_dir, removing the temporaries of crashed
// saves.
void prepare_tmp_dir(const std::string& root, const std::string& tmp_dir);

// Test hooks of publish_step_dir, each called (when set) at its point of the publication.
struct PublishHooks {
  std::function<void()> after_rename;          // the directory is in place, `latest` is not
  std::function<void()> before_latest_rename;  // the new `latest` is durable, not yet renamed
};

// Rank 0, once every file of tmp_dir is durable: fsyncs tmp_dir, renames it to root/dir_name,
// points `latest` at it, then deletes the checkpoints under root other than the newest
// keep_last (0 keeps all).
void publish_step_dir(const std::string& root, const std::string& tmp_dir,
                      const std::string& dir_name, int keep_last, const PublishHooks& hooks = {});

// The checkpoint directory that path names: path itself when is_checkpoint(path), else the
// step directory that path/latest names, which must satisfy it too. `holds` says in messages
// what a checkpoint directory holds ("metadata.json"). Throws when there is neither.
std::string resolve_step_dir(const std::string& path,
                             const std::function<bool(const std::string&)>& is_checkpoint,
                             const std::string& holds);

}  // namespace fsdp::checkpoint::detail
