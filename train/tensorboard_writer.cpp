// The file is opened exclusively ("wx"): a second run into the same DIR never truncates an
// earlier run's events, which TensorBoard shows side by side.
#include <train/tensorboard_writer.h>

#include <c10/util/Exception.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>

namespace fsdp::train {
namespace {

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char name[HOST_NAME_MAX + 1] = {0};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

// Opens DIR/<name> for writing only if it does not exist yet; null with errno set otherwise.
std::FILE* open_new(const std::string& path) { return std::fopen(path.c_str(), "wx"); }

}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::string& dir, const std::string& name)
    : name_(name) {
  TORCH_CHECK(::mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST, name_,
              ": cannot create directory '", dir, "': ", std::strerror(errno));
  const double now = unix_seconds();
  const std::string base =
      dir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(now)) + "." + host_name();
  path_ = base;
  file_.reset(open_new(path_));
  if (!file_ && errno == EEXIST) {
    path_ = base + "." + std::to_string(::getpid());
    file_.reset(open_new(path_));
  }
  TORCH_CHECK(file_ != nullptr, name_, ": cannot create event file '", path_,
              "': ", std::strerror(errno));
  write_record(file_version_event(now));
}

void TensorBoardWriter::write_scalars(int64_t step, const std::vector<TensorBoardScalar>& scalars) {
  write_record(scalars_event(unix_seconds(), step, scalars));
}

void TensorBoardWriter::write_record(const std::string& data) {
  const std::string record = tf_record(data);
  const bool written = std::fwrite(record.data(), 1, record.size(), file_.get()) == record.size();
  TORCH_CHECK(written && std::fflush(file_.get()) == 0, name_, ": cannot write '", path_,
              "': ", std::strerror(errno));
}

}  // namespace fsdp::train
