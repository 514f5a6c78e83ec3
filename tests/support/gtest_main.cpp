// main() of every test binary: GoogleTest's, except that a run in which some test was skipped
// and none failed exits 77, which ctest reports as Skipped (tests/cmake/discover_suites.cmake
// sets SKIP_RETURN_CODE 77): a suite is never counted as passed while part of it did not run
// (it needs a GPU, root or network namespaces the machine lacks). Its log names each skipped
// test with the reason.
#include <gtest/gtest.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int failed = RUN_ALL_TESTS();
  if (failed == 0 && ::testing::UnitTest::GetInstance()->skipped_test_count() > 0) return 77;
  return failed;
}
