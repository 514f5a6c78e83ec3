// The Python reference cache (support/reference_cache.h) against a stand-in reference,
// reference_cache_probe.py, which counts its launches: a hit starts no Python and restores the
// same files and output; the key follows input bytes and arguments but not temporary paths; a
// failed run is never stored; a batch computes its misses in one launch and reports each job.
#include "support/files.h"
#include "support/reference_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#ifndef FSDP_SOURCE_DIR
#error "tests/CMakeLists.txt defines FSDP_SOURCE_DIR"
#endif

namespace fsdp::test {
namespace {

const char kProbe[] = FSDP_SOURCE_DIR "/tests/support/reference_cache_probe.py";

std::string python() {
  const char* p = std::getenv("FSDP_PYTHON");
  return p != nullptr && *p != '\0' ? p : FSDP_PYTHON;
}

// A private cache and scratch directory per test, and the launch counter.
class ReferenceCache : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = temp_root() + "/fsdp_refcache_XXXXXX";
    root_ = ::mkdtemp(tmpl.data());
    ::setenv("FSDP_REFERENCE_CACHE", (root_ + "/cache").c_str(), 1);
    ::setenv("PROBE_LAUNCHES", (root_ + "/launches").c_str(), 1);
  }
  void TearDown() override {
    ::unsetenv("FSDP_REFERENCE_CACHE");
    ::unsetenv("PROBE_LAUNCHES");
    remove_all(root_);
  }
  int launches() const {
    const std::string log = read_bytes(root_ + "/launches");
    return static_cast<int>(std::count(log.begin(), log.end(), '\n'));
  }
  // A probe run reading `in` (written with `content`) in directory `dir` of the scratch space.
  ReferenceRun probe(const std::string& dir, const std::string& content,
                     const std::string& extra = "") {
    make_directories(root_ + "/" + dir);
    const std::string in = root_ + "/" + dir + "/in.txt", out = root_ + "/" + dir + "/out.txt";
    write_bytes(in, content);
    return {kProbe, in + " " + out + extra, {in}, {out}};
  }
  std::string root_;
};

TEST_F(ReferenceCache, ASecondRunIsRestoredWithoutStartingTheReference) {
  const ReferenceRun run = probe("a", "hello");
  const ReferenceResult first = run_reference(python(), run);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_FALSE(first.from_cache);
  const std::string computed = read_bytes(run.outputs[0]);
  remove_all(run.outputs[0]);
  const ReferenceResult second = run_reference(python(), run);
  EXPECT_EQ(second.exit_code, 0);
  EXPECT_TRUE(second.from_cache);
  EXPECT_EQ(second.output, first.output);
  EXPECT_EQ(read_bytes(run.outputs[0]), computed);
  EXPECT_EQ(launches(), 1);
}

TEST_F(ReferenceCache, TheKeyFollowsInputBytesAndArgumentsButNotPaths) {
  ASSERT_EQ(run_reference(python(), probe("a", "hello")).exit_code, 0);
  EXPECT_TRUE(run_reference(python(), probe("elsewhere", "hello")).from_cache);
  EXPECT_FALSE(run_reference(python(), probe("b", "hellO")).from_cache);
  EXPECT_FALSE(run_reference(python(), probe("c", "hello", " --extra")).from_cache);
  EXPECT_EQ(launches(), 3);
  EXPECT_NE(reference_key(python(), probe("d", "hello")),
            reference_key(python(), probe("d", "hello", " --extra")));
}

TEST_F(ReferenceCache, AFailedRunIsNeverStored) {
  const ReferenceRun failing = probe("a", "hello", " --fail");
  EXPECT_NE(run_reference(python(), failing).exit_code, 0);
  const ReferenceResult again = run_reference(python(), failing);
  EXPECT_NE(again.exit_code, 0);
  EXPECT_FALSE(again.from_cache);
  EXPECT_EQ(launches(), 2);
}

TEST_F(ReferenceCache, AnOutputDirectoryIsRestoredWhole) {
  ReferenceRun run = probe("a", "hello");
  const std::string dir = root_ + "/a/outdir";
  run.args += " --dir " + dir;
  run.outputs.push_back(dir);
  ASSERT_EQ(run_reference(python(), run).exit_code, 0);
  remove_all(dir);
  EXPECT_TRUE(run_reference(python(), run).from_cache);
  EXPECT_EQ(read_bytes(dir + "/a.txt"), "a");
  EXPECT_EQ(read_bytes(dir + "/sub/b.txt"), "b");
}

TEST_F(ReferenceCache, ABatchComputesItsMissesInOneLaunchAndReportsEachJob) {
  const ReferenceRun cached = probe("a", "one");
  ASSERT_EQ(run_reference(python(), cached).exit_code, 0);
  const std::vector<ReferenceRun> runs = {cached, probe("b", "two"), probe("c", "three", " --fail"),
                                          probe("d", "four")};
  const auto results = run_references(python(), runs, 60);
  ASSERT_EQ(results.size(), 4u);
  EXPECT_TRUE(results[0].from_cache);
  EXPECT_EQ(results[1].exit_code, 0) << results[1].output;
  EXPECT_NE(results[2].exit_code, 0);
  EXPECT_EQ(results[3].exit_code, 0) << results[3].output;
  EXPECT_EQ(launches(), 2);  // the single run above, then one for the three misses
  EXPECT_EQ(read_bytes(runs[3].outputs[0]), "probe:four" + runs[3].args);
  // The successes were stored, the failure was not.
  EXPECT_TRUE(run_reference(python(), runs[1]).from_cache);
  EXPECT_FALSE(run_reference(python(), runs[2]).from_cache);
}

TEST_F(ReferenceCache, InstalledVersionsComeFromThePackageMetadata) {
  EXPECT_NE(installed_version(python(), "pip"), "");
  EXPECT_EQ(installed_version(python(), "no-such-package-fsdp"), "");
}

}  // namespace
}  // namespace fsdp::test
